package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

type authAccountKey struct{}

// authAccountID is the kind of string type an authentication interceptor
// stores (type AccountID string), without a String method.
type authAccountID string

// TestCallerNamedString: grpcx.CallerFromContext's doc says, as
// httpx.TenantFromContext's does, that "a nil name uses the value itself
// when it is a string or a fmt.Stringer". httpx's takes a value of a
// string type of its own (1a0767e); grpcx's (and connectx's, the same
// core) named it "", so every guarded call of an authenticated caller got
// Unauthenticated ("this call names none; authenticate and retry") and
// its handler never ran, where httpx.Guard runs the same request.
func TestCallerNamedString(t *testing.T) {
	caller := grpcx.CallerFromContext[authAccountID](authAccountKey{}, nil)
	if got := caller(context.WithValue(context.Background(), authAccountKey{}, authAccountID("acct_1"))); got != "acct_1" {
		t.Errorf("Caller named %q; want %q (the value, a string)", got, "acct_1")
	}

	// Through the interceptor, with real Redis: the call runs, and its
	// repeat is replayed.
	e := newEnv(t, guard.Options{})
	p := &payments{}
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(context.WithValue(ctx, authAccountKey{}, authAccountID("acct_1")), req)
	}
	ic := grpcx.UnaryServerInterceptor(e.g, guardOpts(t, grpcx.Options{Caller: caller}))
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{recovery, auth, ic}})
	first := charge(context.Background(), conn, "named-1", 1)
	if first.err != nil {
		t.Fatalf("an authenticated caller's call: %v (code %v)", first.err, status.Code(first.err))
	}
	if again := charge(context.Background(), conn, "named-1", 1); again.err != nil || !again.replayed() || p.runs.Load() != 1 {
		t.Fatalf("repeat: %v replayed %v runs %d", again.err, again.replayed(), p.runs.Load())
	}
}
