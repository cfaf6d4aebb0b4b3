package grpcx_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestClientStopsOnReplayedStatus: a server that keeps every status
// (Options.Release storing all codes, as Stripe stores a 500) replays a
// stored Unavailable with "idempotent-replayed: true". Asking again can
// only replay it, so the client, like httpx's Transport, returns the
// replayed answer instead of spending its remaining attempts (and their
// backoff, or the status's RetryInfo) on copies of it.
func TestClientStopsOnReplayedStatus(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{fn: func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.ListValue, error) {
		return nil, status.Error(codes.Unavailable, "bank down")
	}}
	var attempts atomic.Int64
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		attempts.Add(1)
		return h(ctx, req)
	}
	keepAll := func(codes.Code) bool { return false }
	conn := serve(t, p, serveOpts{
		interceptors: []grpc.UnaryServerInterceptor{count, grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{Release: keepAll}))},
		client:       []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{})},
	})
	c := charge(context.Background(), conn, "", 1)
	if status.Code(c.err) != codes.Unavailable || !c.replayed() {
		t.Fatalf("call: %v, replayed %v; want the stored Unavailable, replayed", c.err, c.replayed())
	}
	if p.runs.Load() != 1 || attempts.Load() != 2 {
		t.Fatalf("handler ran %d times over %d attempts; want 1 run and 2 attempts (the first, then one replay)",
			p.runs.Load(), attempts.Load())
	}
}
