package connectx_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

// TestOwnKeyUnderLowerCaseName: a request that carries its own
// key under a header map entry spelled in lower case
// (req.Header()["idempotency-key"], as code that copies gRPC-style
// metadata or a map[string]string of headers sets it) is a call with a
// key. httpx.Transport sends it as the one field of the canonical name
// (TestOwnKeyUnderLowerCaseName, 1a0767e). The connectx client looked the
// key up by its canonical name only, added a fresh UUIDv7 beside it, and
// the guard answered every attempt InvalidArgument ("2 Idempotency-Key
// values"): the caller's key never honoured, the handler never run.
func TestOwnKeyUnderLowerCaseName(t *testing.T) {
	p := &payments{}
	srv := serve(t, p, connectx.NewInterceptor(newGuard(t, ""), guardOpts(t, connectx.Options{})))
	c := newClient(srv, connect.WithInterceptors(connectx.NewClientInterceptor(connectx.ClientOptions{})))
	for i := range 2 {
		req := amountReq(1, "")
		req.Header()["idempotency-key"] = []string{"order-42"}
		res, err := c.CallUnary(context.Background(), req)
		if err != nil {
			t.Fatalf("call %d with the caller's own key: %v (reason %q)", i+1, err, connectx.Reason(err))
		}
		if replayed(res.Header()) != (i == 1) {
			t.Fatalf("call %d: replayed %v", i+1, replayed(res.Header()))
		}
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1 under the caller's key", p.runs.Load())
	}
}
