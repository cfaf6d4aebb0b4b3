package guard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestWaitKeepsPaceToTheEnd: a Wait whose Timeout passes while the key is
// held keeps its documented pace (reads 10 ms, doubling to 100 ms apart,
// with up to a fifth of jitter) to the end: for 300 ms, reads at about
// 10, 30, 70, 150 and 250 ms, and one last look readGrace (10 ms) before
// the deadline; 12 is a generous bound. Once less than readGrace was
// left, each next delay was 0: Wait read the record back to back, as fast
// as Redis answered, until the deadline (39 to 53 reads).
func TestWaitKeepsPaceToTheEnd(t *testing.T) {
	s := &getTimes{callCounter: callCounter{Store: realStore(t)}}
	g := guard.New(s, guard.Options{Lease: time.Minute})
	key := guard.Key{Scope: "wait-pace", ID: t.Name() + time.Now().Format("150405.000000000")}
	holdKey(t, g, key)
	for round := range 3 {
		s.gets.Store(0)
		s.claims.Store(0)
		s.reset()
		_, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: 300 * time.Millisecond})
		if _, busy := errors.AsType[*guard.InProgressError](err); !busy {
			t.Fatalf("round %d: Wait = %v, want *InProgressError", round, err)
		}
		gets := s.gets.Load()
		t.Logf("round %d: %d reads, %d claims in a 300 ms wait", round, gets, s.claims.Load())
		if gets > 12 {
			t.Logf("round %d: reads at %v", round, s.offsets())
			t.Fatalf("round %d: Wait made %d reads of a held key in a 300 ms wait, want about 6 (documented pace: 10 ms doubling to 100 ms)", round, gets)
		}
	}
}

// getTimes is a callCounter that notes when each read was made.
type getTimes struct {
	callCounter
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
}

func (g *getTimes) reset() {
	g.mu.Lock()
	g.start, g.at = time.Now(), nil
	g.mu.Unlock()
}

func (g *getTimes) Get(ctx context.Context, k guard.Key) (guard.Record, error) {
	g.mu.Lock()
	g.at = append(g.at, time.Since(g.start).Round(100*time.Microsecond))
	g.mu.Unlock()
	return g.callCounter.Get(ctx, k)
}

func (g *getTimes) offsets() []time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Duration(nil), g.at...)
}
