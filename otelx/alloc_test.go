package otelx_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/otelx"
)

// TestNoRecordingCostsLittle: where spans are not recorded (a noop
// TracerProvider: the global one before the service sets its own, or a
// span the sampler drops), a traced store's call, and a traced effect,
// allocate no more than the span's context over the call's own: no key
// digest, no attributes. A store call allocated 7 to 12 times more, and
// took some 2µs more, the effect 6 times.
func TestNoRecordingCostsLittle(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	tr := otelx.New(otelx.Options{TracerProvider: noop.NewTracerProvider()})
	traced := tr.Store(ms)
	ctx := context.Background()
	key := guard.Key{Scope: "alloc", ID: "key-1"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	out, err := ms.Claim(ctx, req)
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	other := req
	other.Token = "B" // answered in progress
	for name, call := range map[string]func(s guard.Store){
		"claim":  func(s guard.Store) { _, _ = s.Claim(ctx, other) },
		"extend": func(s guard.Store) { _ = s.Extend(ctx, out.Lease, time.Hour) },
		"failed": func(s guard.Store) { _ = s.Release(ctx, guard.Lease{Key: key, Token: "B"}) },
	} {
		own := testing.AllocsPerRun(200, func() { call(ms) })
		through := testing.AllocsPerRun(200, func() { call(traced) })
		if through > own+1 {
			t.Errorf("%s: %.0f allocations through the traced store, %.0f by the store", name, through, own)
		}
	}

	// The traced effect, as the traced store's calls.
	effect := func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }
	tracedEffect := tr.Func(effect)
	own := testing.AllocsPerRun(200, func() { _, _ = effect(ctx, out.Lease) })
	through := testing.AllocsPerRun(200, func() { _, _ = tracedEffect(ctx, out.Lease) })
	if through > own+1 {
		t.Errorf("effect: %.0f allocations traced, %.0f alone", through, own)
	}
}
