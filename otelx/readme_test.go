package otelx_test

// The README's tracing snippet, verbatim (TestSnippetsInTests in internal/testenv checks that
// it still is), run.

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/otelx"
)

func readmeTracing(ctx context.Context, store guard.Store, key guard.Key, fingerprint string, charge guard.Func) (guard.Result, error) {
	tr := otelx.New(otelx.Options{}) // the global TracerProvider, or Options.TracerProvider
	g := guard.New(tr.Store(store), guard.Options{Observer: tr})
	res, err := g.Do(ctx, key, fingerprint, tr.Func(charge))
	return res, err
}

// TestReadmeTracing runs the snippet. It leaves the global TracerProvider
// alone (other tests share it): that spans are made is otelx_test.go's.
func TestReadmeTracing(t *testing.T) {
	charge := func(ctx context.Context, lease guard.Lease) ([]byte, error) { return []byte("ch_1"), nil }
	store := memstore.New(memstore.Options{})
	key := guard.Key{Scope: "charges", ID: "order-7"}
	for _, replayed := range []bool{false, true} {
		res, err := readmeTracing(context.Background(), store, key, "fp", charge)
		if err != nil || string(res.Value) != "ch_1" || res.Replayed != replayed {
			t.Fatalf("Do: %q replayed=%v, %v; want ch_1 replayed=%v", res.Value, res.Replayed, err, replayed)
		}
	}
}
