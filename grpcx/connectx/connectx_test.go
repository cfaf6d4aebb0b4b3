package connectx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const charge = "/idemguard.test.Payments/Charge"

// payments is the test handler: it counts its runs and answers each with a
// response no other run gives; fn, when set, replaces it.
type payments struct {
	runs atomic.Int64
	fn   func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error)
}

func (p *payments) charge(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.ListValue], error) {
	n := p.runs.Add(1)
	if p.fn != nil {
		return p.fn(ctx, req, n)
	}
	return response(req, n)
}

func response(req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
	msg, err := structpb.NewList([]any{float64(n), time.Now().Format(time.RFC3339Nano), req.Msg.GetFields()["amount"].GetNumberValue()})
	if err != nil {
		return nil, err
	}
	res := connect.NewResponse(msg)
	res.Header().Set("X-Charge", strconv.FormatInt(n, 10))
	res.Header().Set("Set-Cookie", "session=secret")
	res.Trailer().Set("X-Ledger", fmt.Sprintf("entry-%d", n))
	return res, nil
}

// env is one test's guard on the shared real Redis.
func newGuard(t testing.TB, prefix string) *guard.Guard {
	t.Helper()
	if prefix == "" {
		prefix = testenv.Prefix(t)
	}
	store := guardenv.Store(t, guard.RedisOptions{Prefix: prefix})
	return guard.New(store, guard.Options{})
}

func guardOpts(t testing.TB, opts connectx.Options) connectx.Options {
	if opts.Procedures == nil {
		opts.Procedures = []string{charge}
	}
	if opts.Caller == nil {
		opts.SingleCaller = true
	}
	if opts.Logger == nil {
		opts.Logger = testenv.Logger(t)
	}
	return opts
}

// serve starts p's Charge behind the interceptors on an HTTP/2 (TLS)
// loopback server.
func serve(t testing.TB, p *payments, interceptors ...connect.Interceptor) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(charge, connect.NewUnaryHandler(charge, p.charge, connect.WithInterceptors(interceptors...),
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, v any) error {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("panic: %v", v))
		})))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	return srv
}

func newClient(srv *httptest.Server, opts ...connect.ClientOption) *connect.Client[structpb.Struct, structpb.ListValue] {
	return connect.NewClient[structpb.Struct, structpb.ListValue](srv.Client(), srv.URL+charge, opts...)
}

func amountReq(amount float64, key string) *connect.Request[structpb.Struct] {
	msg, _ := structpb.NewStruct(map[string]any{"amount": amount, "currency": "eur"})
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set(connectx.DefaultHeader, key)
	}
	return req
}

func replayed(h http.Header) bool { return h.Get(connectx.ReplayedHeader) == "true" }

// TestReplayProtocols: over each protocol and codec a Connect handler
// speaks, a repeat gets the first response, its header (without
// Set-Cookie) and trailer, and Idempotent-Replayed: true; the handler runs
// once per key.
func TestReplayProtocols(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	for i, tc := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect", nil},
		{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
		{"grpc", []connect.ClientOption{connect.WithGRPC()}},
		{"grpc-web+json", []connect.ClientOption{connect.WithGRPCWeb(), connect.WithProtoJSON()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(srv, tc.opts...)
			key := "k-" + tc.name
			first, err := c.CallUnary(context.Background(), amountReq(100, key))
			if err != nil {
				t.Fatal(err)
			}
			second, err := c.CallUnary(context.Background(), amountReq(100, key))
			if err != nil {
				t.Fatal(err)
			}
			if replayed(first.Header()) || !replayed(second.Header()) {
				t.Fatalf("replayed: first %v second %v", replayed(first.Header()), replayed(second.Header()))
			}
			if !proto.Equal(first.Msg, second.Msg) {
				t.Fatalf("replay %v, want %v", second.Msg, first.Msg)
			}
			if second.Header().Get("X-Charge") != first.Header().Get("X-Charge") || second.Trailer().Get("X-Ledger") != first.Trailer().Get("X-Ledger") ||
				second.Trailer().Get("X-Ledger") == "" {
				t.Fatalf("metadata: header %v trailer %v, first %v %v", second.Header(), second.Trailer(), first.Header(), first.Trailer())
			}
			if first.Header().Get("Set-Cookie") == "" || second.Header().Get("Set-Cookie") != "" {
				t.Fatalf("Set-Cookie: first %q replay %q", first.Header().Get("Set-Cookie"), second.Header().Get("Set-Cookie"))
			}
			if p.runs.Load() != int64(i+1) {
				t.Fatalf("runs %d, want %d", p.runs.Load(), i+1)
			}
		})
	}
	// Connect's unary protocol sends the message as the body: the replay's
	// bytes are the first response's.
	a, _ := postRaw(t, srv, "raw-1")
	b, h := postRaw(t, srv, "raw-1")
	if !bytes.Equal(a, b) || !replayed(h) {
		t.Fatalf("raw replay %x (replayed %v), want %x", b, replayed(h), a)
	}
}

