package connectx_test

import (
	"context"
	"slices"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestOuterHeaderNotStored: a header field an interceptor outside the
// guard set before the call (through the call info) is not the handler's
// and is not stored; when the handler adds a value under the same name,
// only the handler's value is stored. (Both were, and the replay sent the
// outer interceptor's value twice: once from the interceptor, once
// stored.)
func TestOuterHeaderNotStored(t *testing.T) {
	g := newGuard(t, "")
	outer := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
				info.ResponseHeader().Add("Server-Timing", "auth;dur=1")
			}
			return next(ctx, req)
		}
	})
	p := &payments{fn: func(ctx context.Context, req *connect.Request[structpb.Struct], n int64) (*connect.Response[structpb.ListValue], error) {
		if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
			info.ResponseHeader().Add("Server-Timing", "db;dur=2")
		}
		return response(req, n)
	}}
	srv := serve(t, p, outer, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	c := newClient(srv)
	res1, err := c.CallUnary(context.Background(), amountReq(5, "outer-header"))
	if err != nil {
		t.Fatal(err)
	}
	res2, err := c.CallUnary(context.Background(), amountReq(5, "outer-header"))
	if err != nil {
		t.Fatal(err)
	}
	if !replayed(res2.Header()) || p.runs.Load() != 1 {
		t.Fatalf("not a replay: runs %d, header %v", p.runs.Load(), res2.Header())
	}
	first, again := res1.Header().Values("Server-Timing"), res2.Header().Values("Server-Timing")
	t.Logf("first %q, replay %q", first, again)
	if !slices.Equal(first, again) {
		t.Errorf("Server-Timing: first call %q, replay %q: the outer interceptor's value was stored as the handler's and is sent twice", first, again)
	}
}
