package guard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestCorruptObserved: a record that cannot be read (here a value that is
// no record) is an EventCorrupt for the Observer, with the error, on
// Do's path and DoBatch's: nothing runs, and an operator counting
// outcomes (promx) or reading the log (metrics) sees the key, where
// before only the store's latency histogram counted an error.
func TestCorruptObserved(t *testing.T) {
	s := guardenv.Store(t, guard.RedisOptions{})
	var mu sync.Mutex
	var seen []guard.Event
	g := guard.New(s, guard.Options{Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, e)
	})})
	ctx := context.Background()
	key := guard.Key{Scope: "corrupt-observed", ID: t.Name()}
	if err := s.Client().Set(ctx, s.Name(key), "garbage", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	ran := false
	effect := func(context.Context, guard.Lease) ([]byte, error) { ran = true; return nil, nil }
	if _, err := g.Do(ctx, key, "fp", effect); !errors.Is(err, guard.ErrCorrupt) {
		t.Fatalf("Do on a corrupt record: %v", err)
	}
	res := g.DoBatch(ctx, []guard.BatchItem{{Key: key, Fingerprint: "fp"}},
		func(context.Context, int, guard.Lease) ([]byte, error) { ran = true; return nil, nil }, guard.BatchOptions{})
	if !errors.Is(res[0].Err, guard.ErrCorrupt) {
		t.Fatalf("DoBatch on a corrupt record: %v", res[0].Err)
	}
	if ran {
		t.Fatal("an effect ran on a corrupt record")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("events %v, want one EventCorrupt each for Do and DoBatch", seen)
	}
	for _, e := range seen {
		if e.Kind != guard.EventCorrupt || e.Key != key || !errors.Is(e.Err, guard.ErrCorrupt) {
			t.Fatalf("event %+v (%s), want EventCorrupt for %s with the error", e, e.Kind, key)
		}
	}
}
