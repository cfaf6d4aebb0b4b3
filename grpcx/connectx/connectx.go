// Package connectx is grpcx for Connect (connectrpc.com/connect): the same
// guard, statuses, replay marker and client retries, as connect.Interceptor
// values. It shares grpcx's core and does not link google.golang.org/grpc.
//
// On the handler side, NewInterceptor guards the listed procedures: the
// first call with an idempotency key (the Idempotency-Key header, or a
// request field through Options.Key) runs the handler and stores its
// response message and the header and trailer fields it set; a repeat with
// the same key and request gets them back with "Idempotent-Replayed: true"
// in its header. The errors are grpcx's, as Connect codes with the same
// google.rpc.ErrorInfo reasons and google.rpc.RetryInfo: in flight →
// CodeAborted with RetryInfo, key reused → CodeFailedPrecondition, store
// unreachable → CodeUnavailable with RetryInfo, bad key →
// CodeInvalidArgument. The same codes release the key (DefaultRelease).
// It works for every protocol a Connect handler speaks (Connect, gRPC,
// gRPC-Web) and codec (binary and JSON), with two limits of the JSON
// codec: it drops fields a server does not know as it decodes, so a retry
// that crosses a rolling deploy of a newer .proto is the same request
// only with the binary codec (with JSON it is refused as a reused key);
// and a stored response whose type neither the linked types, the
// procedure's schema nor the request's file (and its imports) declare is
// refused to a JSON client (CodeInternal), not answered without its
// fields.
//
// A replayed response's message is a *dynamicpb.Message of the stored
// type (Connect's unary interceptors cannot build a *connect.Response of
// the handler's own type), so interceptors outside this one see the same
// fields but not the generated Go type. It is the first response's
// message, as grpcx's is, and the same bytes on the wire when the codec
// encodes deterministically: connect-go's binary codec (proto.Marshal)
// writes map entries in Go's random map order, for the handler's own
// response as for a replay, so a message holding a map of two or more
// entries may come back in another order (it decodes the same). A
// handler option connect.WithCodec of a codec named "proto" that marshals
// with proto.MarshalOptions{Deterministic: true} makes them the same
// bytes.
//
// On the client side, NewClientInterceptor gives each unary call a UUIDv7
// key in its Idempotency-Key header (or WithIdempotencyKey's) and retries
// it with that key under gRPC's retry semantics, as grpcx's client does.
// The key sent is in the request's header after the call, so the same
// request sent again is a retry of that call, replayed: make a new request
// for a new call.
package connectx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemguard/idemguard/grpcx/internal/core"
	"github.com/idemguard/idemguard/guard"
)

// DefaultHeader is the request header that carries the key, as the IETF
// draft and httpx name it.
const DefaultHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed call.
const ReplayedHeader = "Idempotent-Replayed"

// ErrorDomain is the domain of the google.rpc.ErrorInfo of every error the
// interceptor answers itself; the reasons are grpcx's Reason* constants.
const ErrorDomain = core.ErrorDomain

