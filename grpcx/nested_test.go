package grpcx_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/idemguard/idemguard/grpcx"
	"github.com/idemguard/idemguard/guard"
)

// TestNestedInterceptor: the interceptor chained twice for one method, on
// one guard.Guard (a shared chain and a service's own): the handler runs
// once, under the outer claim, and the repeat is replayed. The inner one
// used to meet the outer's claim as a call in flight and answer Aborted,
// for every call.
func TestNestedInterceptor(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	ic := grpcx.UnaryServerInterceptor(e.g, guardOpts(e.t, grpcx.Options{}))
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{recovery, ic, ic}})
	for i := range 2 {
		c := charge(context.Background(), conn, "nest-1", 1)
		if c.err != nil || c.replayed() != (i == 1) {
			t.Fatalf("call %d through two interceptors: %v replayed %v", i+1, c.err, c.replayed())
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
