package core

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// Defaults.
const (
	DefaultMaxStoredResponse     = 1 << 20
	DefaultUnavailableRetryDelay = time.Second
)

// ReplayedMetadata is set to "true" in the header of every replayed call.
const ReplayedMetadata = "idempotent-replayed"

// Config is what an adapter's Options become; see grpcx.Options for each
// field. Pkg names the adapter in panics and logs.
type Config struct {
	Pkg                   string
	Methods               []string
	Caller                func(ctx context.Context) string
	SingleCaller          bool
	Metadata              string
	Key                   func(ctx context.Context, req any) (string, error)
	Optional              bool
	Fingerprint           func(method string, req any) (string, error)
	MaxStoredResponse     int
	ReplayMetadata        func(name string) bool
	HTTPFields            bool // metadata are HTTP fields (Connect): see FilterMD
	Release               func(Code) bool
	Wait                  time.Duration
	UnavailableRetryDelay time.Duration
	Logger                *slog.Logger
	LogKeys               bool
}

// DefaultRelease: see grpcx.DefaultRelease.
func DefaultRelease(c Code) bool {
	switch c {
	case Canceled, Unknown, DeadlineExceeded, ResourceExhausted, Aborted, Unimplemented, Internal, Unavailable, DataLoss:
		return true
	}
	return false
}

var private = map[string]bool{
	"set-cookie": true, "authentication-info": true, "proxy-authentication-info": true,
}

// DefaultReplayMetadata: see grpcx.DefaultReplayMetadata.
func DefaultReplayMetadata(name string) bool { return !private[name] }

// DefaultFingerprint: see grpcx.DefaultFingerprint.
func DefaultFingerprint(pkg, method string, req any) (string, error) {
	return fingerprint(pkg, method, req, true)
}

// previousFingerprint is DefaultFingerprint as releases before fields were
// put in number order computed it (the deterministic encoding as Go writes
// it: extensions first, oneof members after the other fields, unknown
// fields last). Begin compares a stored fingerprint with it too, so that
// the records those releases stored replay (docs/design.md, section 11,
// "gRPC fingerprints").
func previousFingerprint(pkg, method string, req any) (string, error) {
	return fingerprint(pkg, method, req, false)
}

// fingerprint is DefaultFingerprint, with fields in number order (sorted)
// or as Go writes them.
func fingerprint(pkg, method string, req any, sorted bool) (string, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", fmt.Errorf("%s: request of %s is %T, not a proto.Message; set Options.Fingerprint", pkg, method, req)
	}
	d := m.ProtoReflect().Descriptor()
	if hasAny(d, sorted) {
		m = proto.Clone(m) // the handler gets the request as it came
		canonicalAnys(m.ProtoReflect(), sorted)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("%s: fingerprint of %s: %w", pkg, method, err)
	}
	if sorted {
		sortFields(b, d)
	}
	h := sha256.New()
	name := d.FullName()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	h.Write(n[:])
	h.Write([]byte(name))
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])), nil
}

// anyName is google.protobuf.Any's full name.
const anyName protoreflect.FullName = "google.protobuf.Any"

// withAny caches hasAny's answer per request type.
var withAny sync.Map // anyQuery → bool

type anyQuery struct {
	name protoreflect.FullName
	ext  bool
}

// hasAny reports whether a message of type d can hold a
// google.protobuf.Any, at any depth. With ext, a message that can be
// extended may (an extension can be of any type, and be linked in from
// anywhere); without, extensions are not looked at, as releases before
// previousFingerprint's did not.
func hasAny(d protoreflect.MessageDescriptor, ext bool) bool {
	q := anyQuery{d.FullName(), ext}
	if v, ok := withAny.Load(q); ok {
		return v.(bool)
	}
	seen := map[protoreflect.FullName]bool{}
	var reach func(d protoreflect.MessageDescriptor) bool
	reach = func(d protoreflect.MessageDescriptor) bool {
		if d.FullName() == anyName {
			return true
		}
		if seen[d.FullName()] {
			return false
		}
		seen[d.FullName()] = true
		if ext && d.ExtensionRanges().Len() > 0 {
			return true
		}
		fields := d.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if md := fd.Message(); md != nil && reach(md) {
				return true
			}
		}
		return false
	}
	has := reach(d)
	withAny.Store(q, has)
	return has
}

