package grpcx

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemguard/idemguard/guard"
)

// Defaults for Options.
const (
	DefaultMaxStoredResponse     = 1 << 20 // bytes of response message kept for replays
	DefaultUnavailableRetryDelay = time.Second
)

// ReplayedMetadata is set to "true" in the header metadata of every
// replayed call (the gRPC spelling of Stripe's Idempotent-Replayed).
const ReplayedMetadata = "idempotent-replayed"

// Options configure UnaryServerInterceptor. Every field's zero value is
// its default, except Methods, which must list the methods to guard, and
// Caller and SingleCaller, of which exactly one must be chosen: an
// interceptor that would let one caller's key replay another caller's
// response is built only on purpose.
type Options struct {
	// Methods are the full method names guarded ("/pkg.Service/Method",
	// as info.FullMethod and the generated *_FullMethodName constants spell
	// them). Calls to other methods pass through untouched and never reach
	// the store. Required: a method that only reads needs no key, and a
	// guard cannot tell which methods do.
	Methods []string

	// Caller names the caller a call comes from: the account, user or
	// client an authentication interceptor in front of this one
	// established. Its value, quoted, prefixes every key's scope, so one
	// caller's key never meets another's.
	//
	// Name the caller, never its credential: a client that refreshes its
	// token between two retries is still the same caller, and its retry
	// must be replayed, not run again. CallerFromContext reads what the
	// authentication interceptor stored in the context. A call for which
	// Caller returns "" is answered Unauthenticated
	// (ReasonCallerUnknown), and nothing is stored.
	Caller func(ctx context.Context) string
	// SingleCaller declares that one caller owns every key this
	// interceptor sees: an internal service with a single client, or one
	// behind a gateway that already gives each caller keys of its own.
	// Keys are then not scoped by caller. Set it instead of Caller, never
	// with it.
	SingleCaller bool

	// Metadata is the request metadata that carries the key. Default
	// DefaultMetadata ("idempotency-key").
	Metadata string
	// Key, if set, finds the key in the request instead of the metadata:
	// KeyFromField("request_id") reads a field of the request message
	// (AIP-155's request_id), or write a KeyFunc that type-asserts your
	// request. Use one interceptor per policy and chain them
	// (grpc.ChainUnaryInterceptor) when methods take their keys from
	// different places.
	Key KeyFunc
	// Optional lets a call without a key through, unguarded. By default a
	// guarded method called without a key gets InvalidArgument
	// (ReasonKeyMissing).
	Optional bool
	// Fingerprint digests the request; the same key with another
	// fingerprint gets FailedPrecondition (ReasonKeyReused). Default
	// DefaultFingerprint: SHA-256 over the request message's full name and
	// its deterministic protobuf encoding.
	Fingerprint func(fullMethod string, req any) (string, error)
	// MaxStoredResponse is the largest response message kept for replay,
	// in bytes of its encoding. A larger one still reaches the client; the
	// key is completed with a marker, and a replay answers AlreadyExists
	// (ReasonResponseNotKept): the call ran and succeeded (the handler does
	// not run again). Default DefaultMaxStoredResponse (1 MiB).
	MaxStoredResponse int
	// ReplayMetadata reports whether a header or trailer metadata name
	// (lower case) that the handler set is stored and replayed. Default
	// DefaultReplayMetadata. Names starting with "grpc-" (the protocol's),
	// and ReplayedMetadata, are never stored.
	ReplayMetadata func(name string) bool
	// Release reports whether a call that ended with the status code c
	// releases its key, so that a retry runs the handler again, instead of
	// storing the status for replays. Default DefaultRelease: the codes
	// that mean "not done, try again" (see it). A handler that panics
	// always releases the key.
	Release func(c codes.Code) bool
	// Wait lets a call whose key's first call is still running wait for
	// that call's response, on this instance or another, for up to Wait,
	// and then answer with its replay (or with Aborted when Wait passes
	// first). While it waits it reads the key's record after 10 ms, then
	// twice as late each time, at most 100 ms apart, and claims once the
	// record is no longer pending, as httpx's Options.Wait does. A waiting
	// call holds a goroutine. Default 0: answer Aborted with RetryInfo at
	// once; the client interceptor asks again after the delay given.
	Wait time.Duration
	// UnavailableRetryDelay is the RetryInfo delay sent with Unavailable
	// when the store cannot be reached. Default
	// DefaultUnavailableRetryDelay (1 s).
	UnavailableRetryDelay time.Duration
	// Logger hears about handler panics and results that could not be
	// stored. Default slog.Default().
	Logger *slog.Logger
	// LogKeys writes idempotency keys to the log in full ("scope" and "id"
	// attributes). By default a record names a key only by a short digest
	// ("key": 12 hex digits of SHA-256 over scope and id, the same as
	// metrics.KeyDigest): a key and its method are what fetch a stored
	// response.
	LogKeys bool
}

