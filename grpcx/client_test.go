package grpcx_test

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// keysSeen is a server interceptor that records the key of every call.
type keysSeen struct {
	mu   sync.Mutex
	keys []string
}

func (k *keysSeen) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	k.mu.Lock()
	k.keys = append(k.keys, md.Get(grpcx.DefaultMetadata)...)
	k.mu.Unlock()
	return h(ctx, req)
}

func (k *keysSeen) all() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// fastClient retries quickly, for tests.
func fastClient(opts grpcx.ClientOptions) grpc.UnaryClientInterceptor {
	if opts.BaseDelay == 0 {
		opts.BaseDelay = time.Millisecond
	}
	return grpcx.UnaryClientInterceptor(opts)
}

// TestClientRetriesWithOneKey: the client gives a call a UUIDv7 key and
// retries Unavailable with that same key until the server answers; the
// answer comes back with the key it was sent with.
func TestClientRetriesWithOneKey(t *testing.T) {
	seen := &keysSeen{}
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		if n < 3 {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return chargeResponse(ctx, req, n)
	}}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{seen.intercept},
		client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{})}})
	var sent string
	c := charge(context.Background(), conn, "", 1, grpcx.SentKey(&sent))
	if c.err != nil {
		t.Fatal(c.err)
	}
	keys := seen.all()
	if len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] || keys[0] != sent || !uuidV7.MatchString(sent) {
		t.Fatalf("keys sent %q, SentKey %q; want one UUIDv7 three times", keys, sent)
	}
	// A second call gets another key.
	var sent2 string
	if c := charge(context.Background(), conn, "", 1, grpcx.SentKey(&sent2)); c.err != nil || sent2 == sent {
		t.Fatalf("second call: %v, key %q (first %q)", c.err, sent2, sent)
	}
}

// TestClientRetryPolicy: which statuses are retried, how often, and what a
// server's delay does.
func TestClientRetryPolicy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   func(n int64) error
		opts  grpcx.ClientOptions
		calls int64
		code  codes.Code
	}{
		{"InvalidArgument not retried", func(int64) error { return status.Error(codes.InvalidArgument, "no") }, grpcx.ClientOptions{}, 1, codes.InvalidArgument},
		{"Internal not retried", func(int64) error { return status.Error(codes.Internal, "no") }, grpcx.ClientOptions{}, 1, codes.Internal},
		{"FailedPrecondition (a reused key) not retried", func(int64) error { return status.Error(codes.FailedPrecondition, "no") }, grpcx.ClientOptions{}, 1, codes.FailedPrecondition},
		{"Unavailable up to MaxAttempts", func(int64) error { return status.Error(codes.Unavailable, "down") }, grpcx.ClientOptions{MaxAttempts: 4}, 4, codes.Unavailable},
		{"ResourceExhausted retried", func(n int64) error { return errIf(n < 2, codes.ResourceExhausted) }, grpcx.ClientOptions{}, 2, codes.OK},
		{"DeadlineExceeded of the server retried", func(n int64) error { return errIf(n < 2, codes.DeadlineExceeded) }, grpcx.ClientOptions{}, 2, codes.OK},
		{"RetryCodes narrowed", func(int64) error { return status.Error(codes.ResourceExhausted, "no") }, grpcx.ClientOptions{RetryCodes: []codes.Code{codes.Unavailable}}, 1, codes.ResourceExhausted},
		{"RetryCodes empty retries nothing", func(int64) error { return status.Error(codes.Unavailable, "down") }, grpcx.ClientOptions{RetryCodes: []codes.Code{}}, 1, codes.Unavailable},
		{"RetryInfo longer than MaxRetryDelay ends the retries", func(int64) error { return retryIn(codes.Unavailable, time.Hour) }, grpcx.ClientOptions{}, 1, codes.Unavailable},
		{"RetryInfo honoured", func(n int64) error { return retryIfIn(n < 3, codes.Unavailable, 10*time.Millisecond) }, grpcx.ClientOptions{}, 3, codes.OK},
		{"negative pushback stops", func(int64) error { return status.Error(codes.Unavailable, "down") }, grpcx.ClientOptions{}, 1, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
				if tc.name == "negative pushback stops" {
					_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "-1"))
				}
				if err := tc.err(n); err != nil {
					return nil, err
				}
				return chargeResponse(ctx, req, n)
			}}
			conn := serve(t, p, serveOpts{client: []grpc.UnaryClientInterceptor{fastClient(tc.opts)}})
			start := time.Now()
			c := charge(context.Background(), conn, "", 1)
			if status.Code(c.err) != tc.code || p.runs.Load() != tc.calls {
				t.Fatalf("%v after %d calls, want %v after %d", c.err, p.runs.Load(), tc.code, tc.calls)
			}
			if tc.name == "RetryInfo honoured" && time.Since(start) < 20*time.Millisecond {
				t.Fatalf("two retries after RetryInfo 10 ms took %s", time.Since(start))
			}
		})
	}
}