// maxAnyDepth bounds how many google.protobuf.Any, each packed in the one
// around it, canonicalAnys re-encodes: each level decodes a copy of the
// bytes inside it and keeps it until the levels inside are done, so Anys
// packed thousands deep in one request cost the square of its size (44 KB
// took 46 MB, 180 KB 711 MB: a request of a few MB, under gRPC's 4 MB
// default, took the server's memory). An Any deeper than this keeps its
// bytes as they came, as one of a type not linked in; no schema nests Anys
// so deep, and the same bytes still fingerprint the same.
const maxAnyDepth = 8

// anyWalker is one canonicalAnys: whether fields are put in number order,
// and how deep in packed Anys the message it visits is. Its visits are
// func values made once per walk (a closure per message visited would be
// allocated for every message).
type anyWalker struct {
	sorted   bool
	depth    int // Anys re-encoded around the message visited
	field    func(protoreflect.FieldDescriptor, protoreflect.Value) bool
	mapValue func(protoreflect.MapKey, protoreflect.Value) bool
}

// canonicalAnys rewrites, at every depth of m (extensions included), the
// value of each google.protobuf.Any whose type is linked into the program
// as that message's deterministic encoding (its own Anys rewritten first;
// its fields in number order if sorted, see sortFields), so that a packed
// message fingerprints the same in whatever order its fields or map
// entries were encoded. Anys of unknown types, whose value does not
// decode, or packed in maxAnyDepth others, keep their bytes.
func canonicalAnys(m protoreflect.Message, sorted bool) {
	w := &anyWalker{sorted: sorted}
	w.field, w.mapValue = w.visitField, w.visitMapValue
	w.message(m)
}

