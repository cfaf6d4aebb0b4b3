package otelx_test

import (
	"context"
	"fmt"
	"runtime/metrics"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/otelx"
)

// goroutinesCreated is how many goroutines the process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestNoGoroutinePerStoreCall: the traced store of a fallback.Store over a
// store that honours deadlines (its calls but claims run inline, each
// bounded by a context derived from guard's) adds no goroutine to Do: as
// many start per Do as through the fallback.Store alone (one, its claim's).
// The span's context hid the AfterFunc of guard's context, and the context
// package started a goroutine for each derived one: two more per Do.
func TestNoGoroutinePerStoreCall(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	fb, err := fallback.New(guardenv.StoreOn(t, c, guard.RedisOptions{}), fallback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	perDo := func(name string, s guard.Store) float64 {
		g := guard.New(s, guard.Options{})
		const n = 100
		before := goroutinesCreated()
		for i := range n {
			key := guard.Key{Scope: "goroutines", ID: fmt.Sprint(name, i)}
			if _, err := g.Do(context.Background(), key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }); err != nil {
				t.Fatal(err)
			}
		}
		return float64(goroutinesCreated()-before) / n
	}
	alone := perDo("alone", fb)
	for _, tp := range []struct {
		name string
		tr   *otelx.Tracer
	}{
		{"noop", otelx.New(otelx.Options{TracerProvider: noop.NewTracerProvider()})},
		{"sdk", newTraced(t, otelx.Options{}).tr},
	} {
		if per := perDo(tp.name, tp.tr.Store(fb)); per > alone+0.5 {
			t.Errorf("%s: %.2f goroutines started per Do through the traced store, %.2f through the fallback.Store alone; want no more", tp.name, per, alone)
		}
	}
}
