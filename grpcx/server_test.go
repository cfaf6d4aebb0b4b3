package grpcx_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func guarded(e *env, opts grpcx.Options) serveOpts {
	return serveOpts{interceptors: []grpc.UnaryServerInterceptor{recovery, grpcx.UnaryServerInterceptor(e.g, guardOpts(e.t, opts))}}
}

// TestReplayByteForByte: a repeat gets the first call's response, the
// same bytes on the wire, its header and trailer metadata (without
// set-cookie) and idempotent-replayed: true; the handler ran once, and the
// first response left the server only after it was stored.
func TestReplayByteForByte(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()

	first := invokeRaw(ctx, conn, chargeName, "k-1", amountReq(100))
	if first.err != nil {
		t.Fatal(first.err)
	}
	if rec, err := e.g.Get(ctx, guard.Key{Scope: chargeName, ID: "k-1"}); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record when the client had the response: %+v, %v; want completed", rec, err)
	}
	second := invokeRaw(ctx, conn, chargeName, "k-1", amountReq(100))
	if second.err != nil {
		t.Fatal(second.err)
	}
	if first.replayed() || !second.replayed() {
		t.Fatalf("replayed marker: first %v, second %v", first.replayed(), second.replayed())
	}
	if !bytes.Equal(first.raw, second.raw) || len(first.raw) == 0 {
		t.Fatalf("replay bytes\n%x\nwant\n%x", second.raw, first.raw)
	}
	for _, k := range []string{"x-charge"} {
		if got, want := second.header.Get(k), first.header.Get(k); len(want) != 1 || strings.Join(got, ",") != want[0] {
			t.Errorf("replayed header %s = %q, first had %q", k, got, want)
		}
	}
	for _, k := range []string{"x-ledger", "x-bin-bin"} {
		if got, want := second.trailer.Get(k), first.trailer.Get(k); len(want) != 1 || strings.Join(got, ",") != want[0] {
			t.Errorf("replayed trailer %s = %q, first had %q", k, got, want)
		}
	}
	if len(first.header.Get("set-cookie")) != 1 || len(second.header.Get("set-cookie")) != 0 {
		t.Errorf("set-cookie: first %q, replay %q; want it on the first only", first.header.Get("set-cookie"), second.header.Get("set-cookie"))
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// A client with the generated type gets the concrete message too.
	third := charge(ctx, conn, "k-1", 100)
	if third.err != nil || !third.replayed() || !proto.Equal(third.resp, first.resp) {
		t.Fatalf("third: %v replayed %v %v, want %v", third.err, third.replayed(), third.resp, first.resp)
	}
	// The same key on a method not guarded, or unguarded calls, are
	// untouched.
	if c := invoke(ctx, conn, getName, "k-1", amountReq(1)); c.err != nil || c.replayed() || p.gets.Load() != 1 {
		t.Fatalf("Get: %v replayed %v runs %d", c.err, c.replayed(), p.gets.Load())
	}
}

// TestReplayKeepsHTTPNamedMetadata: metadata whose names are HTTP or
// Connect protocol fields elsewhere (date, connect-*, content-encoding,
// trailer…) are ordinary metadata to gRPC, which delivers them: a replay
// has them too. (They were dropped by the filter grpcx shares with
// connectx, where they are the protocol's own fields; found by review.)
func TestReplayKeepsHTTPNamedMetadata(t *testing.T) {
	e := newEnv(t, guard.Options{})
	names := []string{"date", "content-language", "connect-region", "accept-encoding", "content-encoding", "trailer"}
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		md := metadata.MD{}
		for _, k := range names {
			md.Set(k, "v")
		}
		if err := grpc.SetHeader(ctx, md); err != nil {
			return nil, err
		}
		if err := grpc.SetTrailer(ctx, md); err != nil {
			return nil, err
		}
		return structpb.NewList([]any{float64(n)})
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	a := charge(ctx, conn, "hdr-1", 1)
	b := charge(ctx, conn, "hdr-1", 1)
	if a.err != nil || b.err != nil || !b.replayed() {
		t.Fatalf("%v %v replayed %v", a.err, b.err, b.replayed())
	}
	for _, k := range names {
		if len(a.header.Get(k)) == 0 || len(a.trailer.Get(k)) == 0 {
			t.Errorf("%q: the first call's header %q, trailer %q: gRPC did not deliver it", k, a.header.Get(k), a.trailer.Get(k))
		}
		if len(a.header.Get(k)) > 0 && len(b.header.Get(k)) == 0 {
			t.Errorf("header %q: first %q, replay none", k, a.header.Get(k))
		}
		if len(a.trailer.Get(k)) > 0 && len(b.trailer.Get(k)) == 0 {
			t.Errorf("trailer %q: first %q, replay none", k, a.trailer.Get(k))
		}
	}
}

