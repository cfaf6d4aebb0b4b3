package grpcx_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx"
)

// TestClientMessageSizeNotRetried: gRPC's message-size limits answer
// ResourceExhausted, which the client interceptor retries by default, but
// a retry cannot get under them: the same request is as large, and the
// guard replays the same stored response. A response larger than the
// client accepts (MaxCallRecvMsgSize) and a request larger than it may
// send (MaxCallSendMsgSize) are returned after one attempt; a
// ResourceExhausted of the server's own is still retried
// (TestClientRetryPolicy).
func TestClientMessageSizeNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  grpc.CallOption
		runs int64
	}{
		{"response over MaxCallRecvMsgSize", grpc.MaxCallRecvMsgSize(16), 1},
		{"request over MaxCallSendMsgSize", grpc.MaxCallSendMsgSize(8), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var attempts atomic.Int64
			count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				attempts.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			p := &payments{fn: chargeResponse}
			conn := serve(t, p, serveOpts{client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{}), count}})
			c := charge(context.Background(), conn, "", 1, tc.opt)
			if st := status.Convert(c.err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
				t.Fatalf("got %v, want gRPC's ResourceExhausted for the size", c.err)
			}
			if n := attempts.Load(); n != 1 || p.runs.Load() != tc.runs {
				t.Fatalf("%d attempts, %d runs; want 1 attempt, %d runs", n, p.runs.Load(), tc.runs)
			}
		})
	}
}
