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
// StepStore and BatchStore, as its store is) and must keep every rule.
func TestContract(t *testing.T) {
	c := testenv.Redis(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := otelx.New(otelx.Options{TracerProvider: tp})
	storetest.Run(t, storetest.Harness{
		New:     func(t *testing.T) guard.Store { return tr.Store(guardenv.StoreOn(t, c, guard.RedisOptions{})) },
		Advance: storetest.Wait,
	})
}
