package grpcx

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx/internal/core"
	"github.com/idemguard/idemguard/guard"
)

// Defaults for Options.
const (
	DefaultMaxStoredResponse     = core.DefaultMaxStoredResponse // bytes of response message kept for replays
	DefaultUnavailableRetryDelay = core.DefaultUnavailableRetryDelay
)

// ReplayedMetadata is set to "true" in the header metadata of every
// replayed call (the gRPC spelling of Stripe's Idempotent-Replayed).
const ReplayedMetadata = core.ReplayedMetadata

// The in-flight answer's retry delay (google.rpc.RetryInfo): the method's
// typical run time on this instance (a moving average), at least
// MinInFlightRetryDelay, DefaultInFlightRetryDelay before the method ran
// here, and at most what is left of the holder's lease (by then the key is
// answered or free). Unlike HTTP's Retry-After, RetryInfo is not in whole
// seconds, so a 50 ms method is asked about again after about 50 ms, not
// a second.
const (
	DefaultInFlightRetryDelay = core.DefaultInFlightRetryDelay
	MinInFlightRetryDelay     = core.MinInFlightRetryDelay
)

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
	// guard cannot tell which methods do. Unary methods only: gRPC calls
	// no unary interceptor for a streaming method, so one listed here is
	// not guarded (its calls run however often they are sent). CheckMethods
	// finds those, and misspelled names, at start-up.
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
	// its deterministic protobuf encoding. DefaultFingerprint named here is
	// the default, with its comparison with the previous release's.
	Fingerprint func(fullMethod string, req any) (string, error)
	// MaxStoredResponse is the largest response message kept for replay,
	// in bytes of its encoding. A larger one still reaches the client; the
	// key is completed with a marker, and a replay answers AlreadyExists
	// (ReasonResponseNotKept): the call ran and succeeded (the handler does
	// not run again). Default DefaultMaxStoredResponse (1 MiB).
	MaxStoredResponse int
	// ReplayMetadata reports whether a header or trailer metadata name
	// (lower case) that the handler set is stored and replayed. Default
	// DefaultReplayMetadata. Names starting with "grpc-" or ":" (the
	// protocol's), the fields gRPC sets itself (content-type, user-agent,
	// te), those HTTP/2 forbids (connection, keep-alive, proxy-connection,
	// transfer-encoding, upgrade) and ReplayedMetadata are never stored.
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
	// DefaultUnavailableRetryDelay (1 s). While the circuit breaker of a
	// fallback.Store under the guard is open, the delay is the time until
	// it lets its first probe through, if that is longer.
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
//
// The key follows the status the handler returns, not whether its effect
// ran (httpx's follows the status written): a handler that returns a
// released code after its effect took place has a retry run the effect
// again. Its context is a child of the call's, cancelled when the client
// goes away; a handler that then returns the error of a call it made with
// that context, after its effect, returns Canceled and releases the key.
// Once the effect has happened, return its outcome, whatever the context
// says.
func DefaultRelease(c codes.Code) bool { return core.DefaultRelease(uint32(c)) }

// DefaultReplayMetadata is the default Options.ReplayMetadata. It keeps
// every header and trailer the handler set except set-cookie,
// authentication-info and proxy-authentication-info. Whatever
// ReplayMetadata says, names starting with "grpc-" or ":", the fields
// gRPC sets itself or HTTP/2 forbids (see Options.ReplayMetadata) and
// ReplayedMetadata are never stored, and neither is metadata an
// interceptor outside this one set.
func DefaultReplayMetadata(name string) bool { return core.DefaultReplayMetadata(name) }

// DefaultFingerprint is a SHA-256, in hex, over the request message's full
// name and its deterministic protobuf encoding (proto.MarshalOptions
// Deterministic: map entries sorted), so a retry of the same request, in
// any field order the client encoded it, fingerprints the same. The
// message packed in a google.protobuf.Any (at any depth, extensions
// included) is taken in its deterministic encoding too, when its type is
// linked into the server: Go's protobuf packs a map in a random order.
// Anys packed in 8 others are taken as they came (each level re-encoded
// costs a copy of what it packs: Anys packed thousands deep in one request
// would cost the square of its size). In every message the server's schema knows, the fields, known or not,
// are taken in field-number order, so the same bytes fingerprint the same
// on a server that knows a field and on one that does not (a rolling
// deploy of a newer .proto); the bytes of a field the server does not know
// are taken as they came. Unknown fields and extensions count. The method
// is not part of it: it is in the key's scope. A key whose record holds
// the fingerprint of releases before this order (which differs only for
// requests not encoded in field order: unknown fields, extensions, oneofs)
// is compared with that one too, so records stored before an upgrade
// replay; see docs/design.md, section 11, "gRPC fingerprints".
// A request that is not a proto.Message gets an error: set
// Options.Fingerprint for other codecs.
func DefaultFingerprint(fullMethod string, req any) (string, error) {
	return core.DefaultFingerprint("grpcx", fullMethod, req)
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
// A replay's response is a message of the stored type when the program
// links that type (generated code registers its own); a stored response
// whose type it no longer links (a method renamed or removed by a later
// release) is replayed as an emptypb.Empty carrying the stored bytes as
// unknown fields, which gRPC's proto codec sends as exactly those bytes.
// A codec other than proto (one registered for another content subtype)
// would encode it as an empty message: keep the response types of methods
// served with such codecs linked for as long as their keys are retained.
//
// The handler's context carries a grpc.ServerTransportStream of the
// interceptor's, which keeps the metadata the handler sets (for replays),
// even after the client left, when grpc.SetHeader, SendHeader and
// SetTrailer then return nil (a handler returning gRPC's refusal after
// its effect would release the key, and the retry would run it again):
// grpc.SetSendCompressor and grpc.ClientSupportedCompressors, which need
// gRPC's own stream, return an error in a guarded handler.
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
	cfg := core.Config{
		Pkg: "grpcx", Methods: opts.Methods, Caller: opts.Caller, SingleCaller: opts.SingleCaller,
		Metadata: opts.Metadata, Key: opts.Key, Optional: opts.Optional, Fingerprint: core.UnlessDefault(opts.Fingerprint, DefaultFingerprint),
		MaxStoredResponse: opts.MaxStoredResponse, ReplayMetadata: opts.ReplayMetadata, Wait: opts.Wait,
		UnavailableRetryDelay: opts.UnavailableRetryDelay, Logger: opts.Logger, LogKeys: opts.LogKeys,
	}
	if opts.Release != nil {
		cfg.Release = func(c core.Code) bool { return opts.Release(codes.Code(c)) }
	}
	s := &server{core: core.New(g, cfg)}
	return s.intercept
}

