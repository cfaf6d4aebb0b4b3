package connectx_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/idemguard/idemguard/grpcx/connectx"
)

type authAccountKey struct{}

// authAccountID is the kind of string type an authentication interceptor
// stores (type AccountID string), without a String method.
type authAccountID string

// TestCallerNamedString: connectx.CallerFromContext, as
// grpcx's and httpx.TenantFromContext's docs say, uses a value that is a
// string itself. httpx's takes a value of a string type of its own; this
// one named it "", and every guarded call of an authenticated caller got
// CodeUnauthenticated without its handler running.
func TestCallerNamedString(t *testing.T) {
	g := newGuard(t, "")
	p := &payments{}
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			return next(context.WithValue(ctx, authAccountKey{}, authAccountID("acct_1")), req)
		}
	})
	caller := connectx.CallerFromContext[authAccountID](authAccountKey{}, nil)
	srv := serve(t, p, auth, connectx.NewInterceptor(g, guardOpts(t, connectx.Options{Caller: caller})))
	c := newClient(srv)
	if _, err := c.CallUnary(context.Background(), amountReq(1, "named-1")); err != nil {
		t.Fatalf("an authenticated caller's call: %v", err)
	}
	res, err := c.CallUnary(context.Background(), amountReq(1, "named-1"))
	if err != nil || !replayed(res.Header()) || p.runs.Load() != 1 {
		t.Fatalf("repeat: %v runs %d", err, p.runs.Load())
	}
}