// DefaultRelease is the default Options.Release. It releases the key for
// the codes that, by the gRPC status code guide and its HTTP mapping, say
// the call did not complete and may be tried again: the ones mapped to
// 5xx (Unknown, DeadlineExceeded, Unimplemented, Internal, Unavailable,
// DataLoss), as httpx releases 5xx, and also Canceled (499: the call was
// given up), ResourceExhausted (429: shed, or out of quota) and Aborted
// (409: a concurrency conflict, retry the sequence). Storing one of those
// would answer every retry of the key with it for the whole TTL.
//
// Every other code is stored and replayed, as Stripe keeps a request's
// result once it began to execute: InvalidArgument, NotFound,
// AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange and
// Unauthenticated (the 4xx answers), and OK.
func DefaultRelease(c codes.Code) bool {
	switch c {
	case codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// private are the metadata names DefaultReplayMetadata leaves out: they
// belong to one client at one moment (a cookie may carry a session;
// authentication-info the next nonce or proof of a login), as httpx's
// DefaultReplayHeader leaves out their HTTP fields.
var private = map[string]bool{
	"set-cookie": true, "authentication-info": true, "proxy-authentication-info": true,
}

// DefaultReplayMetadata is the default Options.ReplayMetadata. It keeps
// every header and trailer the handler set except set-cookie,
// authentication-info and proxy-authentication-info. Whatever
// ReplayMetadata says, names starting with "grpc-" or ":" and
// ReplayedMetadata are never stored, and neither is metadata an
// interceptor outside this one set.
func DefaultReplayMetadata(name string) bool { return !private[name] }

// DefaultFingerprint is a SHA-256, in hex, over the request message's full
// name and its deterministic protobuf encoding (proto.MarshalOptions
// Deterministic: map entries sorted), so a retry of the same request, in
// any field order the client encoded it, fingerprints the same. Unknown
// fields count. The method is not part of it: it is in the key's scope.
// A request that is not a proto.Message gets an error: set
// Options.Fingerprint for other codecs.
func DefaultFingerprint(fullMethod string, req any) (string, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", fmt.Errorf("grpcx: request of %s is %T, not a proto.Message; set Options.Fingerprint", fullMethod, req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("grpcx: fingerprint of %s: %w", fullMethod, err)
	}
	h := sha256.New()
	name := m.ProtoReflect().Descriptor().FullName()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	h.Write(n[:])
	h.Write([]byte(name))
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])), nil
}