// Options configure NewInterceptor. They are grpcx.Options with Connect's
// types; every field's zero value is its default, except Procedures, which
// must list the procedures to guard, and Caller and SingleCaller, of which
// exactly one must be chosen.
type Options struct {
	// Procedures are the procedures guarded ("/pkg.Service/Method", as
	// connect.Spec.Procedure and the generated *Procedure constants spell
	// them). Calls to others pass through untouched. Unary procedures
	// only: NewInterceptor panics on a streaming one it can look up, and
	// refuses the calls of one it cannot.
	Procedures []string
	// Caller names the caller a call comes from, as an authentication
	// interceptor in front of this one established (CallerFromContext);
	// never its credential. A call it names no one gets
	// CodeUnauthenticated. See grpcx.Options.Caller.
	Caller func(ctx context.Context) string
	// SingleCaller declares that one caller owns every key. Set it instead
	// of Caller, never with it.
	SingleCaller bool
	// Header is the request header that carries the key. Default
	// DefaultHeader ("Idempotency-Key").
	Header string
	// Key, if set, finds the key in the request message instead:
	// KeyFromField("request_id").
	Key func(ctx context.Context, req any) (string, error)
	// Optional lets a call without a key through, unguarded.
	Optional bool
	// Fingerprint digests the request. Default DefaultFingerprint (named
	// here too: with its comparison with the previous release's).
	Fingerprint func(procedure string, req any) (string, error)
	// MaxStoredResponse is the largest response kept for replay, in bytes
	// of its encoding; a larger one is replayed as CodeAlreadyExists
	// (ReasonResponseNotKept). Default 1 MiB.
	MaxStoredResponse int
	// ReplayHeader reports whether a header or trailer field (lower case)
	// that the handler set is stored and replayed. Default: every field
	// but set-cookie, authentication-info and proxy-authentication-info;
	// the protocols' own fields are never stored: names starting with
	// "grpc-", "connect-" or ":", content-type, content-length,
	// content-encoding, accept-encoding, te, trailer, date and the
	// hop-by-hop fields.
	ReplayHeader func(name string) bool
	// Release reports whether a call that ended with code c releases its
	// key instead of storing the error. Default DefaultRelease.
	Release func(c connect.Code) bool
	// Wait lets a duplicate wait for the first call's response, for up to
	// Wait; see grpcx.Options.Wait. Default 0: answer CodeAborted with
	// RetryInfo at once.
	Wait time.Duration
	// UnavailableRetryDelay is the RetryInfo delay sent with
	// CodeUnavailable when the store cannot be reached. Default 1 s; while
	// the circuit breaker of a fallback.Store under the guard is open, the
	// time until it lets its first probe through, if that is longer.
	UnavailableRetryDelay time.Duration
	// Logger hears about handler panics and results that could not be
	// stored. Default slog.Default().
	Logger *slog.Logger
	// LogKeys writes keys to the log in full; by default only their
	// digest (metrics.KeyDigest).
	LogKeys bool
}

// DefaultRelease is the default Options.Release: grpcx.DefaultRelease's
// codes (Canceled, Unknown, DeadlineExceeded, ResourceExhausted, Aborted,
// Unimplemented, Internal, Unavailable, DataLoss) release the key; every
// other error is stored and replayed. As in grpcx, a handler that returns
// one of them after its effect took place (CodeCanceled, when it returns
// its context's error after the client went away) has a retry run the
// effect again: once the effect has happened, return its outcome.
func DefaultRelease(c connect.Code) bool { return core.DefaultRelease(uint32(c)) }

// DefaultFingerprint is grpcx.DefaultFingerprint: SHA-256 over the request
// message's full name and its deterministic protobuf encoding (that of a
// message packed in a google.protobuf.Any too, when its type is linked),
// with the fields of every message the server knows in field-number
// order, unknown fields among them.
func DefaultFingerprint(procedure string, req any) (string, error) {
	return core.DefaultFingerprint("connectx", procedure, req)
}

// KeyFromField is grpcx.KeyFromField: the key from a string field of the
// request message (a dotted path reaches into nested messages).
func KeyFromField(path string) func(ctx context.Context, req any) (string, error) {
	return core.KeyFromField("connectx", path)
}

// CallerFromContext is grpcx.CallerFromContext: an Options.Caller that
// names the caller by the value an authentication interceptor stored in
// the context under key.
func CallerFromContext[T any](key any, name func(T) string) func(ctx context.Context) string {
	return core.CallerFromContext("connectx", key, name)
}

// WithIdempotencyKey returns a context that makes the client interceptor
// send key (when the request's header has none) instead of a fresh
// UUIDv7; see grpcx.WithIdempotencyKey. The same context works for both
// packages' clients.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return core.WithKey(ctx, key)
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint, the one the key is held under (see
// grpcx.ClaimFrom). ok is false outside a guarded call.
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	return core.ClaimFrom(ctx)
}