// TestStatuses: reuse, in flight, bad keys, and the store unreachable,
// as Connect errors with grpcx's reasons.
func TestStatuses(t *testing.T) {
	g := newGuard(t, "")
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
		if req.Msg.GetFields()["block"].GetBoolValue() {
			entered <- struct{}{}
			<-release
		}
		return response(req, n)
	}}
	srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	c := newClient(srv)
	ctx := context.Background()
	check := func(name string, err error, code connect.Code, reason string) {
		t.Helper()
		if connect.CodeOf(err) != code || connectx.Reason(err) != reason {
			t.Errorf("%s: %v (reason %q), want %v %q", name, err, connectx.Reason(err), code, reason)
		}
	}
	if _, err := c.CallUnary(ctx, amountReq(1, "s-1")); err != nil {
		t.Fatal(err)
	}
	_, err := c.CallUnary(ctx, amountReq(2, "s-1"))
	check("reuse", err, connect.CodeFailedPrecondition, "IDEMPOTENCY_KEY_REUSED")

	blocking := amountReq(1, "s-2")
	blocking.Msg.Fields["block"] = structpb.NewBoolValue(true)
	first := make(chan error, 1)
	go func() { _, err := c.CallUnary(ctx, blocking); first <- err }()
	<-entered
	dup := amountReq(1, "s-2")
	dup.Msg.Fields["block"] = structpb.NewBoolValue(true)
	_, err = c.CallUnary(ctx, dup)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	check("in flight", err, connect.CodeAborted, "IDEMPOTENCY_KEY_IN_USE")
	if d, ok := connectx.RetryDelay(err); !ok || d <= 0 || d > time.Second {
		t.Errorf("in flight RetryInfo %v %v", d, ok)
	}

	_, err = c.CallUnary(ctx, amountReq(1, ""))
	check("missing", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_MISSING")
	_, err = c.CallUnary(ctx, amountReq(1, "a key"))
	check("malformed", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_MALFORMED")
	two := amountReq(1, "a")
	two.Header().Add(connectx.DefaultHeader, "b")
	_, err = c.CallUnary(ctx, two)
	check("two", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_MALFORMED")
	if p.runs.Load() != 2 {
		t.Fatalf("runs %d, want 2", p.runs.Load())
	}

	func() {
		defer func() {
			if recover() == nil {
				t.Error("NewInterceptor without a caller choice did not panic")
			}
		}()
		connectx.NewInterceptor(g, connectx.Options{Procedures: []string{charge}})
	}()
}

// TestErrors: a stored error replays with its code, message, details and
// metadata; a released code runs the handler again; a panic releases.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      func() error
		released bool
	}{
		{"InvalidArgument stored", func() error {
			ce := connect.NewError(connect.CodeInvalidArgument, errors.New("card declined"))
			d, _ := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "card"}}})
			ce.AddDetail(d)
			ce.Meta().Set("X-Why", "declined")
			return ce
		}, false},
		{"Unavailable released", func() error { return connect.NewError(connect.CodeUnavailable, errors.New("bank down")) }, true},
		{"plain error released", func() error { return errors.New("oops") }, true},
		{"panic released", func() error { panic("boom") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, "")
			p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
				return nil, tc.err()
			}}
			srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
			c := newClient(srv, connect.WithGRPC())
			_, err1 := c.CallUnary(context.Background(), amountReq(1, "e-1"))
			_, err2 := c.CallUnary(context.Background(), amountReq(1, "e-1"))
			if err1 == nil || err2 == nil {
				t.Fatalf("errors %v %v", err1, err2)
			}
			if tc.released {
				if p.runs.Load() != 2 {
					t.Fatalf("runs %d, want 2 (released)", p.runs.Load())
				}
				return
			}
			a, b := errors.AsType[*connect.Error](err1)
			c2, _ := errors.AsType[*connect.Error](err2)
			if !b || p.runs.Load() != 1 || c2.Code() != a.Code() || c2.Message() != a.Message() || len(c2.Details()) != 1 ||
				c2.Details()[0].Type() != "google.rpc.BadRequest" || c2.Meta().Get("X-Why") != "declined" || !replayed(c2.Meta()) {
				t.Fatalf("runs %d; replayed error %v details %d meta %v; first %v", p.runs.Load(), c2, len(c2.Details()), c2.Meta(), a)
			}
		})
	}
}