func errIf(fail bool, c codes.Code) error {
	if fail {
		return status.Error(c, "transient")
	}
	return nil
}

func retryIn(c codes.Code, d time.Duration) error {
	st, _ := status.New(c, "later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

func retryIfIn(fail bool, c codes.Code, d time.Duration) error {
	if fail {
		return retryIn(c, d)
	}
	return nil
}

// TestClientKeySources: a key the caller put in the metadata, or in the
// context (WithIdempotencyKey), is sent instead of a new one; a malformed
// context key is refused before anything is sent; methods outside
// ClientOptions.Methods get no key and no retries.
func TestClientKeySources(t *testing.T) {
	seen := &keysSeen{}
	p := &payments{}
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{seen.intercept},
		client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{Methods: []string{chargeName}})}})
	ctx := context.Background()
	var sent string
	if c := charge(ctx, conn, "mine", 1, grpcx.SentKey(&sent)); c.err != nil || sent != "mine" {
		t.Fatalf("metadata key: %v, sent %q", c.err, sent)
	}
	if c := charge(grpcx.WithIdempotencyKey(ctx, "step-key"), conn, "", 1, grpcx.SentKey(&sent)); c.err != nil || sent != "step-key" {
		t.Fatalf("context key: %v, sent %q", c.err, sent)
	}
	before := p.runs.Load()
	if c := charge(grpcx.WithIdempotencyKey(ctx, "a key"), conn, "", 1); status.Code(c.err) != codes.InvalidArgument || p.runs.Load() != before {
		t.Fatalf("malformed context key: %v, runs %d → %d", c.err, before, p.runs.Load())
	}
	if c := invoke(ctx, conn, getName, "", amountReq(1)); c.err != nil {
		t.Fatal(c.err)
	}
	if keys := seen.all(); len(keys) != 2 || keys[0] != "mine" || keys[1] != "step-key" {
		t.Fatalf("keys the server saw: %q (Get must carry none)", keys)
	}
}

