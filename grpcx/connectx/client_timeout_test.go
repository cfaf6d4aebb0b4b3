package connectx_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestHTTPClientTimeoutNotRetried: a caller that bounds its calls with
// http.Client.Timeout gets CodeDeadlineExceeded once that bound passes.
// The interceptor retried it as the server's deadline, each retry with
// a fresh bound, then asked about the key in flight until
// MaxInFlightWait: the call outlived the caller's bound tenfold (found by
// review).
func TestHTTPClientTimeoutNotRetried(t *testing.T) {
	g := newGuard(t, "")
	release := make(chan struct{})
	done := sync.OnceFunc(func() { close(release) })
	t.Cleanup(done)
	p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
		<-release
		return response(req, n)
	}}
	srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	hc := *srv.Client()
	hc.Timeout = 200 * time.Millisecond
	c := connect.NewClient[structpb.Struct, structpb.ListValue](&hc, srv.URL+charge,
		connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{MaxInFlightWait: 2 * time.Second})))
	ctx := connectx.WithIdempotencyKey(context.Background(), "timeout-1")
	start := time.Now()
	_, err := c.CallUnary(ctx, amountReq(1, ""))
	took := time.Since(start)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded || took > time.Second {
		t.Errorf("a call with a 200 ms http.Client.Timeout: %v after %s; want CodeDeadlineExceeded at the bound", err, took)
	}
	// The first attempt goes on on the server; it ends before the test.
	done()
	testenv.WaitFor(t, 10*time.Second, "the first attempt completed", func() bool {
		rec, err := g.Get(context.Background(), guard.Key{Scope: charge, ID: "timeout-1"})
		return err == nil && rec.State == guard.StateCompleted
	})
}