var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestDroppedResponse: the effect happens and is stored, then every client
// connection is closed before the response goes out; the client
// interceptor retries with the same key and gets the replay: one effect.
func TestDroppedResponse(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	var srv *httptest.Server
	var attempts, dropped atomic.Int64
	var keys sync.Map
	drop := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			attempts.Add(1)
			keys.Store(req.Header().Get(connectx.DefaultHeader), true)
			res, err := next(ctx, req)
			if err == nil && dropped.Add(1) == 1 {
				srv.CloseClientConnections() // the answer is lost
			}
			return res, err
		}
	})
	srv = serve(t, p, drop, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	for _, proto := range []string{"connect", "grpc"} {
		var opts []connect.ClientOption
		if proto == "grpc" {
			opts = append(opts, connect.WithGRPC())
		}
		opts = append(opts, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Millisecond})))
		c := newClient(srv, opts...)
		dropped.Store(0)
		before, beforeRuns := attempts.Load(), p.runs.Load()
		req := amountReq(1, "")
		res, err := c.CallUnary(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		key := req.Header().Get(connectx.DefaultHeader)
		if p.runs.Load()-beforeRuns != 1 || attempts.Load()-before != 2 || !replayed(res.Header()) || !uuidV7.MatchString(key) {
			t.Fatalf("%s: effects %d attempts %d replayed %v key %q", proto, p.runs.Load()-beforeRuns, attempts.Load()-before, replayed(res.Header()), key)
		}
	}
	n := 0
	keys.Range(func(any, any) bool { n++; return true })
	if n != 2 {
		t.Fatalf("%d keys over two calls of two attempts each, want 2", n)
	}
}

// TestClientRetries: the client retries the codes it should with one key,
// honours RetryInfo, and not the codes it should not.
func TestClientRetries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  connect.Code
		retry time.Duration
		calls int64
	}{
		{"Unavailable", connect.CodeUnavailable, 0, 3},
		{"Unavailable with RetryInfo", connect.CodeUnavailable, 10 * time.Millisecond, 3},
		// Not the caller's cancel: connect-go reports a connection reset
		// mid-answer so (TestDroppedResponse met it).
		{"Canceled, the caller's context alive", connect.CodeCanceled, 0, 3},
		{"InvalidArgument", connect.CodeInvalidArgument, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys sync.Map
			p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
				keys.Store(req.Header().Get(connectx.DefaultHeader), true)
				if n < 3 {
					ce := connect.NewError(tc.code, errors.New("transient"))
					if tc.retry > 0 {
						d, _ := connect.NewErrorDetail(retryInfo(tc.retry))
						ce.AddDetail(d)
					}
					return nil, ce
				}
				return response(req, n)
			}}
			srv := serve(t, p)
			c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Millisecond})))
			start := time.Now()
			_, err := c.CallUnary(context.Background(), amountReq(1, ""))
			if p.runs.Load() != tc.calls || (tc.calls == 3) != (err == nil) {
				t.Fatalf("%v after %d calls", err, p.runs.Load())
			}
			n := 0
			keys.Range(func(any, any) bool { n++; return true })
			if n != 1 {
				t.Fatalf("%d keys over the attempts", n)
			}
			if tc.retry > 0 && time.Since(start) < 2*tc.retry {
				t.Fatalf("two retries after RetryInfo %s took %s", tc.retry, time.Since(start))
			}
		})
	}
	// A key from the context is sent; a malformed one is refused before
	// anything is sent.
	p := &payments{}
	srv := serve(t, p)
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	req := amountReq(1, "")
	if _, err := c.CallUnary(connectx.WithIdempotencyKey(context.Background(), "step-key"), req); err != nil || req.Header().Get(connectx.DefaultHeader) != "step-key" {
		t.Fatalf("context key: %v, sent %q", err, req.Header().Get(connectx.DefaultHeader))
	}
	// It is told as the server's refusal is (Reason), and by errors.Is.
	_, err := c.CallUnary(connectx.WithIdempotencyKey(context.Background(), "a key"), amountReq(1, ""))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || p.runs.Load() != 1 {
		t.Fatalf("malformed context key: %v, runs %d", err, p.runs.Load())
	}
	if !errors.Is(err, grpcx.ErrMalformedKey) || connectx.Reason(err) != grpcx.ReasonKeyMalformed {
		t.Fatalf("malformed context key: %v, reason %q; want ErrMalformedKey and %s", err, connectx.Reason(err), grpcx.ReasonKeyMalformed)
	}
}