// UnaryServerInterceptor returns an interceptor that runs each keyed call
// of the Options.Methods once per key within g's retention, and replays
// its response to repeats. It is the gRPC form of httpx.Guard:
//
//   - the handler runs at most once per (caller, method, key) while the
//     key is remembered, however many calls carry it, concurrently or not,
//     on however many servers share g's store;
//   - a repeat with the same request gets the stored response message,
//     the header and trailer metadata the handler set, and
//     "idempotent-replayed: true" in its header; a handler's error status
//     that is stored (not Options.Release) replays the same way;
//   - a repeat while the first call runs gets Aborted with RetryInfo
//     (ReasonKeyInUse; see inFlightRetryDelay for the delay), or waits
//     with Options.Wait; one with another request under the key gets
//     FailedPrecondition (ReasonKeyReused); a store that cannot be reached
//     gives Unavailable with RetryInfo (ReasonStoreUnavailable); a missing
//     or malformed key gives InvalidArgument;
//   - a call rejected before the handler stores nothing; a handler that
//     panics releases the key (the panic goes on); a released code
//     (DefaultRelease) releases it too;
//   - the response leaves only after it was stored (header metadata the
//     handler sent with grpc.SendHeader left before); if it cannot be
//     stored the client still gets it, and the key is released if it can
//     be.
//
// The scope of a key is the quoted caller (Options.Caller) and the full
// method name; the fingerprint is DefaultFingerprint's. Put the
// interceptor after the authentication interceptor that Caller reads, and
// after any that validates requests: a call rejected before the guard
// claims nothing.
//
// UnaryServerInterceptor panics, as grpc.NewServer's callers expect of a
// programmer's error, when g is nil, Methods is empty, or Options choose
// neither or both of Caller and SingleCaller.
func UnaryServerInterceptor(g *guard.Guard, opts Options) grpc.UnaryServerInterceptor {
	s := newServer(g, opts)
	return s.intercept
}

type server struct {
	g       *guard.Guard
	opts    Options
	methods map[string]bool
	runs    runTimes
}