// statusOf returns err's code, ErrorInfo reason and RetryInfo delay.
func statusOf(t *testing.T, err error) (codes.Code, string, time.Duration, bool) {
	t.Helper()
	d, ok := grpcx.RetryDelay(err)
	return status.Code(err), grpcx.Reason(err), d, ok
}

// TestMismatch: the same key with another request is refused with
// FailedPrecondition and ReasonKeyReused; the first's response is not
// revealed, and the handler does not run.
func TestMismatch(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	if c := charge(ctx, conn, "m-1", 100); c.err != nil {
		t.Fatal(c.err)
	}
	c := charge(ctx, conn, "m-1", 200)
	code, reason, _, retry := statusOf(t, c.err)
	if code != codes.FailedPrecondition || reason != grpcx.ReasonKeyReused || retry {
		t.Fatalf("mismatch: %v %q retry %v (%v)", code, reason, retry, c.err)
	}
	if len(c.resp.GetValues()) != 0 || c.replayed() {
		t.Fatalf("mismatch revealed %v (replayed %v)", c.resp, c.replayed())
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", p.runs.Load())
	}
}

// TestInFlight: a duplicate of a running call gets Aborted with
// ReasonKeyInUse and a RetryInfo: 1 s before the method ran on this
// instance, then its typical run time (here about 30 ms, at least 20 ms),
// never the 30 s left of the lease.
func TestInFlight(t *testing.T) {
	e := newEnv(t, guard.Options{})
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var slow atomic.Bool
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if slow.Load() {
			entered <- struct{}{}
			<-release
		} else {
			time.Sleep(30 * time.Millisecond)
		}
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()

	duplicate := func(key string) (codes.Code, string, time.Duration, bool) {
		slow.Store(true)
		first := make(chan call, 1)
		go func() { first <- charge(ctx, conn, key, 1) }()
		<-entered
		c := charge(ctx, conn, key, 1)
		close(release)
		if f := <-first; f.err != nil {
			t.Fatal(f.err)
		}
		release = make(chan struct{})
		slow.Store(false)
		return statusOf(t, c.err)
	}
	code, reason, d, ok := duplicate("f-1")
	if code != codes.Aborted || reason != grpcx.ReasonKeyInUse || !ok || d != grpcx.DefaultInFlightRetryDelay {
		t.Fatalf("before any run: %v %q RetryInfo %v %v", code, reason, d, ok)
	}
	for i := range 4 { // runs of about 30 ms
		if c := charge(ctx, conn, "f-quick-"+string(rune('a'+i)), 1); c.err != nil {
			t.Fatal(c.err)
		}
	}
	code, reason, d, ok = duplicate("f-2")
	if code != codes.Aborted || reason != grpcx.ReasonKeyInUse || !ok || d < grpcx.MinInFlightRetryDelay || d >= time.Second {
		t.Fatalf("after 30 ms runs: %v %q RetryInfo %v %v, want about 30 ms", code, reason, d, ok)
	}
	t.Logf("RetryInfo after runs of 30 ms: %s", d)
	if e.records(t) != 6 {
		t.Fatalf("%d records, want 6 (no duplicate stored anything)", e.records(t))
	}
}