// NewInterceptor returns a handler interceptor (connect.WithInterceptors)
// that runs each keyed call of Options.Procedures once per key within g's
// retention and replays its response to repeats, with grpcx's guarantees
// (see grpcx.UnaryServerInterceptor). Streaming calls of other procedures
// pass through; one of a listed procedure, which it cannot guard, is
// refused with CodeInternal (and logged), never run unguarded. Put it
// after the authentication interceptor that Caller reads.
//
// NewInterceptor panics when g is nil, Procedures is empty or names a
// streaming method of a service linked into the program (generated code
// registers its own; grpcx.CheckMethods reports the same of a gRPC server), or
// Options choose neither or both of Caller and SingleCaller.
func NewInterceptor(g *guard.Guard, opts Options) connect.Interceptor {
	if err := checkUnary(opts.Procedures); err != nil {
		panic(err.Error())
	}
	header := opts.Header
	if header == "" {
		header = DefaultHeader
	}
	cfg := core.Config{
		Pkg: "connectx", Methods: opts.Procedures, Caller: opts.Caller, SingleCaller: opts.SingleCaller,
		Metadata: header, Key: opts.Key, Optional: opts.Optional, Fingerprint: core.UnlessDefault(opts.Fingerprint, DefaultFingerprint),
		MaxStoredResponse: opts.MaxStoredResponse, ReplayMetadata: opts.ReplayHeader, HTTPFields: true, Wait: opts.Wait,
		UnavailableRetryDelay: opts.UnavailableRetryDelay, Logger: opts.Logger, LogKeys: opts.LogKeys,
	}
	if opts.Release != nil {
		cfg.Release = func(c core.Code) bool { return opts.Release(connect.Code(c)) }
	}
	s := &server{core: core.New(g, cfg), procedures: map[string]bool{}, logger: opts.Logger}
	for _, p := range opts.Procedures {
		s.procedures[p] = true
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	return s
}

// checkUnary reports the procedures that the descriptors linked into the
// program (protoregistry.GlobalFiles) name as streaming methods.
func checkUnary(procedures []string) error {
	var bad []string
	for _, p := range procedures {
		svc, method, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		if !ok {
			continue // core.New refuses it
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			continue // not linked: refused when called, if it streams
		}
		if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
			if md := sd.Methods().ByName(protoreflect.Name(method)); md != nil && (md.IsStreamingClient() || md.IsStreamingServer()) {
				bad = append(bad, fmt.Sprintf("%q is a streaming procedure, which a unary interceptor never sees", p))
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("connectx: %d of Options.Procedures would run unguarded: %s", len(bad), strings.Join(bad, "; "))
}

type server struct {
	core       *core.Server
	procedures map[string]bool
	logger     *slog.Logger
}

func (s *server) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return s.wrap(next) }

func (s *server) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler refuses a streaming call of a listed procedure
// (one whose service NewInterceptor could not look up), which would
// otherwise run unguarded.
func (s *server) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if p := conn.Spec().Procedure; s.procedures[p] {
			s.logger.ErrorContext(ctx, "connectx: a streaming call of a procedure in Options.Procedures refused: the interceptor guards unary calls only", "procedure", p)
			return connect.NewError(connect.CodeInternal, fmt.Errorf("connectx: %s is in Options.Procedures but streams: a streaming call cannot be guarded, and is refused rather than run unguarded", p))
		}
		return next(ctx, conn)
	}
}

func (s *server) wrap(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		method := req.Spec().Procedure
		b := s.core.Begin(ctx, method, req.Any(), req.Header().Values)
		switch {
		case b.Error != nil:
			return nil, connectError(b.Error, nil)
		case b.Gone:
			return nil, connect.NewError(codeOf(ctx.Err()), ctx.Err())
		case b.Replay != nil:
			return replay(ctx, req, b.Replay)
		case !b.Run:
			return next(ctx, req)
		}
		return s.run(ctx, req, next, b.Held, b.Fingerprint)
	}
}