func newServer(g *guard.Guard, opts Options) *server {
	if g == nil {
		panic("grpcx: nil *guard.Guard")
	}
	switch {
	case opts.Caller == nil && !opts.SingleCaller:
		panic("grpcx: Options must name the caller (Caller) or declare a single caller (SingleCaller); " +
			"without one, one caller's key would replay another caller's response")
	case opts.Caller != nil && opts.SingleCaller:
		panic("grpcx: Options.Caller and Options.SingleCaller exclude each other")
	}
	if len(opts.Methods) == 0 {
		panic("grpcx: Options.Methods is empty: list the full method names to guard")
	}
	methods := make(map[string]bool, len(opts.Methods))
	for _, m := range opts.Methods {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 {
			panic(fmt.Sprintf("grpcx: Options.Methods: %q is not a full method name (/package.Service/Method)", m))
		}
		methods[m] = true
	}
	if opts.Metadata == "" {
		opts.Metadata = DefaultMetadata
	}
	opts.Metadata = strings.ToLower(opts.Metadata)
	if opts.Fingerprint == nil {
		opts.Fingerprint = DefaultFingerprint
	}
	if opts.MaxStoredResponse <= 0 {
		opts.MaxStoredResponse = DefaultMaxStoredResponse
	}
	if opts.ReplayMetadata == nil {
		opts.ReplayMetadata = DefaultReplayMetadata
	}
	if opts.Release == nil {
		opts.Release = DefaultRelease
	}
	if opts.UnavailableRetryDelay <= 0 {
		opts.UnavailableRetryDelay = DefaultUnavailableRetryDelay
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &server{g: g, opts: opts, methods: methods}
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	id, err := s.requestKey(ctx, req)
	if err != nil {
		return nil, err
	}
	if id == "" {
		return handler(ctx, req) // Optional, and the call has no key
	}
	scope, ok := s.scope(ctx, info.FullMethod)
	if !ok {
		return nil, newStatus(codes.Unauthenticated, ReasonCallerUnknown,
			"idempotency keys are kept per caller, and this call names none; authenticate and retry", 0).Err()
	}
	fingerprint, err := s.opts.Fingerprint(info.FullMethod, req)
	if err != nil {
		s.opts.Logger.Error("grpcx: request not fingerprinted; the call was refused", "method", info.FullMethod, "err", err)
		return nil, newStatus(codes.Internal, ReasonFingerprint, "the request could not be fingerprinted; it was not run", 0).Err()
	}
	key := guard.Key{Scope: scope, ID: id}

	// Claim even if the client hangs up meanwhile: a claim cut off after
	// the store took it would lock the key for a whole lease. Guard.Claim
	// bounds the call itself.
	out, err := s.g.Claim(context.WithoutCancel(ctx), key, fingerprint)
	if _, busy := errors.AsType[*guard.InProgressError](err); busy && s.opts.Wait > 0 {
		out, err, ok = s.wait(ctx, key, fingerprint, err)
		if !ok {
			return nil, status.FromContextError(ctx.Err()).Err() // nothing was claimed
		}
	}
	if err != nil {
		return nil, s.rejectClaim(key, info.FullMethod, err)
	}
	if out.Status == guard.Replay {
		return s.replay(ctx, key, info.FullMethod, out.Result)
	}
	if ctx.Err() != nil {
		// The client left before the handler ran: nothing happened yet.
		s.release(ctx, out.Lease)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return s.run(ctx, req, info, handler, out.Lease, fingerprint)
}

// requestKey finds the call's key where Options say. It returns "" and no
// error for a call without a key that Optional lets through.
func (s *server) requestKey(ctx context.Context, req any) (string, error) {
	var id string
	if s.opts.Key != nil {
		k, err := s.opts.Key(ctx, req)
		if err != nil {
			return "", newStatus(codes.InvalidArgument, ReasonKeyMalformed, err.Error(), 0).Err()
		}
		id = k
	} else {
		md, _ := metadata.FromIncomingContext(ctx)
		values := md.Get(s.opts.Metadata)
		switch len(values) {
		case 0:
		case 1:
			id = values[0]
			if id == "" {
				return "", newStatus(codes.InvalidArgument, ReasonKeyMalformed,
					fmt.Sprintf("%s is empty", s.opts.Metadata), 0).Err()
			}
		default:
			return "", newStatus(codes.InvalidArgument, ReasonKeyMalformed,
				fmt.Sprintf("%d %s values; send exactly one", len(values), s.opts.Metadata), 0).Err()
		}
	}
	if id == "" {
		if s.opts.Optional {
			return "", nil
		}
		where := s.opts.Metadata + " metadata"
		if s.opts.Key != nil {
			where = "an idempotency key in the request"
		}
		return "", newStatus(codes.InvalidArgument, ReasonKeyMissing, "this method requires "+where, 0).Err()
	}
	if err := CheckKey(id); err != nil {
		return "", newStatus(codes.InvalidArgument, ReasonKeyMalformed, err.Error(), 0).Err()
	}
	return id, nil
}

// scope is the key's scope: the full method, prefixed by the quoted caller
// (Options.Caller). ok is false when Caller names no caller. A scope the
// store would refuse (too long, control bytes) is replaced by its digest.
func (s *server) scope(ctx context.Context, method string) (string, bool) {
	sc := method
	if s.opts.Caller != nil {
		caller := s.opts.Caller(ctx)
		if caller == "" {
			return "", false
		}
		sc = strconv.Quote(caller) + " " + sc
	}
	if (guard.Key{Scope: sc, ID: "-"}).Validate() != nil {
		sum := sha256.Sum256([]byte(sc))
		sc = "sha256:" + hex.EncodeToString(sum[:])
	}
	return sc, true
}

// rejectClaim is the status for a claim that did not give the key to this
// call.
func (s *server) rejectClaim(key guard.Key, method string, err error) error {
	if inProgress, ok := errors.AsType[*guard.InProgressError](err); ok {
		return newStatus(codes.Aborted, ReasonKeyInUse,
			"a call with this idempotency key has not finished; retry after the delay given",
			s.inFlightRetryDelay(method, inProgress.RetryAfter)).Err()
	}
	switch {
	case errors.Is(err, guard.ErrMismatch):
		return newStatus(codes.FailedPrecondition, ReasonKeyReused,
			"this idempotency key was used with a different request; use a new key for a new request", 0).Err()
	case errors.Is(err, guard.ErrExhausted):
		return newStatus(codes.Internal, ReasonKeyExhausted,
			"the call with this idempotency key was abandoned too often and will not run again", 0).Err()
	case errors.Is(err, guard.ErrInvalidKey):
		return newStatus(codes.InvalidArgument, ReasonKeyMalformed, s.logErr(key, err), 0).Err()
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return s.unavailable("the call was not run; retry later with the same key")
	default:
		s.opts.Logger.Error("grpcx: idempotency claim failed", append(s.logKey(key), "err", s.logErr(key, err))...)
		return newStatus(codes.Internal, ReasonStoreError, "idempotency store error; the call was not run", 0).Err()
	}
}

func (s *server) unavailable(msg string) error {
	return newStatus(codes.Unavailable, ReasonStoreUnavailable, "idempotency store unavailable: "+msg,
		s.opts.UnavailableRetryDelay).Err()
}

// replay answers a call with a stored one.
func (s *server) replay(ctx context.Context, key guard.Key, method string, result []byte) (any, error) {
	c, err := decodeRecord(result)
	header := metadata.Pairs(ReplayedMetadata, "true")
	if err != nil {
		_ = grpc.SetHeader(ctx, header)
		s.opts.Logger.Error("grpcx: stored response unreadable",
			append(s.logKey(key), "method", method, "err", s.logErr(key, err))...)
		return nil, newStatus(codes.Internal, ReasonResponseCorrupt,
			"the call with this idempotency key ran, but its stored response cannot be read", 0).Err()
	}
	_ = grpc.SetHeader(ctx, metadata.Join(c.header, header))
	if len(c.trailer) > 0 {
		_ = grpc.SetTrailer(ctx, c.trailer)
	}
	switch {
	case c.notKept != 0:
		why := "it was larger than the server keeps"
		if c.notKept == notKeptNotProto {
			why = "it was not a protobuf message"
		}
		return nil, newStatus(codes.AlreadyExists, ReasonResponseNotKept,
			"the call with this idempotency key ran and succeeded, but its response was not stored: "+why, 0).Err()
	case c.status != nil:
		st := &spb.Status{}
		if err := proto.Unmarshal(c.status, st); err != nil {
			return nil, newStatus(codes.Internal, ReasonResponseCorrupt,
				"the call with this idempotency key ran, but its stored status cannot be read", 0).Err()
		}
		return nil, status.ErrorProto(st)
	}
	msg := newMessage(c.typeName, c.message)
	if msg == nil {
		return nil, newStatus(codes.Internal, ReasonResponseCorrupt,
			"the call with this idempotency key ran, but its stored response cannot be read", 0).Err()
	}
	return msg, nil
}

// newMessage makes the stored response: a message of its own type when the
// type is linked into the program (protoregistry.GlobalTypes), so
// interceptors outside this one see what the handler returned; else an
// Empty whose unknown fields are the stored bytes, which encodes to
// exactly those bytes. nil when the bytes do not decode as the type.
func newMessage(typeName string, b []byte) proto.Message {
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typeName)); err == nil {
		m := mt.New().Interface()
		if err := proto.Unmarshal(b, m); err != nil {
			return nil
		}
		return m
	}
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(protoreflect.RawFields(b))
	return m
}