// TestBadKeys: a missing, empty, doubled, too long or malformed key gets
// InvalidArgument with its reason, and nothing is stored or run.
func TestBadKeys(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		md     []string
		reason string
	}{
		{"missing", nil, grpcx.ReasonKeyMissing},
		{"empty", []string{""}, grpcx.ReasonKeyMalformed},
		{"two", []string{"a", "b"}, grpcx.ReasonKeyMalformed},
		{"too long", []string{strings.Repeat("k", grpcx.MaxKeyLen+1)}, grpcx.ReasonKeyMalformed},
		{"space", []string{"a key"}, grpcx.ReasonKeyMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cctx := ctx
			for _, v := range tc.md {
				cctx = metadata.AppendToOutgoingContext(cctx, grpcx.DefaultMetadata, v)
			}
			c := invoke(cctx, conn, chargeName, "", amountReq(1))
			code, reason, _, _ := statusOf(t, c.err)
			if code != codes.InvalidArgument || reason != tc.reason {
				t.Fatalf("%v %q (%v), want InvalidArgument %q", code, reason, c.err, tc.reason)
			}
		})
	}
	// The longest key is fine.
	if c := charge(ctx, conn, strings.Repeat("k", grpcx.MaxKeyLen), 1); c.err != nil {
		t.Fatal(c.err)
	}
	if p.runs.Load() != 1 || e.records(t) != 1 {
		t.Fatalf("runs %d, records %d; want 1 and 1 (the longest key's)", p.runs.Load(), e.records(t))
	}
}

// TestErrors: a handler's status is stored and replayed (with its details
// and metadata) unless Options.Release names its code; DefaultRelease
// releases the "try again" codes, so the retry runs the handler again;
// Options.Release can keep them.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		release  func(codes.Code) bool
		released bool
	}{
		{"InvalidArgument stored", withDetail(codes.InvalidArgument, "card declined"), nil, false},
		{"NotFound stored", status.Error(codes.NotFound, "no such account"), nil, false},
		{"FailedPrecondition stored", status.Error(codes.FailedPrecondition, "account closed"), nil, false},
		{"Unavailable released", status.Error(codes.Unavailable, "bank down"), nil, true},
		{"Internal released", status.Error(codes.Internal, "bug"), nil, true},
		{"plain error (Unknown) released", errors.New("oops"), nil, true},
		{"context error released", context.DeadlineExceeded, nil, true},
		{"Aborted released", status.Error(codes.Aborted, "tx aborted"), nil, true},
		{"ResourceExhausted released", status.Error(codes.ResourceExhausted, "quota"), nil, true},
		{"Internal kept by Options.Release", status.Error(codes.Internal, "bug"), func(codes.Code) bool { return false }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
				_ = grpc.SetHeader(ctx, metadata.Pairs("x-attempt", "1"))
				_ = grpc.SetTrailer(ctx, metadata.Pairs("x-why", "declined"))
				return nil, tc.err
			}}
			conn := serve(t, p, guarded(e, grpcx.Options{Release: tc.release}))
			ctx := context.Background()
			first := charge(ctx, conn, "e-1", 1)
			second := charge(ctx, conn, "e-1", 1)
			if first.err == nil || second.err == nil {
				t.Fatalf("errors %v, %v", first.err, second.err)
			}
			if tc.released {
				if p.runs.Load() != 2 || second.replayed() || e.records(t) != 0 {
					t.Fatalf("runs %d replayed %v records %d; want the key released (2 runs, nothing stored)", p.runs.Load(), second.replayed(), e.records(t))
				}
				return
			}
			if p.runs.Load() != 1 || !second.replayed() {
				t.Fatalf("runs %d replayed %v; want the status stored and replayed", p.runs.Load(), second.replayed())
			}
			a, b := status.Convert(first.err), status.Convert(second.err)
			if !proto.Equal(a.Proto(), b.Proto()) {
				t.Fatalf("replayed status %v, want %v", b.Proto(), a.Proto())
			}
			if got := second.trailer.Get("x-why"); len(got) != 1 || got[0] != "declined" {
				t.Fatalf("replayed trailer x-why %q", got)
			}
			if got := second.header.Get("x-attempt"); len(got) != 1 {
				t.Fatalf("replayed header x-attempt %q", got)
			}
		})
	}
}

func withDetail(c codes.Code, msg string) error {
	st, _ := status.New(c, msg).WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "card", Description: msg}}})
	return st.Err()
}

// TestPanicReleases: a handler that panics releases the key (the panic
// goes on, to the recovery interceptor outside); the retry runs it again.
func TestPanicReleases(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if n == 1 {
			panic("boom")
		}
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	if c := charge(ctx, conn, "p-1", 1); status.Code(c.err) != codes.Internal || !strings.Contains(c.err.Error(), "boom") {
		t.Fatalf("panicking call: %v", c.err)
	}
	if c := charge(ctx, conn, "p-1", 1); c.err != nil || c.replayed() || p.runs.Load() != 2 {
		t.Fatalf("retry: %v replayed %v runs %d", c.err, c.replayed(), p.runs.Load())
	}
}

