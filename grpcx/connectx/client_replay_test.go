package connectx_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestClientStopsOnReplayedStatus: a server that keeps every code
// (Options.Release storing all, as Stripe stores a 500) replays a stored
// Unavailable, marked Idempotent-Replayed. Asking again can only replay it,
// so the client returns it, as httpx's Transport and grpcx's client do,
// instead of spending its remaining attempts, and their backoff, on
// copies of it.
func TestClientStopsOnReplayedStatus(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{fn: func(context.Context, *connect.Request[structpb.Struct], int64) (*connect.Response[structpb.ListValue], error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("bank down"))
	}}
	var attempts atomic.Int64
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			attempts.Add(1)
			return next(ctx, req)
		}
	})
	keepAll := func(connect.Code) bool { return false }
	srv := serve(t, p, count, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Release: keepAll})))
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})))
	_, err := c.CallUnary(context.Background(), amountReq(1, ""))
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok || ce.Code() != connect.CodeUnavailable || !replayed(ce.Meta()) {
		t.Fatalf("call: %v; want the stored Unavailable, replayed", err)
	}
	if p.runs.Load() != 1 || attempts.Load() != 2 {
		t.Fatalf("handler ran %d times over %d attempts; want 1 run and 2 attempts (the first, then one replay)", p.runs.Load(), attempts.Load())
	}
}