// TestClientInFlight: a duplicate answered Aborted with ReasonKeyInUse is
// asked about again after the RetryInfo delay, without counting attempts,
// and gets the replay once the first call is done; past MaxInFlightWait it
// gets the Aborted status.
func TestClientInFlight(t *testing.T) {
	e := newEnv(t, guard.Options{})
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	inFlight := atomic.Int64{}
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		entered <- struct{}{}
		<-release
		return chargeResponse(ctx, req, n)
	}}
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if grpcx.Reason(err) == grpcx.ReasonKeyInUse {
			if inFlight.Add(1) == 3 {
				close(release) // the duplicate asked three times: let the first finish
			}
		}
		return resp, err
	}
	g := grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{}))
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{count, g},
		client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{MaxAttempts: 1, InFlightDelay: 20 * time.Millisecond})}})
	ctx := context.Background()
	first := make(chan call, 1)
	go func() { first <- charge(ctx, conn, "i-1", 1) }()
	<-entered
	dup := charge(ctx, conn, "i-1", 1)
	f := <-first
	if f.err != nil || dup.err != nil || !dup.replayed() || !proto.Equal(f.resp, dup.resp) || p.runs.Load() != 1 || inFlight.Load() < 3 {
		t.Fatalf("first %v; duplicate %v replayed %v; runs %d; in-flight answers %d", f.err, dup.err, dup.replayed(), p.runs.Load(), inFlight.Load())
	}

	// Past MaxInFlightWait the Aborted status comes back.
	release2, entered2 := make(chan struct{}), make(chan struct{}, 1)
	p2 := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		entered2 <- struct{}{}
		<-release2
		return chargeResponse(ctx, req, n)
	}}
	conn2 := serve(t, p2, serveOpts{interceptors: []grpc.UnaryServerInterceptor{grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{}))},
		client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{InFlightDelay: 20 * time.Millisecond, MaxInFlightWait: 100 * time.Millisecond})}})
	go func() { first <- charge(ctx, conn2, "i-2", 1) }()
	<-entered2
	dup = charge(ctx, conn2, "i-2", 1)
	close(release2)
	<-first
	if grpcx.Reason(dup.err) != grpcx.ReasonKeyInUse {
		t.Fatalf("past MaxInFlightWait: %v", dup.err)
	}
}

// TestClientStopsAtDeadline: a retry that would start after the call's
// deadline is not made; a cancelled context stops the waiting.
func TestClientStopsAtDeadline(t *testing.T) {
	p := &payments{fn: func(context.Context, *structpb.Struct, int64) (*structpb.ListValue, error) {
		return nil, retryIn(codes.Unavailable, 5*time.Second)
	}}
	conn := serve(t, p, serveOpts{client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{})}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	c := charge(ctx, conn, "", 1)
	if status.Code(c.err) != codes.Unavailable || p.runs.Load() != 1 || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("%v after %d calls and %s; want the first Unavailable at once", c.err, p.runs.Load(), time.Since(start))
	}
}

// dropper closes every connection its listener accepted: a response in
// flight is lost, as when a network drops it.
type dropper struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dropper) Accept() (net.Conn, error) {
	c, err := d.Listener.Accept()
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *dropper) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}

// TestClientEmptyMetadataKey: a call whose key metadata is there but
// empty (a key copied from where there was none) has no key: it gets the
// context's key or a fresh one in place of the empty value, and every
// attempt carries that one key. (The empty value was taken for the
// caller's key and retried: a server reading an empty key as none ran the
// call on every attempt, and a guarded one refused it as malformed.)
func TestClientEmptyMetadataKey(t *testing.T) {
	for _, ctxKey := range []string{"", "step-key"} {
		t.Run("context key "+strconv.Quote(ctxKey), func(t *testing.T) {
			seen := &keysSeen{}
			p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
				if n < 2 {
					return nil, status.Error(codes.Unavailable, "try again")
				}
				return chargeResponse(ctx, req, n)
			}}
			conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{seen.intercept},
				client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{})}})
			ctx := metadata.AppendToOutgoingContext(context.Background(), grpcx.DefaultMetadata, "")
			if ctxKey != "" {
				ctx = grpcx.WithIdempotencyKey(ctx, ctxKey)
			}
			var sent string
			if c := charge(ctx, conn, "", 1, grpcx.SentKey(&sent)); c.err != nil {
				t.Fatal(c.err)
			}
			keys := seen.all()
			want := ctxKey != "" && sent == ctxKey || ctxKey == "" && uuidV7.MatchString(sent)
			if !want || len(keys) != 2 || keys[0] != sent || keys[1] != sent {
				t.Fatalf("keys sent %q, SentKey %q; want two attempts, each with one key: the context's, or a fresh UUIDv7", keys, sent)
			}
		})
	}
}