// run calls the handler under lease and stores or releases the outcome.
func (s *server) run(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler,
	lease guard.Lease, fingerprint string) (resp any, err error) {
	hctx, stop := s.g.KeepAlive(ctx, lease)
	c := &capture{inner: grpc.ServerTransportStreamFromContext(ctx), method: info.FullMethod}
	hctx = grpc.NewContextWithServerTransportStream(hctx, c)
	hctx = context.WithValue(hctx, claimKey{}, claimInfo{lease: lease, fingerprint: fingerprint})
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (the panic goes on, with its own stack) or
		// called runtime.Goexit: no response exists, so free the key.
		stop()
		s.release(ctx, lease)
		s.opts.Logger.Error("grpcx: handler did not return (panic); idempotency key released",
			append(s.logKey(lease.Key), "method", info.FullMethod)...)
	}()
	start := time.Now()
	resp, err = handler(hctx, req)
	returned = true
	s.runs.observe(info.FullMethod, time.Since(start))
	stop()
	s.finish(ctx, c, lease, info.FullMethod, resp, err)
	return resp, err
}

// finish stores the handler's outcome, or releases the key for a code
// Options.Release names.
func (s *server) finish(ctx context.Context, c *capture, lease guard.Lease, method string, resp any, err error) {
	header, trailer := c.stored(s.opts.ReplayMetadata)
	rec := storedCall{header: header, trailer: trailer}
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err) // as grpc.Server turns it into a status
		}
		if s.opts.Release(st.Code()) {
			s.release(ctx, lease)
			return
		}
		b, merr := proto.Marshal(st.Proto())
		if merr != nil { // a detail that does not encode: the client gets none either
			b, _ = proto.Marshal(status.New(st.Code(), st.Message()).Proto())
		}
		rec.status = b
	} else if m, ok := resp.(proto.Message); !ok || resp == nil {
		rec.notKept = notKeptNotProto
	} else {
		rec.typeName = string(m.ProtoReflect().Descriptor().FullName())
		if proto.Size(m) > s.opts.MaxStoredResponse {
			rec.notKept = notKeptTooLarge
		} else if b, merr := (proto.MarshalOptions{Deterministic: true}).Marshal(m); merr != nil {
			rec.notKept = notKeptNotProto // the server's codec will fail to send it too
		} else {
			rec.message = b
		}
	}
	s.complete(ctx, lease, method, encodeRecord(rec))
}