// run calls the handler under held and stores or releases the outcome.
func (s *server) run(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc, held *guard.Held, fingerprint string) (connect.AnyResponse, error) {
	method := req.Spec().Procedure
	hctx := s.core.HandlerContext(held, fingerprint)
	// A handler with the "simple" signature sets its header and trailer
	// through the call info; what outer interceptors set there before is
	// not the handler's.
	info, hasInfo := connect.CallInfoForHandlerContext(ctx)
	var beforeHeader, beforeTrailer http.Header
	if hasInfo {
		beforeHeader, beforeTrailer = info.ResponseHeader().Clone(), info.ResponseTrailer().Clone()
	}
	returned := false
	defer func() {
		if !returned {
			s.core.Abandon(method, held)
		}
	}()
	start := time.Now()
	res, err := next(hctx, req)
	returned = true
	took := time.Since(start)

	r := core.Result{Header: core.MD{}, Trailer: core.MD{}}
	if hasInfo {
		addChanged(r.Header, beforeHeader, info.ResponseHeader())
		addChanged(r.Trailer, beforeTrailer, info.ResponseTrailer())
	}
	if err != nil {
		r.Status = errorStatus(err)
		if ce, ok := errors.AsType[*connect.Error](err); ok && !connect.IsWireError(ce) {
			// A wire error (a downstream call's, passed on) is sent
			// without its metadata, which connect-go drops so that a
			// downstream's headers do not leak: not stored either.
			addChanged(r.Trailer, nil, ce.Meta())
		}
	} else if res != nil {
		r.Msg = res.Any()
		addChanged(r.Header, nil, res.Header())
		addChanged(r.Trailer, nil, res.Trailer())
	}
	s.core.Finish(method, held, took, r)
	return res, err
}

// addChanged adds to md the fields of h (lower-cased) whose values differ
// from before's: the values added after before's, when h still starts
// with them (an outer interceptor's values are not the handler's, and a
// replay, which runs the outer interceptors again, would send them
// twice), or all of them when the handler replaced them.
func addChanged(md core.MD, before, h http.Header) {
	for k, vs := range h {
		if len(vs) == 0 || slices.Equal(before[k], vs) {
			continue
		}
		if b := before[k]; len(b) < len(vs) && slices.Equal(b, vs[:len(b)]) {
			vs = vs[len(b):]
		}
		lk := strings.ToLower(k)
		md[lk] = append(md[lk], vs...)
	}
}

// codeOf is the code Connect sends for a handler's error: a
// *connect.Error's, Canceled or DeadlineExceeded for a context's error
// or a deadline's (connect.CodeOf says Unknown), else Unknown.
func codeOf(err error) connect.Code {
	if _, ok := errors.AsType[*connect.Error](err); !ok {
		switch {
		case errors.Is(err, context.Canceled):
			return connect.CodeCanceled
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
			return connect.CodeDeadlineExceeded
		}
	}
	return connect.CodeOf(err)
}

// errorStatus is the status of a handler's error, as Connect sends it.
func errorStatus(err error) *spb.Status {
	st := &spb.Status{Code: int32(codeOf(err))}
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok {
		st.Message = err.Error()
		return st
	}
	st.Message = ce.Message()
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return st
}

// connectError is the Connect error of st, with meta as its metadata.
func connectError(st *spb.Status, meta core.MD) *connect.Error {
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		if d, err := connect.NewErrorDetail(a); err == nil {
			ce.AddDetail(d)
		}
	}
	for k, vs := range meta {
		for _, v := range vs {
			ce.Meta().Add(k, v)
		}
	}
	return ce
}

// replay answers with a stored call.
func replay(ctx context.Context, req connect.AnyRequest, r *core.Replay) (connect.AnyResponse, error) {
	if r.Status != nil {
		// The header goes out through the call info (the handler's own
		// path for it), the trailer as the error's metadata.
		if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
			for k, vs := range r.Header {
				for _, v := range vs {
					info.ResponseHeader().Add(k, v)
				}
			}
			return nil, connectError(r.Status, r.Trailer)
		}
		return nil, connectError(r.Status, core.MD(mergeMD(r.Header, r.Trailer)))
	}
	res, ok := newResponse(req, r.TypeName, r.Message)
	if !ok {
		return nil, connectError(core.NewStatus(core.Internal, core.ReasonResponseCorrupt,
			"the call with this idempotency key ran, but its stored response cannot be read", 0), r.Header)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			res.Header().Add(k, v)
		}
	}
	for k, vs := range r.Trailer {
		for _, v := range vs {
			res.Trailer().Add(k, v)
		}
	}
	return res, nil
}