type server struct{ core *core.Server }

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	b := s.core.Begin(ctx, info.FullMethod, req, md.Get)
	switch {
	case b.Error != nil:
		return nil, status.FromProto(b.Error).Err()
	case b.Gone:
		return nil, status.FromContextError(ctx.Err()).Err()
	case b.Replay != nil:
		return replay(ctx, b.Replay)
	case !b.Run:
		return handler(ctx, req)
	}
	return s.run(ctx, req, info, handler, b.Held, b.Fingerprint)
}

// replay answers with a stored call: its header (with the marker) and
// trailer, and its response or status.
func replay(ctx context.Context, r *core.Replay) (any, error) {
	_ = grpc.SetHeader(ctx, metadata.MD(r.Header))
	if len(r.Trailer) > 0 {
		_ = grpc.SetTrailer(ctx, metadata.MD(r.Trailer))
	}
	if r.Status != nil {
		return nil, status.FromProto(r.Status).Err()
	}
	msg := core.NewMessage(r.TypeName, r.Message)
	if msg == nil {
		return nil, status.FromProto(core.NewStatus(core.Internal, core.ReasonResponseCorrupt,
			"the call with this idempotency key ran, but its stored response cannot be read", 0)).Err()
	}
	return msg, nil
}

// run calls the handler under held and stores or releases the outcome.
func (s *server) run(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler,
	held *guard.Held, fingerprint string) (resp any, err error) {
	hctx := s.core.HandlerContext(held, fingerprint)
	c := &capture{inner: grpc.ServerTransportStreamFromContext(ctx), method: info.FullMethod, call: ctx}
	hctx = grpc.NewContextWithServerTransportStream(hctx, c)
	returned := false
	defer func() {
		if !returned {
			// The handler panicked (the panic goes on, with its own stack)
			// or called runtime.Goexit: no response exists.
			s.core.Abandon(info.FullMethod, held)
		}
	}()
	start := time.Now()
	resp, err = handler(hctx, req)
	returned = true
	took := time.Since(start)
	r := core.Result{Msg: resp}
	r.Header, r.Trailer = c.metadata()
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err) // as grpc.Server turns it into a status
		}
		r.Status = st.Proto()
	}
	s.core.Finish(info.FullMethod, held, took, r)
	return resp, err
}

// capture is the ServerTransportStream the handler sees: it keeps a copy
// of every header and trailer, which is what a replay sends, and passes
// them on to the call's own stream. A copy is kept even when the stream
// refuses them because the client left: the replay carries what the
// handler meant to send, and the handler is not told of the refusal
// (see kept). Header metadata after SendHeader is not kept: gRPC refuses
// it (the header went out), so the client never gets it, as httpx
// stores the header as it was when the status went out.
type capture struct {
	inner  grpc.ServerTransportStream // nil when the interceptor runs outside a server
	method string
	call   context.Context // the call's context: done once the client left

	mu         sync.Mutex
	header     metadata.MD
	trailer    metadata.MD
	headerSent bool // SendHeader was called: the header is final
}

func (c *capture) Method() string { return c.method }

func (c *capture) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	kept := !c.headerSent
	if kept {
		c.header = metadata.Join(c.header, md)
	}
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.kept(kept, c.inner.SetHeader(md))
}

func (c *capture) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	kept := !c.headerSent
	if kept {
		c.header = metadata.Join(c.header, md)
		c.headerSent = true
	}
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.kept(kept, c.inner.SendHeader(md))
}

func (c *capture) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	c.trailer = metadata.Join(c.trailer, md)
	c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	return c.kept(true, c.inner.SetTrailer(md))
}

// kept is err, the call's stream refusing metadata, unless a copy was
// kept and the client left: then nil. Nothing goes out to a client that
// left, and the copy is what its retry is replayed. A handler told of
// the refusal after its effect (its deadline passed, the client hung up:
// the response was lost) would return the error, Internal or Canceled,
// which releases the key, and the retry would make the effect again.
func (c *capture) kept(kept bool, err error) error {
	if err != nil && kept && c.call.Err() != nil {
		return nil
	}
	return err
}

func (c *capture) metadata() (header, trailer core.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return core.MD(c.header), core.MD(c.trailer)
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint, the one the key is held under (the previous
// release's when the key's record was stored with it; see
// DefaultFingerprint): what a handler passes to downstream writes
// (lease.Fence, lease.KeyFor, backstop.Commit). ok is false outside a
// guarded call (a method not guarded, an optional key not sent).
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	return core.ClaimFrom(ctx)
}