type callerKey struct{}

// auth is an authentication interceptor: it names the caller by the
// x-user metadata (a real one verifies a token and names its subject).
func auth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("x-user"); len(u) == 1 {
		ctx = context.WithValue(ctx, callerKey{}, u[0])
	}
	return h(ctx, req)
}

// TestCallers: keys are kept per caller: the same key and request from two
// callers run twice and replay to each its own response; a call naming no
// caller gets Unauthenticated; Options must choose Caller or
// SingleCaller, and name the methods.
func TestCallers(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	g := grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{Caller: grpcx.CallerFromContext[string](callerKey{}, nil)}))
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{auth, g}})
	ctx := context.Background()
	as := func(user string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-user", user) }
	a1, b1 := charge(as("alice"), conn, "c-1", 1), charge(as("bob"), conn, "c-1", 1)
	a2, b2 := charge(as("alice"), conn, "c-1", 1), charge(as("bob"), conn, "c-1", 1)
	for _, c := range []call{a1, b1, a2, b2} {
		if c.err != nil {
			t.Fatal(c.err)
		}
	}
	if p.runs.Load() != 2 || !a2.replayed() || !b2.replayed() || !proto.Equal(a1.resp, a2.resp) || !proto.Equal(b1.resp, b2.resp) || proto.Equal(a1.resp, b1.resp) {
		t.Fatalf("runs %d; alice %v→%v, bob %v→%v", p.runs.Load(), a1.resp, a2.resp, b1.resp, b2.resp)
	}
	c := charge(ctx, conn, "c-1", 1)
	if code, reason, _, _ := statusOf(t, c.err); code != codes.Unauthenticated || reason != grpcx.ReasonCallerUnknown {
		t.Fatalf("no caller: %v", c.err)
	}
	for name, opts := range map[string]grpcx.Options{
		"neither":    {Methods: []string{chargeName}},
		"both":       {Methods: []string{chargeName}, SingleCaller: true, Caller: func(context.Context) string { return "x" }},
		"no methods": {SingleCaller: true},
		"bad method": {SingleCaller: true, Methods: []string{"Charge"}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: UnaryServerInterceptor did not panic", name)
				}
			}()
			grpcx.UnaryServerInterceptor(e.g, opts)
		}()
	}
}

// TestOptionalKey: with Optional, a call without a key runs unguarded
// (and ClaimFrom says so); with one, it is guarded and ClaimFrom gives the
// lease.
func TestOptionalKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var fences []int64
	var mu sync.Mutex
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		lease, fp, ok := grpcx.ClaimFrom(ctx)
		mu.Lock()
		if ok && fp != "" {
			fences = append(fences, lease.Fence)
		} else {
			fences = append(fences, -1)
		}
		mu.Unlock()
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{Optional: true}))
	ctx := context.Background()
	for range 2 {
		if c := charge(ctx, conn, "", 1); c.err != nil || c.replayed() {
			t.Fatal(c.err)
		}
	}
	if c := charge(ctx, conn, "o-1", 1); c.err != nil {
		t.Fatal(c.err)
	}
	if p.runs.Load() != 3 || e.records(t) != 1 || len(fences) != 3 || fences[0] != -1 || fences[1] != -1 || fences[2] < 1 {
		t.Fatalf("runs %d records %d fences %v", p.runs.Load(), e.records(t), fences)
	}
}

// TestStoreUnavailable: a store that cannot be reached gives Unavailable
// with ReasonStoreUnavailable and a RetryInfo of UnavailableRetryDelay;
// the handler does not run.
func TestStoreUnavailable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{Lease: time.Second})
	p := &payments{}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(g,
		guardOpts(t, grpcx.Options{UnavailableRetryDelay: 3 * time.Second}))}})
	c := charge(context.Background(), conn, "u-1", 1)
	code, reason, d, ok := statusOf(t, c.err)
	if code != codes.Unavailable || reason != grpcx.ReasonStoreUnavailable || !ok || d != 3*time.Second || p.runs.Load() != 0 {
		t.Fatalf("%v %q RetryInfo %v %v, runs %d (%v)", code, reason, d, ok, p.runs.Load(), c.err)
	}
}

