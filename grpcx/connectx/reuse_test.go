package connectx_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestReusedRequestIsARetry pins what NewClientInterceptor says of a
// request sent again: the key it generated stays in the request's header,
// so the same *connect.Request is a retry of its first call (replayed;
// refused once its message changed), and a new call needs a new request
// or the header deleted.
func TestReusedRequestIsARetry(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	srv := serve(t, p, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{})))
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	ctx := context.Background()

	req := amountReq(10, "")
	if _, err := c.CallUnary(ctx, req); err != nil {
		t.Fatal(err)
	}
	key := req.Header().Get(connectx.DefaultHeader)
	if !uuidV7.MatchString(key) {
		t.Fatalf("key in the header after the call: %q", key)
	}
	res, err := c.CallUnary(ctx, req)
	if err != nil || !replayed(res.Header()) || p.runs.Load() != 1 || req.Header().Get(connectx.DefaultHeader) != key {
		t.Fatalf("the same request again: %v, replayed %v, runs %d; want the first call replayed", err, res != nil && replayed(res.Header()), p.runs.Load())
	}
	// A context key does not replace the one the request carries.
	if res, err := c.CallUnary(connectx.WithIdempotencyKey(ctx, "other-key"), req); err != nil || !replayed(res.Header()) || p.runs.Load() != 1 {
		t.Fatalf("the same request with a context key: %v, runs %d", err, p.runs.Load())
	}
	req.Msg.Fields["amount"] = structpb.NewNumberValue(20)
	if _, err := c.CallUnary(ctx, req); connect.CodeOf(err) != connect.CodeFailedPrecondition || connectx.Reason(err) != "IDEMPOTENCY_KEY_REUSED" || p.runs.Load() != 1 {
		t.Fatalf("the same request with another message: %v, runs %d; want the key refused as reused", err, p.runs.Load())
	}
	req.Header().Del(connectx.DefaultHeader)
	if res, err := c.CallUnary(ctx, req); err != nil || replayed(res.Header()) || p.runs.Load() != 2 || req.Header().Get(connectx.DefaultHeader) == key {
		t.Fatalf("the header deleted: %v, runs %d, key %q; want a new call with a new key", err, p.runs.Load(), req.Header().Get(connectx.DefaultHeader))
	}
}
