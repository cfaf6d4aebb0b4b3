package otelx_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/otelx"
)

// TestContract runs the store contract over Tracer.Store wrapping a
// RedisStore on the real server: the wrapper is a guard.Store (and a
// StepStore and BatchStore, as its store is: forwarding checks it) and
// must keep every rule.
func TestContract(t *testing.T) {
	c := testenv.Redis(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := otelx.New(otelx.Options{TracerProvider: tp})
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			return forwarding(t, tr.Store(guardenv.StoreOn(t, c, guard.RedisOptions{})))
		},
		Advance:  storetest.Wait,
		Parallel: true,
	})
}

// forwarding returns s, the wrapper of a RedisStore, after checking that
// it is a guard.BatchStore, a guard.StepStore and a guard.DeadlineStore
// as the RedisStore is: Run skips its batch cases over a store without
// batches, so a wrapper that hid them would pass the contract untested.
func forwarding(t *testing.T, s guard.Store) guard.Store {
	t.Helper()
	_, batches := s.(guard.BatchStore)
	_, steps := s.(guard.StepStore)
	_, deadline := s.(guard.DeadlineStore)
	if !batches || !steps || !deadline {
		t.Fatalf("%T over a RedisStore: a BatchStore %t, a StepStore %t, a DeadlineStore %t; want all", s, batches, steps, deadline)
	}
	return s
}