func (w *anyWalker) message(m protoreflect.Message) {
	if m.Descriptor().FullName() != anyName {
		m.Range(w.field)
		return
	}
	if w.depth >= maxAnyDepth {
		return
	}
	fields := m.Descriptor().Fields()
	url, value := fields.ByNumber(1), fields.ByNumber(2)
	if url == nil || value == nil {
		return
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(m.Get(url).String())
	if err != nil {
		return
	}
	inner := mt.New()
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(m.Get(value).Bytes(), inner.Interface()); err != nil {
		return
	}
	w.depth++
	w.message(inner)
	w.depth--
	b, err := proto.MarshalOptions{AllowPartial: true, Deterministic: true}.Marshal(inner.Interface())
	if err != nil {
		return
	}
	if w.sorted {
		sortFields(b, inner.Descriptor())
	}
	m.Set(value, protoreflect.ValueOfBytes(b))
}

// visitField is message on the messages of field fd, of value v.
func (w *anyWalker) visitField(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	switch {
	case fd.IsMap():
		if fd.MapValue().Message() != nil {
			v.Map().Range(w.mapValue)
		}
	case fd.Message() == nil:
	case fd.IsList():
		for i := range v.List().Len() {
			w.message(v.List().Get(i).Message())
		}
	default:
		w.message(v.Message())
	}
	return true
}

func (w *anyWalker) visitMapValue(_ protoreflect.MapKey, v protoreflect.Value) bool {
	w.message(v.Message())
	return true
}

// Server is the shared server side: what happens before and after the
// handler.
type Server struct {
	g   *guard.Guard
	cfg Config
	// previous, with the default fingerprint, is previousFingerprint:
	// what a claim refused as a mismatch is tried with again.
	previous func(method string, req any) (string, error)
	methods  map[string]bool
	runs     adapter.RunTimes
	end      adapter.Ender // completes and releases claims
}

// New checks cfg, fills its defaults and returns a Server. It panics on a
// programmer's error: no guard, no methods, neither or both of Caller and
// SingleCaller.
func New(g *guard.Guard, cfg Config) *Server {
	p := cfg.Pkg
	if g == nil {
		panic(p + ": nil *guard.Guard")
	}
	switch {
	case cfg.Caller == nil && !cfg.SingleCaller:
		panic(p + ": Options must name the caller (Caller) or declare a single caller (SingleCaller); " +
			"without one, one caller's key would replay another caller's response")
	case cfg.Caller != nil && cfg.SingleCaller:
		panic(p + ": Options.Caller and Options.SingleCaller exclude each other")
	}
	if len(cfg.Methods) == 0 {
		panic(p + ": Options.Methods is empty: list the full method names to guard")
	}
	methods := make(map[string]bool, len(cfg.Methods))
	for _, m := range cfg.Methods {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 || strings.HasSuffix(m, "/") {
			panic(fmt.Sprintf("%s: Options.Methods: %q is not a full method name (/package.Service/Method)", p, m))
		}
		methods[m] = true
	}
	if cfg.Metadata == "" {
		cfg.Metadata = DefaultMetadata
	}
	cfg.Metadata = strings.ToLower(cfg.Metadata)
	var previous func(string, any) (string, error)
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = func(method string, req any) (string, error) { return DefaultFingerprint(p, method, req) }
		previous = func(method string, req any) (string, error) { return previousFingerprint(p, method, req) }
	}
	if cfg.MaxStoredResponse <= 0 {
		cfg.MaxStoredResponse = DefaultMaxStoredResponse
	}
	if cfg.ReplayMetadata == nil {
		cfg.ReplayMetadata = DefaultReplayMetadata
	}
	if cfg.Release == nil {
		cfg.Release = DefaultRelease
	}
	if cfg.UnavailableRetryDelay <= 0 {
		cfg.UnavailableRetryDelay = DefaultUnavailableRetryDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	end := adapter.Ender{Guard: g, Logger: cfg.Logger, Prefix: p + ": ", LogKeys: cfg.LogKeys}
	return &Server{g: g, cfg: cfg, previous: previous, methods: methods, end: end}
}

// UnlessDefault is fp, or nil when fp is def, the adapter's own
// DefaultFingerprint named in its Options: New then compares a mismatch
// with the previous release's fingerprint as for an Options without one,
// as DefaultFingerprint's comment promises.
func UnlessDefault(fp, def func(string, any) (string, error)) func(string, any) (string, error) {
	if fp != nil && reflect.ValueOf(fp).Pointer() == reflect.ValueOf(def).Pointer() {
		return nil
	}
	return fp
}

// Begun is what Begin decided.
type Begun struct {
	// Run: the call holds the key; run the handler under Held, kept
	// alive from the claim on (HandlerContext), and end it with Finish or
	// Abandon.
	Run         bool
	Held        *guard.Held
	Fingerprint string
	// Error: answer with this status; nothing ran, nothing was stored.
	Error *spb.Status
	// Replay: answer with this stored call.
	Replay *Replay
	// Gone: the client left before anything ran; answer with its context's
	// error.
	Gone bool
	// None of the above: the call is not guarded (another method, or an
	// optional key not sent); call the handler as it is.
}

// Replay is a stored call, ready to be answered.
type Replay struct {
	Header  MD // the stored header, and ReplayedMetadata: true
	Trailer MD
	// TypeName and Message are the response, when Status is nil.
	TypeName string
	Message  []byte
	// Status is the stored error, or the reason the call cannot be
	// replayed.
	Status *spb.Status
}

// Begin does everything before the handler: finds the key (incoming reads
// the request's metadata by lower-case name), scopes it, fingerprints the
// request and claims the key.
func (s *Server) Begin(ctx context.Context, method string, req any, incoming func(name string) []string) Begun {
	if !s.methods[method] {
		return Begun{}
	}
	id, st := s.requestKey(ctx, req, incoming)
	if st != nil {
		return Begun{Error: st}
	}
	if id == "" {
		return Begun{} // Optional, and the call has no key
	}
	scope, ok := s.scope(ctx, method)
	if !ok {
		return Begun{Error: NewStatus(Unauthenticated, ReasonCallerUnknown,
			"idempotency keys are kept per caller, and this call names none; authenticate and retry", 0)}
	}
	fingerprint, err := s.cfg.Fingerprint(method, req)
	if err != nil {
		s.cfg.Logger.Error(s.cfg.Pkg+": request not fingerprinted; the call was refused", "method", method, "err", err)
		return Begun{Error: NewStatus(Internal, ReasonFingerprint, "the request could not be fingerprinted; it was not run", 0)}
	}
	key := guard.Key{Scope: scope, ID: id}
	if outer, ok := ctx.Value(claimKey{}).(claimInfo); ok && outer.lease.Key == key && adapter.SameStore(outer.g, s.g) {
		// An interceptor over the same store around this one (the
		// interceptor chained twice, or a shared chain's and a service's
		// own of two guard.Guard values) holds this very key: the handler
		// runs under that claim, which ends it. Claimed again here, it
		// would be this call's own duplicate, in flight (Aborted).
		return Begun{}
	}

	out, held, err, gone := s.claim(ctx, key, fingerprint)
	if errors.Is(err, guard.ErrMismatch) && s.previous != nil {
		// A record stored by a release that fingerprinted this request
		// otherwise is this request's if it has that fingerprint.
		if prev, perr := s.previous(method, req); perr == nil && prev != fingerprint {
			if pout, pheld, perr, pgone := s.claim(ctx, key, prev); !errors.Is(perr, guard.ErrMismatch) {
				out, held, err, gone, fingerprint = pout, pheld, perr, pgone, prev
			}
		}
	}
	if gone {
		return Begun{Gone: true} // nothing was claimed
	}
	if err != nil {
		return Begun{Error: s.rejectClaim(key, method, err)}
	}
	if out.Status == guard.Replay {
		return Begun{Replay: s.replay(key, method, out.Result)}
	}
	if ctx.Err() != nil {
		// The client left before the handler ran: nothing happened yet.
		s.end.Release(held)
		return Begun{Gone: true}
	}
	return Begun{Run: true, Held: held, Fingerprint: fingerprint}
}

// claim claims key for fingerprint, waiting for another holder if
// Config.Wait says so. gone: the client left while it waited, and nothing
// was claimed.
func (s *Server) claim(ctx context.Context, key guard.Key, fingerprint string) (out guard.Outcome, held *guard.Held, err error, gone bool) {
	// Hold claims even if the client hangs up meanwhile: a claim cut off
	// after the store took it would lock the key for a whole lease. It
	// bounds the call itself and keeps the lease alive from then on.
	out, held, err = s.g.Hold(ctx, key, fingerprint)
	if _, busy := errors.AsType[*guard.InProgressError](err); busy && s.cfg.Wait > 0 {
		var ok bool
		out, err, ok = s.wait(ctx, key, fingerprint)
		if !ok {
			return out, nil, err, true
		}
		if err == nil && out.Status == guard.Acquired {
			held = s.g.Keep(ctx, out.Lease)
		}
	}
	return out, held, err, false
}

func (s *Server) requestKey(ctx context.Context, req any, incoming func(string) []string) (string, *spb.Status) {
	var id string
	if s.cfg.Key != nil {
		k, err := s.cfg.Key(ctx, req)
		if err != nil {
			return "", NewStatus(InvalidArgument, ReasonKeyMalformed, err.Error(), 0)
		}
		id = k
	} else {
		values := incoming(s.cfg.Metadata)
		switch len(values) {
		case 0:
		case 1:
			id = values[0]
			if id == "" {
				return "", NewStatus(InvalidArgument, ReasonKeyMalformed, s.cfg.Metadata+" is empty", 0)
			}
		default:
			return "", NewStatus(InvalidArgument, ReasonKeyMalformed,
				fmt.Sprintf("%d %s values; send exactly one", len(values), s.cfg.Metadata), 0)
		}
	}
	if id == "" {
		if s.cfg.Optional {
			return "", nil
		}
		where := s.cfg.Metadata + " metadata"
		if s.cfg.Key != nil {
			where = "an idempotency key in the request"
		}
		return "", NewStatus(InvalidArgument, ReasonKeyMissing, "this method requires "+where, 0)
	}
	if err := CheckKey(id); err != nil {
		return "", NewStatus(InvalidArgument, ReasonKeyMalformed, err.Error(), 0)
	}
	return id, nil
}

// scope is the key's scope: the full method, prefixed by the quoted caller.
// ok is false when Caller names no caller. A scope the store would refuse
// is replaced by its digest.
func (s *Server) scope(ctx context.Context, method string) (string, bool) {
	sc := method
	if s.cfg.Caller != nil {
		caller := s.cfg.Caller(ctx)
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
func (s *Server) rejectClaim(key guard.Key, method string, err error) *spb.Status {
	if inProgress, ok := errors.AsType[*guard.InProgressError](err); ok {
		return NewStatus(Aborted, ReasonKeyInUse,
			"a call with this idempotency key has not finished; retry after the delay given",
			s.InFlightRetryDelay(method, inProgress.RetryAfter))
	}
	switch {
	case errors.Is(err, guard.ErrMismatch):
		return NewStatus(FailedPrecondition, ReasonKeyReused,
			"this idempotency key was used with a different request; use a new key for a new request", 0)
	case errors.Is(err, guard.ErrExhausted):
		return NewStatus(Internal, ReasonKeyExhausted,
			"the call with this idempotency key was abandoned too often and will not run again", 0)
	case errors.Is(err, guard.ErrInvalidKey):
		return NewStatus(InvalidArgument, ReasonKeyMalformed, s.logErr(key, err), 0)
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return NewStatus(Unavailable, ReasonStoreUnavailable,
			"idempotency store unavailable: the call was not run; retry later with the same key",
			adapter.UnavailableDelay(s.g, s.cfg.UnavailableRetryDelay))
	default:
		s.cfg.Logger.Error(s.cfg.Pkg+": idempotency claim failed", append(s.logKey(key), "err", s.logErr(key, err))...)
		return NewStatus(Internal, ReasonStoreError, "idempotency store error; the call was not run", 0)
	}
}

// replay reads a stored call.
func (s *Server) replay(key guard.Key, method string, result []byte) *Replay {
	marker := MD{ReplayedMetadata: {"true"}}
	c, err := decodeRecord(result)
	if err != nil {
		s.cfg.Logger.Error(s.cfg.Pkg+": stored response unreadable",
			append(s.logKey(key), "method", method, "err", s.logErr(key, err))...)
		return &Replay{Header: marker, Status: NewStatus(Internal, ReasonResponseCorrupt,
			"the call with this idempotency key ran, but its stored response cannot be read", 0)}
	}
	r := &Replay{Header: join(c.header, marker), Trailer: c.trailer, TypeName: c.typeName, Message: c.message}
	switch {
	case c.notKept != 0:
		why := "it was larger than the server keeps"
		if c.notKept == notKeptNotProto {
			why = "it was not a protobuf message"
		}
		r.Status = NewStatus(AlreadyExists, ReasonResponseNotKept,
			"the call with this idempotency key ran and succeeded, but its response was not stored: "+why, 0)
	case c.status != nil:
		st := &spb.Status{}
		if err := proto.Unmarshal(c.status, st); err != nil {
			r.Status = NewStatus(Internal, ReasonResponseCorrupt,
				"the call with this idempotency key ran, but its stored status cannot be read", 0)
		} else {
			r.Status = st
		}
	}
	return r
}

func join(a, b MD) MD {
	out := make(MD, len(a)+len(b))
	for k, vs := range a {
		out[k] = append(out[k], vs...)
	}
	for k, vs := range b {
		out[k] = append(out[k], vs...)
	}
	return out
}

// NewMessage makes a stored response: a message of its own type when the
// type is linked into the program (protoregistry.GlobalTypes); else an
// Empty whose unknown fields are the stored bytes, which encodes to
// exactly those bytes. nil when the bytes do not decode as the type.
func NewMessage(typeName string, b []byte) proto.Message {
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

type claimKey struct{}

type claimInfo struct {
	lease       guard.Lease
	fingerprint string
	g           *guard.Guard // whose claim it is
}

// HandlerContext returns the handler's context: held's, whose ClaimFrom
// gives the lease. It ends when Finish or Abandon has ended the claim.
func (s *Server) HandlerContext(held *guard.Held, fingerprint string) context.Context {
	return context.WithValue(held.Context(), claimKey{}, claimInfo{lease: held.Lease(), fingerprint: fingerprint, g: s.g})
}

// ClaimFrom returns the lease and fingerprint HandlerContext put in ctx.
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(claimInfo)
	return c.lease, c.fingerprint, ok
}

// Result is how the handler ended.
type Result struct {
	Msg    any         // the response, when Status is nil
	Status *spb.Status // the handler's error status; nil on success
	// Header and Trailer are the metadata the handler set, not yet
	// filtered (Finish keeps what ReplayMetadata allows).
	Header, Trailer MD
}

// Finish stores the handler's outcome, or releases the key for a code
// Config.Release names, and ends held. took is how long the handler ran.
func (s *Server) Finish(method string, held *guard.Held, took time.Duration, r Result) {
	// The heartbeat ends even if what runs before the write panics (the
	// user's Config.Release): the lease then runs out instead of being
	// kept for a claim nobody holds. After the write, Stop does nothing.
	defer held.Stop()
	s.runs.Observe(method, took)
	rec := storedCall{header: FilterMD(r.Header, s.cfg.ReplayMetadata, s.cfg.HTTPFields), trailer: FilterMD(r.Trailer, s.cfg.ReplayMetadata, s.cfg.HTTPFields)}
	if r.Status != nil && r.Status.GetCode() != int32(OK) {
		if s.cfg.Release(Code(r.Status.GetCode())) {
			s.end.Release(held)
			return
		}
		st := r.Status
		if msg := st.GetMessage(); !utf8.ValidString(msg) {
			// A message cut mid-character, or raw bytes: grpc-go sends it
			// as it is, but a google.rpc.Status that holds it does not
			// encode (nor decode). Stored with U+FFFD in their place, the
			// code and details are replayed.
			st = proto.CloneOf(st)
			st.Message = strings.ToValidUTF8(msg, "\uFFFD")
		}
		b, err := proto.Marshal(st)
		if err != nil { // a detail that does not encode: the client gets none either
			b, err = proto.Marshal(&spb.Status{Code: st.GetCode(), Message: st.GetMessage()})
		}
		if err != nil {
			b, _ = proto.Marshal(&spb.Status{Code: st.GetCode()})
		}
		rec.status = b
	} else if r.Msg == nil {
		// An untyped nil reply (a hand-written handler's, or an
		// interceptor's inside this one): grpc-go sent it as an empty
		// message with OK, and so does its replay.
		rec.message = []byte{}
	} else if m, ok := r.Msg.(proto.Message); !ok {
		rec.notKept = notKeptNotProto
	} else {
		rec.typeName = string(m.ProtoReflect().Descriptor().FullName())
		if proto.Size(m) > s.cfg.MaxStoredResponse {
			rec.notKept = notKeptTooLarge
		} else if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(m); err != nil {
			rec.notKept = notKeptNotProto // the server's codec will fail to send it too
		} else {
			rec.message = b
		}
	}
	s.end.Complete(held, encodeRecord(rec), "method", method)
}

// Abandon releases the key of a handler that did not return (a panic,
// which goes on, or runtime.Goexit).
func (s *Server) Abandon(method string, held *guard.Held) {
	s.end.Release(held)
	s.cfg.Logger.Error(s.cfg.Pkg+": handler did not return (panic); idempotency key released",
		append(s.logKey(held.Lease().Key), "method", method)...)
}

// grpcReserved are the fields gRPC over HTTP/2 sets itself (grpc-go
// overrides content-type, user-agent and te) and the connection-specific
// ones HTTP/2 forbids: never stored.
var grpcReserved = map[string]bool{
	"content-type": true, "user-agent": true, "te": true,
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true, "upgrade": true,
}

// httpProtocol are the HTTP fields Connect and its HTTP server set
// themselves, and the hop-by-hop ones: never stored by an adapter whose
// metadata are HTTP fields (Config.HTTPFields).
var httpProtocol = map[string]bool{
	"content-type": true, "content-length": true, "content-encoding": true, "accept-encoding": true,
	"te": true, "trailer": true, "transfer-encoding": true, "connection": true, "keep-alive": true,
	"upgrade": true, "proxy-connection": true, "date": true,
}

// FilterMD returns the metadata to store of md: names lower-cased, those
// keep allows, never the protocol's own nor ReplayedMetadata. The
// protocol's own are "grpc-" and ":" names and grpcReserved; with
// httpFields (Connect), "connect-" names and httpProtocol's instead of
// grpcReserved, which are ordinary metadata to gRPC.
func FilterMD(md MD, keep func(string) bool, httpFields bool) MD {
	var out MD
	for k, vs := range md {
		k = strings.ToLower(k)
		own := strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, ":")
		if httpFields {
			own = own || strings.HasPrefix(k, "connect-") || httpProtocol[k]
		} else {
			own = own || grpcReserved[k]
		}
		if len(vs) == 0 || own || k == ReplayedMetadata || !keep(k) {
			continue
		}
		if out == nil {
			out = MD{}
		}
		out[k] = append(out[k], vs...)
	}
	return out
}