// complete stores result for lease, retrying while the store cannot be
// reached (settle). If it still cannot, it releases the key if it can, so
// the next call with it is not told Aborted until the lease ends.
func (s *server) complete(ctx context.Context, lease guard.Lease, method string, result []byte) {
	ctx = context.WithoutCancel(ctx)
	err := settle(ctx, settleBudget, func(ctx context.Context) error { return s.g.Complete(ctx, lease, result) })
	if err == nil {
		return
	}
	if errors.Is(err, guard.ErrUnavailable) && s.lastRelease(ctx, lease) == nil {
		s.opts.Logger.Warn("grpcx: response not stored (store unreachable); idempotency key released",
			append(s.logKey(lease.Key), "method", method, "err", s.logErr(lease.Key, err))...)
		return
	}
	// The handler ran; the client gets its real response anyway.
	s.opts.Logger.Error("grpcx: response not stored; a retry with this key may run the handler again",
		append(s.logKey(lease.Key), "method", method, "err", s.logErr(lease.Key, err))...)
}

func (s *server) lastRelease(ctx context.Context, lease guard.Lease) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return s.g.Release(ctx, lease)
}

// release undoes the claim, even if the client is gone, retrying while the
// store cannot be reached (settle).
func (s *server) release(ctx context.Context, lease guard.Lease) {
	ctx = context.WithoutCancel(ctx)
	if err := settle(ctx, settleBudget, func(ctx context.Context) error { return s.g.Release(ctx, lease) }); err != nil {
		s.opts.Logger.Warn("grpcx: idempotency key not released; it frees when its lease ends",
			append(s.logKey(lease.Key), "err", s.logErr(lease.Key, err))...)
	}
}

// capture is the ServerTransportStream the handler sees: it keeps a copy
// of every header and trailer, which is what a replay sends, and passes
// them on to the call's own stream. A copy is kept even when the stream
// refuses them (the client left, or headers were sent already): the
// replay carries what the handler meant to send.
type capture struct {
	inner  grpc.ServerTransportStream // nil when the interceptor runs outside a server
	method string

	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

func (c *capture) Method() string { return c.method }

func (c *capture) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SetHeader(md)
}

func (c *capture) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SendHeader(md)
}

func (c *capture) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	c.trailer = metadata.Join(c.trailer, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.inner.SetTrailer(md)
}

// stored returns the header and trailer metadata to store: the names keep
// allows, never the protocol's own.
func (c *capture) stored(keep func(string) bool) (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return filterMD(c.header, keep), filterMD(c.trailer, keep)
}

func filterMD(md metadata.MD, keep func(string) bool) metadata.MD {
	var out metadata.MD
	for k, vs := range md {
		k = strings.ToLower(k)
		if len(vs) == 0 || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, ":") || k == ReplayedMetadata || !keep(k) {
			continue
		}
		if out == nil {
			out = metadata.MD{}
		}
		out[k] = append(out[k], vs...)
	}
	return out
}

type claimKey struct{}

type claimInfo struct {
	lease       guard.Lease
	fingerprint string
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint: what a handler passes to downstream writes
// (lease.Fence, lease.KeyFor). ok is false outside a guarded call (a
// method not guarded, an optional key not sent).
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(claimInfo)
	return c.lease, c.fingerprint, ok
}