// TestStoreUnavailableBreakerOpen: under a fail-closed fallback.Store
// whose breaker the store's outage opened, the RetryInfo delay is the time
// until the breaker lets its first probe through (OpenTimeout 5 s), not
// UnavailableRetryDelay's 1 s: a client that followed 1 s met the same
// open breaker again.
func TestStoreUnavailableBreakerOpen(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	fb, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{}),
		fallback.Options{Timeout: 300 * time.Millisecond, FailuresToOpen: 1, OpenTimeout: 5 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(fb, guard.Options{Lease: time.Second})
	p := &payments{}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(g, guardOpts(t, grpcx.Options{}))}})
	opening := time.Now() // the breaker opens after this
	_ = charge(context.Background(), conn, "u-1", 1)
	if st := fb.State(); st != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", st)
	}
	c := charge(context.Background(), conn, "u-2", 1)
	left := time.Until(opening.Add(5 * time.Second))
	code, reason, d, ok := statusOf(t, c.err)
	if code != codes.Unavailable || reason != grpcx.ReasonStoreUnavailable || !ok || p.runs.Load() != 0 {
		t.Fatalf("%v %q RetryInfo %v %v, runs %d (%v)", code, reason, d, ok, p.runs.Load(), c.err)
	}
	if d < left || d > 5*time.Second {
		t.Errorf("breaker open: RetryInfo %v; the breaker lets no probe through for %v more", d, left.Round(time.Millisecond))
	}
}

// A handler that answers (nil, nil), written by hand or an interceptor
// inside the guard's: grpc-go sends an empty message with OK, and a retry
// with the key must get the same, not an error saying the response was
// not a protobuf message (which the client does not retry: a call that
// succeeded would look failed).
func TestNilResponseReplayed(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	desc := p.desc()
	desc.Methods[0] = grpc.MethodDesc{MethodName: "Charge", Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := &structpb.Struct{}
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) {
			p.runs.Add(1)
			return nil, nil
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: chargeName}, h)
	}}
	conn := serveWith(t, p, guarded(e, grpcx.Options{}), desc)
	for i := range 2 {
		c := charge(context.Background(), conn, "nil-1", 1)
		if c.err != nil || c.replayed() != (i == 1) {
			t.Fatalf("call %d: %v (reason %q), replayed %v; want OK, replayed on the retry", i+1, c.err, grpcx.Reason(c.err), c.replayed())
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestLargeResponseNotKept: a response over MaxStoredResponse reaches the
// client; a replay answers AlreadyExists with ReasonResponseNotKept, and
// the handler does not run again.
func TestLargeResponseNotKept(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		return structpb.NewList([]any{strings.Repeat("x", 2000)})
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{MaxStoredResponse: 1000}))
	ctx := context.Background()
	first, second := charge(ctx, conn, "l-1", 1), charge(ctx, conn, "l-1", 1)
	if first.err != nil || len(first.resp.GetValues()) != 1 {
		t.Fatalf("first: %v", first.err)
	}
	if code, reason, _, _ := statusOf(t, second.err); code != codes.AlreadyExists || reason != grpcx.ReasonResponseNotKept || !second.replayed() || p.runs.Load() != 1 {
		t.Fatalf("replay: %v replayed %v runs %d", second.err, second.replayed(), p.runs.Load())
	}
}

// TestCorruptStoredResponse: a record the interceptor cannot read is
// answered Internal with ReasonResponseCorrupt; the handler does not run.
func TestCorruptStoredResponse(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx := context.Background()
	fp, err := grpcx.DefaultFingerprint(chargeName, amountReq(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.g.Do(ctx, guard.Key{Scope: chargeName, ID: "x-1"}, fp, func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("not a record"), nil
	}); err != nil {
		t.Fatal(err)
	}
	c := charge(ctx, conn, "x-1", 1)
	if code, reason, _, _ := statusOf(t, c.err); code != codes.Internal || reason != grpcx.ReasonResponseCorrupt || p.runs.Load() != 0 {
		t.Fatalf("%v, runs %d", c.err, p.runs.Load())
	}
}

// TestClientHangsUp: the client gives up while the handler runs; the
// handler's response is stored all the same, and the retry is replayed.
func TestClientHangsUp(t *testing.T) {
	e := newEnv(t, guard.Options{})
	entered, finished := make(chan struct{}, 1), make(chan struct{}, 1)
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		entered <- struct{}{}
		<-ctx.Done() // the client left
		defer func() { finished <- struct{}{} }()
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge", "1")) // the stream is done: kept for the replay
		return structpb.NewList([]any{float64(n)})
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan call, 1)
	go func() { done <- charge(ctx, conn, "h-1", 1) }()
	<-entered
	cancel()
	if c := <-done; status.Code(c.err) != codes.Canceled {
		t.Fatalf("hung-up call: %v", c.err)
	}
	<-finished
	// The handler returned its response after the client left: stored.
	testenv.WaitFor(t, 10*time.Second, "the hung-up call's record to be completed", func() bool {
		rec, err := e.g.Get(context.Background(), guard.Key{Scope: chargeName, ID: "h-1"})
		return err == nil && rec.State == guard.StateCompleted
	})
	if c := charge(context.Background(), conn, "h-1", 1); c.err != nil || !c.replayed() || p.runs.Load() != 1 || len(c.header.Get("x-charge")) != 1 {
		t.Fatalf("retry: %v replayed %v runs %d header %v", c.err, c.replayed(), p.runs.Load(), c.header)
	}
}