func mergeMD(a, b core.MD) map[string][]string {
	out := map[string][]string{}
	for k, vs := range a {
		out[k] = append(out[k], vs...)
	}
	for k, vs := range b {
		out[k] = append(out[k], vs...)
	}
	return out
}

// newResponse makes the stored response: a dynamic message of the stored
// type, whose descriptor comes from the linked types (generated code
// registers its own), the procedure's schema, or the request message's
// file and its imports (a handler of dynamic messages, whose types no
// registry knows); when none knows it, an Empty carrying the bytes as
// unknown fields, whose binary encoding is the stored bytes. The JSON
// codec would drop them: a request of another codec than the binary one
// is refused then (ok false), not answered an empty success.
func newResponse(req connect.AnyRequest, typeName string, b []byte) (connect.AnyResponse, bool) {
	name := protoreflect.FullName(typeName)
	var desc protoreflect.MessageDescriptor
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(name); err == nil {
		desc = mt.Descriptor()
	} else if md, ok := req.Spec().Schema.(protoreflect.MethodDescriptor); ok && md.Output().FullName() == name {
		desc = md.Output()
	} else if pm, ok := req.Any().(proto.Message); ok {
		desc = messageIn(pm.ProtoReflect().Descriptor().ParentFile(), name, 0)
	}
	if desc == nil {
		if !binaryCodec(req) {
			return nil, false
		}
		m := &emptypb.Empty{}
		m.ProtoReflect().SetUnknown(protoreflect.RawFields(b))
		return connect.NewResponse(m), true
	}
	m := dynamicpb.NewMessage(desc)
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(b, m); err != nil {
		return nil, false
	}
	return connect.NewResponse(m), true
}

// messageIn finds the message name in file or the files it imports
// (depth levels down at most 8).
func messageIn(file protoreflect.FileDescriptor, name protoreflect.FullName, depth int) protoreflect.MessageDescriptor {
	if file == nil || depth > 8 {
		return nil
	}
	if d := nestedMessage(file.Messages(), name); d != nil {
		return d
	}
	imports := file.Imports()
	for i := range imports.Len() {
		if d := messageIn(imports.Get(i).FileDescriptor, name, depth+1); d != nil {
			return d
		}
	}
	return nil
}

// nestedMessage finds the message name among ms and the messages nested
// in them.
func nestedMessage(ms protoreflect.MessageDescriptors, name protoreflect.FullName) protoreflect.MessageDescriptor {
	for i := range ms.Len() {
		m := ms.Get(i)
		if m.FullName() == name {
			return m
		}
		if d := nestedMessage(m.Messages(), name); d != nil {
			return d
		}
	}
	return nil
}

// binaryCodec reports whether req came with the binary protobuf codec: a
// Content-Type without "json" (application/proto, application/grpc,
// application/grpc-web+proto...), or a GET whose encoding is proto.
func binaryCodec(req connect.AnyRequest) bool {
	if req.HTTPMethod() == http.MethodGet {
		return req.Peer().Query.Get("encoding") == "proto"
	}
	return !strings.Contains(req.Header().Get("Content-Type"), "json")
}

// Reason returns the reason of the ErrorInfo of ErrorDomain in err's
// details (a *connect.Error), or "".
func Reason(err error) string { return core.ReasonOf(details(err)) }

// RetryDelay returns the delay of the google.rpc.RetryInfo in err's
// details, if it carries one.
func RetryDelay(err error) (time.Duration, bool) { return core.RetryInfoOf(details(err)) }

func details(err error) []core.Detail {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok {
		return nil
	}
	out := make([]core.Detail, 0, len(ce.Details()))
	for _, d := range ce.Details() {
		out = append(out, core.Detail{Type: d.Type(), Bytes: d.Bytes()})
	}
	return out
}
