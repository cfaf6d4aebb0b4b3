package grpcx_test

import (
	"context"
	"testing"
	"time"

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

// TestNestedInterceptorsOneStore: two interceptors of two guard.Guard
// values over one store (a shared chain's and a service's own, with its
// own TTL) chained for one method: the handler runs once, under the outer
// claim, as with one Guard. The inner one met the outer's claim as a call
// in flight and answered Aborted, which released the key: the call never
// ran, however often the client retried.
func TestNestedInterceptorsOneStore(t *testing.T) {
	e := newEnv(t, guard.Options{})
	p := &payments{}
	own := guard.New(e.store, guard.Options{TTL: time.Hour})
	outer := grpcx.UnaryServerInterceptor(e.g, guardOpts(e.t, grpcx.Options{}))
	inner := grpcx.UnaryServerInterceptor(own, guardOpts(e.t, grpcx.Options{}))
	conn := serve(t, p, serveOpts{interceptors: []grpc.UnaryServerInterceptor{recovery, outer, inner}})
	for i := range 2 {
		c := charge(context.Background(), conn, "nest-store-1", 1)
		if c.err != nil || c.replayed() != (i == 1) {
			t.Fatalf("call %d through two Guards' interceptors: %v replayed %v", i+1, c.err, c.replayed())
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