// TestWait: with Options.Wait a duplicate waits for the first call's
// response and gets its replay, not Aborted.
func TestWait(t *testing.T) {
	busy := make(chan struct{}, 1)
	e := newEnv(t, guard.Options{Observer: guard.ObserverFunc(func(_ context.Context, ev guard.Event) {
		if ev.Kind == guard.EventInProgress {
			select {
			case busy <- struct{}{}:
			default:
			}
		}
	})})
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		entered <- struct{}{}
		<-release
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, guarded(e, grpcx.Options{Wait: 10 * time.Second}))
	ctx := context.Background()
	first := make(chan call, 1)
	go func() { first <- charge(ctx, conn, "w-1", 1) }()
	<-entered
	dup := make(chan call, 1)
	go func() { dup <- charge(ctx, conn, "w-1", 1) }()
	<-busy // the duplicate found the key in progress, and waits
	close(release)
	f, d := <-first, <-dup
	if f.err != nil || d.err != nil || !d.replayed() || !proto.Equal(f.resp, d.resp) || p.runs.Load() != 1 {
		t.Fatalf("first %v, duplicate %v replayed %v, runs %d", f.err, d.err, d.replayed(), p.runs.Load())
	}
}

// TestRetentionExpires: a stored response is replayed for the guard's TTL
// and no longer (miniredis, whose clock the test moves).
func TestRetentionExpires(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{TTL: time.Hour})
	p := &payments{}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(g, guardOpts(t, grpcx.Options{}))}})
	ctx := context.Background()
	if c := charge(ctx, conn, "r-1", 1); c.err != nil {
		t.Fatal(c.err)
	}
	if c := charge(ctx, conn, "r-1", 1); !c.replayed() {
		t.Fatalf("within the TTL: %v replayed %v", c.err, c.replayed())
	}
	mr.FastForward(time.Hour + time.Second)
	if c := charge(ctx, conn, "r-1", 1); c.err != nil || c.replayed() || p.runs.Load() != 2 {
		t.Fatalf("after the TTL: %v replayed %v runs %d", c.err, c.replayed(), p.runs.Load())
	}
}

// CheckMethods names every listed method the server would not guard: a
// misspelled one, one of a service not registered, and a streaming one
// (gRPC calls no unary interceptor for it); the served unary methods pass.
func TestCheckMethods(t *testing.T) {
	srv := grpc.NewServer()
	desc := (&payments{}).desc()
	desc.Streams = []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true,
		Handler: func(any, grpc.ServerStream) error { return nil }}}
	srv.RegisterService(desc, &payments{})
	ok := []string{"/" + service + "/Charge", "/" + service + "/Get"}
	if err := grpcx.CheckMethods(srv, ok); err != nil {
		t.Fatalf("served unary methods: %v", err)
	}
	bad := []string{"/" + service + "/charge", "/other.Service/Charge", "/" + service + "/Watch"}
	err := grpcx.CheckMethods(srv, append(ok, bad...))
	if err == nil {
		t.Fatal("CheckMethods accepted methods that run unguarded")
	}
	for _, m := range bad {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("the error does not name %s: %v", m, err)
		}
	}
	if strings.Contains(err.Error(), ok[0]+`"`) {
		t.Errorf("the error names a guarded method: %v", err)
	}
}