// TestStorm: 1,000 keys × 8 copies over two Connect servers, each with its
// own Redis client, store and guard on one real Redis, through the client
// interceptor, 256 calls in flight: each key's effect (5 ms) happens
// exactly once, and every copy gets the same response.
func TestStorm(t *testing.T) {
	const keys, copies, inFlight = 1000, 8, 256
	prefix := testenv.Prefix(t)
	var effects [keys]atomic.Int64
	var clients []*connect.Client[structpb.Struct, structpb.ListValue]
	for range 2 {
		p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
			effects[int(req.Msg.GetFields()["order"].GetNumberValue())].Add(1)
			time.Sleep(5 * time.Millisecond) // the effect itself
			return response(req, n)
		}}
		srv := serve(t, p, connectx.NewInterceptor(newGuard(t, prefix), guardOpts(t, connectx.Options{})))
		clients = append(clients, newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{MaxAttempts: 10}))))
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	answers := make([][]*structpb.ListValue, keys)
	for k := range answers {
		answers[k] = make([]*structpb.ListValue, copies)
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range inFlight {
		wg.Go(func() {
			for j := range jobs {
				k, cp := j/copies, j%copies
				req := amountReq(100, run+"-"+strconv.Itoa(k))
				req.Msg.Fields["order"] = structpb.NewNumberValue(float64(k))
				res, err := clients[cp%2].CallUnary(context.Background(), req)
				if err != nil {
					t.Errorf("key %d copy %d: %v", k, cp, err)
					continue
				}
				answers[k][cp] = res.Msg
			}
		})
	}
	for j := range keys * copies {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	var twice, wrong int
	for k := range keys {
		if effects[k].Load() != 1 {
			twice++
		}
		for _, a := range answers[k][1:] {
			if !proto.Equal(a, answers[k][0]) {
				wrong++
			}
		}
	}
	t.Logf("%d keys × %d copies over two Connect servers, %d in flight, 5 ms effect: %s", keys, copies, inFlight, time.Since(start).Round(time.Millisecond))
	if twice != 0 || wrong != 0 {
		t.Fatalf("%d keys whose effect did not happen exactly once; %d answers differ from their key's first", twice, wrong)
	}
}

// TestCaller: keys are kept per caller.
func TestCaller(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	type userKey struct{}
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if u := req.Header().Get("X-User"); u != "" {
				ctx = context.WithValue(ctx, userKey{}, u)
			}
			return next(ctx, req)
		}
	})
	srv := serve(t, p, auth, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Caller: connectx.CallerFromContext[string](userKey{}, nil)})))
	c := newClient(srv)
	as := func(user string) *connect.Request[structpb.Struct] {
		r := amountReq(1, "c-1")
		if user != "" {
			r.Header().Set("X-User", user)
		}
		return r
	}
	for _, u := range []string{"alice", "bob", "alice", "bob"} {
		if _, err := c.CallUnary(context.Background(), as(u)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.CallUnary(context.Background(), as(""))
	if p.runs.Load() != 2 || connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("runs %d (want 2), no caller: %v", p.runs.Load(), err)
	}
}

func retryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

// TestSimpleHandler: a handler with the "simple" signature sets its header
// and trailer through the call info; the replay carries them, and not what
// an interceptor outside the guard set there.
func TestSimpleHandler(t *testing.T) {
	g := newGuard(t, "")
	var runs atomic.Int64
	outer := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
				info.ResponseHeader().Set("X-Request-Id", strconv.FormatInt(time.Now().UnixNano(), 10))
			}
			return next(ctx, req)
		}
	})
	h := connect.NewUnaryHandlerSimple(charge, func(ctx context.Context, req *structpb.Struct) (*structpb.ListValue, error) {
		n := runs.Add(1)
		info, _ := connect.CallInfoForHandlerContext(ctx)
		info.ResponseHeader().Set("X-Charge", strconv.FormatInt(n, 10))
		info.ResponseTrailer().Set("X-Ledger", "entry")
		return structpb.NewList([]any{float64(n)})
	}, connect.WithInterceptors(outer, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{}))))
	mux := http.NewServeMux()
	mux.Handle(charge, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { srv.Client().CloseIdleConnections(); srv.Close() })
	c := newClient(srv, connect.WithGRPC())
	first, err := c.CallUnary(context.Background(), amountReq(1, "simple-1"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.CallUnary(context.Background(), amountReq(1, "simple-1"))
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || !replayed(second.Header()) || second.Header().Get("X-Charge") != "1" || second.Trailer().Get("X-Ledger") != "entry" ||
		second.Header().Get("X-Request-Id") == first.Header().Get("X-Request-Id") || len(second.Header().Values("X-Request-Id")) != 1 {
		t.Fatalf("runs %d; replay header %v trailer %v; first header %v", runs.Load(), second.Header(), second.Trailer(), first.Header())
	}
}
