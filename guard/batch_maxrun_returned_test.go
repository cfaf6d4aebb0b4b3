package guard_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestBatchMaxRunStopsAtReturn: "A lease whose effect has
// returned stays held, and extended, until the batch's writes end the
// claims: MaxRun no longer counts for it" (beat's doc comment; DoBatch:
// "The leases ... of items whose effect has returned, are extended with
// the others until the batch's writes end them"). Item 0 returns at
// once; item 1, run after it, outlasts its own MaxRun and then the lease
// (an effect that ignores its context). Item 0's lease must not be taken
// as lost at its MaxRun (no EventLeaseLost for a key whose result is
// stored) and must be extended until its completion, which then succeeds:
// no other claim can take the key meanwhile, and the key then replays. Item 1's own lost lease
// is the only one observed. Kills mutant N03 (beat.finish without
// `b.held[i].maxRun = time.Time{}`): item 0's lease was then lost at its
// MaxRun, observed so, and no longer extended: once it ran out in Redis
// another claim took the key while the batch still held it.
func TestBatchMaxRunStopsAtReturn(t *testing.T) {
	const lease = 2 * time.Second
	var (
		mu   sync.Mutex
		lost []guard.Key
	)
	obs := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventLeaseLost {
			mu.Lock()
			lost = append(lost, e.Key)
			mu.Unlock()
		}
	})
	s := realStore(t)
	g := guard.New(s, guard.Options{Lease: lease, MaxRun: 50 * time.Millisecond, Observer: obs})
	other := guard.New(s, guard.Options{Lease: lease})
	items := batchItems("mut-maxrun-returned", 2)
	var ran [2]atomic.Int32
	fn := func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		ran[i].Add(1)
		if i == 1 {
			<-ctx.Done() // its own MaxRun: the heartbeat has passed item 0's MaxRun too
			if !errors.Is(context.Cause(ctx), guard.ErrMaxRun) {
				t.Errorf("item 1's context ended with %v, want ErrMaxRun", context.Cause(ctx))
			}
			time.Sleep(lease + lease/4) // ignores its context, past the lease
			// Item 0's claim must still hold its key: its result is yet to
			// be written.
			out, err := other.Claim(bg, items[0].Key, "fp")
			if err == nil && out.Status == guard.Acquired {
				t.Errorf("another claim took item 0's key (attempt %d) while the batch still held it: its effect would run twice", out.Lease.Attempt)
				_ = other.Release(bg, out.Lease)
			}
		}
		return []byte("v"), nil
	}
	res := g.DoBatch(bg, items, fn, guard.BatchOptions{})
	mu.Lock()
	for _, k := range lost {
		if k == items[0].Key {
			t.Errorf("item 0's lease was observed lost after its effect had returned (MaxRun counted for it): %v", lost)
		}
	}
	mu.Unlock()
	if res[0].Err != nil {
		t.Errorf("item 0, returned at once: %v, want its result stored", res[0].Err)
	}
	again := g.DoBatch(bg, items[:1], fn, guard.BatchOptions{})
	if again[0].Err != nil || !again[0].Replayed || ran[0].Load() != 1 {
		t.Errorf("item 0 again: replayed %v, err %v (its effect ran %d times), want a replay of the first run", again[0].Replayed, again[0].Err, ran[0].Load())
	}
}
