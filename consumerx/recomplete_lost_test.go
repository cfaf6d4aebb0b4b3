package consumerx_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// loseOnComplete is a Redis store whose first completion of a run
// (Complete, or a WriteComplete of WriteBatch) finds that Redis lost the
// record meanwhile and answers as an unreachable store would: the
// record is deleted and the write refused with ErrUnavailable, unsent.
// The Processor then tries the completion again itself, and the store
// answers it ErrLeaseLost: the run's lease is gone.
type loseOnComplete struct {
	*guard.RedisStore
	rdb   redis.UniversalClient
	armed atomic.Bool
}

func (s *loseOnComplete) lose(ctx context.Context, l guard.Lease) error {
	if err := s.rdb.Del(ctx, s.Name(l.Key)).Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: test: connection reset before the completion was sent", guard.ErrUnavailable)
}

func (s *loseOnComplete) Complete(ctx context.Context, l guard.Lease, result []byte, ttl time.Duration) error {
	if s.armed.CompareAndSwap(true, false) {
		return s.lose(ctx, l)
	}
	return s.RedisStore.Complete(ctx, l, result, ttl)
}

func (s *loseOnComplete) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	if len(ws) == 1 && ws[0].Kind == guard.WriteComplete && s.armed.CompareAndSwap(true, false) {
		return []error{s.lose(ctx, ws[0].Lease)}
	}
	return s.RedisStore.WriteBatch(ctx, ws)
}

// TestRecompleteLeaseLostObserved: a handler succeeded, the store
// refused its completion for a moment (the Observer hears
// EventUnavailable), and the Processor's own retry of the completion
// (recomplete) is refused because the run's lease is gone: the effect
// ran, is not recorded, and runs again on the next delivery. The
// Observer must hear that lease lost (promx's lease_lost, the Logger's
// Warn line), as it does when the guard's own completion is refused so;
// the retry's success is observed (EventCompleted), its refusal was not:
// the metrics showed one unavailable store call and nothing lost.
// Through Process and ProcessBatch; and for a handler that returned
// after the heartbeat had found (and the Observer heard) the loss, no
// second EventLeaseLost.
func TestRecompleteLeaseLostObserved(t *testing.T) {
	rdb := testenv.Redis(t)
	st := &loseOnComplete{RedisStore: guardenv.StoreOn(t, rdb, guard.RedisOptions{}), rdb: rdb}
	var mu sync.Mutex
	heard := map[string][]guard.EventKind{}
	obs := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		mu.Lock()
		heard[e.Key.ID] = append(heard[e.Key.ID], e.Kind)
		mu.Unlock()
	})
	g := guard.New(st, guard.Options{Lease: 300 * time.Millisecond, Observer: obs})
	p := newProcessor(t, g, "obs-recomplete", consumerx.Options{})
	// quick returns at once; late waits until the heartbeat has found
	// the lease lost (and observed it) before it returns: the refused
	// retry then adds no second EventLeaseLost.
	quick := func(context.Context, consumerx.Message) error { return nil }
	late := func(ctx context.Context, msg consumerx.Message) error {
		k := guard.Key{Scope: consumerx.ScopePrefix + "obs-recomplete", ID: msg.ID}
		if err := rdb.Del(ctx, st.Name(k)).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	for _, c := range []struct {
		batch bool
		h     consumerx.Handler
		name  string
	}{{false, quick, "quick"}, {true, quick, "quick"}, {false, late, "late"}, {true, late, "late"}} {
		batch, h := c.batch, c.h
		msg := consumerx.Message{ID: fmt.Sprintf("order-%v-%s", batch, c.name), Payload: []byte("charge")}
		st.armed.Store(true)
		var (
			o   consumerx.Outcome
			err error
		)
		if batch {
			r := p.ProcessBatch(context.Background(), []consumerx.Message{msg}, h, consumerx.BatchOptions{})[0]
			o, err = r.Outcome, r.Err
		} else {
			o, err = p.Process(context.Background(), msg, h)
		}
		if st.armed.Load() {
			t.Fatalf("batch %v: the completion was not refused: the test tests nothing", batch)
		}
		if o != consumerx.Failed || err == nil {
			t.Fatalf("batch %v: %s, %v; want Failed (ran, not recorded)", batch, o, err)
		}
		mu.Lock()
		kinds := heard[msg.ID]
		mu.Unlock()
		lost := 0
		for _, k := range kinds {
			if k == guard.EventLeaseLost {
				lost++
			}
		}
		if lost != 1 {
			t.Errorf("batch %v, %s handler: the Observer heard %v: %d EventLeaseLost, want 1", batch, c.name, kinds, lost)
		}
	}
}
