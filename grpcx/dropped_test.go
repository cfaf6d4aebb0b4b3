package grpcx_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestDroppedResponse: the effect happens and its response is stored, but
// the connection drops before the response reaches the client (every
// server-side connection is closed after the guarded handler returned).
// The client interceptor sees Unavailable, retries with the same key over
// a new connection, and gets the stored response, replayed: the effect
// happened exactly once. Over bufconn and over real TCP on loopback.
func TestDroppedResponse(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		name := "bufconn"
		if tcp {
			name = "tcp"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			p := &payments{}
			d := &dropper{}
			var dropped, attempts atomic.Int64
			drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				attempts.Add(1)
				resp, err := h(ctx, req)
				if err == nil && dropped.Add(1) == 1 {
					d.drop() // the effect is done and stored; its answer is lost
				}
				return resp, err
			}
			var firstErr atomic.Value
			observe := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				return err
			}
			conn := serve(t, p, serveOpts{
				tcp:          tcp,
				wrap:         func(l net.Listener) net.Listener { d.Listener = l; return d },
				interceptors: []grpc.UnaryServerInterceptor{drop, grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{}))},
				// The retrying interceptor outside, the observer inside:
				// it sees each attempt.
				client: []grpc.UnaryClientInterceptor{fastClient(grpcx.ClientOptions{}), observe},
			})
			var key string
			c := charge(context.Background(), conn, "", 100, grpcx.SentKey(&key))
			if c.err != nil {
				t.Fatalf("call: %v (attempts %d)", c.err, attempts.Load())
			}
			lost, _ := firstErr.Load().(error)
			if status.Code(lost) != codes.Unavailable {
				t.Fatalf("the lost response gave %v, want Unavailable", lost)
			}
			if p.runs.Load() != 1 || attempts.Load() != 2 || !c.replayed() {
				t.Fatalf("effects %d, attempts %d, replayed %v; want 1 effect, 2 attempts, the second replayed",
					p.runs.Load(), attempts.Load(), c.replayed())
			}
			// The replay is the stored response of the one effect.
			again := charge(context.Background(), conn, key, 100)
			if again.err != nil || !proto.Equal(again.resp, c.resp) || p.runs.Load() != 1 {
				t.Fatalf("again: %v %v (runs %d)", again.err, again.resp, p.runs.Load())
			}
			t.Logf("lost response: %v; retried with key %s and replayed", lost, key)
		})
	}
}
