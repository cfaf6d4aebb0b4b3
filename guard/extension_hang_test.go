package guard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
)

// An effect that returns well within its lease while the heartbeat's
// extension hangs on the wire (a client that waits out its read timeout
// whatever the context says, go-redis's default) has its result stored
// before the lease runs out: the write that ends the run does not wait for
// the extension the guard has given up on. (It did: the server's lease ran
// out while Do waited, a duplicate took the key over and ran the effect a
// second time, and the first holder's completion was refused.) The
// extension, reaching Redis after the completion, is refused there; that
// refusal is no lost lease and is not observed as one.
func TestCompletionNotHeldBehindHungExtension(t *testing.T) {
	const lease = 600 * time.Millisecond
	observer, lost := lossCounter(t)
	extStarted, extEnded := make(chan struct{}), make(chan error, 1)
	h := &hooked{Store: realStore(t), onWire: true,
		beforeExtend: func(context.Context, int32) {
			close(extStarted)
			// No answer until the client's read timeout, past the lease.
			<-time.After(3 * lease)
		},
		afterExtend: func(_ int32, err error) { extEnded <- err },
	}
	g := guard.New(h, guard.Options{Lease: lease, Observer: observer})
	other := guard.New(h.Store, guard.Options{Lease: lease})
	key := guard.Key{Scope: "hung-extension", ID: t.Name()}
	running := goleak.IgnoreCurrent()

	var ran atomic.Int32
	var returnedAt, deadline time.Time
	stopDup, dupDone := make(chan struct{}), make(chan struct{})
	_, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		ran.Add(1)
		deadline = l.Deadline
		<-extStarted // the first extension, a third of a lease in, hangs
		go func() {  // a duplicate delivery, retried while the key is in progress
			defer close(dupDone)
			for {
				select {
				case <-stopDup:
					return
				default:
				}
				if _, err := other.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
					ran.Add(1)
					return []byte("second"), nil
				}); err == nil {
					return
				}
				<-time.After(5 * time.Millisecond)
			}
		}()
		returnedAt = time.Now()
		return []byte("first"), nil
	})
	doneAt := time.Now()
	close(stopDup)
	<-dupDone
	if returnedAt.After(deadline) {
		t.Fatalf("the effect returned %s after its deadline: the test proves nothing", returnedAt.Sub(deadline))
	}
	t.Logf("the effect returned %s before its deadline; Do returned %s after the effect", deadline.Sub(returnedAt), doneAt.Sub(returnedAt))
	if err != nil {
		t.Errorf("Do = %v: the result of an effect that returned within its lease was not stored", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the effect ran %d times for one key", n)
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "first" {
		t.Errorf("record = %+v, %v; want the first holder's result completed", rec, err)
	}

	t.Logf("the hung extension ended: %v", <-extEnded)
	goleak.VerifyNone(t, running) // the heartbeat's goroutine has ended too
	if n := lost.Load(); n != 0 {
		t.Errorf("%d EventLeaseLost observed for a run whose result was stored", n)
	}
}

// hangingRound is a real batch store whose first round of extensions hangs
// on the wire (reaching Redis only after a read timeout past the leases,
// whatever its context says); its other calls go through.
type hangingRound struct {
	*guard.RedisStore
	hang    time.Duration
	started chan struct{} // closed as the first round begins
	ended   chan struct{} // closed as it has reached Redis
	once    sync.Once
}

func (h *hangingRound) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	first := false
	if len(ws) > 0 && ws[0].Kind == guard.WriteExtend {
		h.once.Do(func() { first = true })
	}
	if !first {
		return h.RedisStore.WriteBatch(ctx, ws)
	}
	close(h.started)
	defer close(h.ended)
	<-time.After(h.hang)
	return h.RedisStore.WriteBatch(context.WithoutCancel(ctx), ws)
}

// DoBatch, likewise: its writes do not wait for a round of extensions
// under way, and the round's late refusals are not observed.
func TestDoBatchCompletionNotHeldBehindHungExtensions(t *testing.T) {
	const lease = 600 * time.Millisecond
	observer, lost := lossCounter(t)
	s := &hangingRound{RedisStore: realStore(t), hang: 3 * lease, started: make(chan struct{}), ended: make(chan struct{})}
	g := guard.New(s, guard.Options{Lease: lease, Observer: observer})
	other := guard.New(s.RedisStore, guard.Options{Lease: lease})
	items := batchItems("hung-round/"+t.Name(), 2)
	running := goleak.IgnoreCurrent()

	var ran [2]atomic.Int32
	stopDup, dupDone := make(chan struct{}), make(chan struct{})
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		ran[i].Add(1)
		if i == 0 {
			<-s.started
			go func() { // duplicates of both, retried while in progress
				defer close(dupDone)
				for j := 0; j < len(items); {
					select {
					case <-stopDup:
						return
					default:
					}
					if _, err := other.Do(bg, items[j].Key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
						ran[j].Add(1)
						return []byte("second"), nil
					}); err == nil {
						j++
						continue
					}
					<-time.After(5 * time.Millisecond)
				}
			}()
			if time.Now().After(l.Deadline) {
				t.Fatalf("item 0 returned %s after its deadline: the test proves nothing", time.Since(l.Deadline))
			}
		}
		return []byte("first"), nil
	}, guard.BatchOptions{Concurrency: 2})
	close(stopDup)
	<-dupDone
	for i, r := range res {
		if r.Err != nil {
			t.Errorf("item %d: %v: the result of an effect that returned within its lease was not stored", i, r.Err)
		}
		if n := ran[i].Load(); n != 1 {
			t.Errorf("item %d: the effect ran %d times", i, n)
		}
	}
	<-s.ended
	goleak.VerifyNone(t, running)
	if n := lost.Load(); n != 0 {
		t.Errorf("%d EventLeaseLost observed for runs whose results were stored", n)
	}
}

// lossCounter is an Observer that counts the EventLeaseLost it hears, and
// logs each.
func lossCounter(t *testing.T) (guard.Observer, *atomic.Int64) {
	var lost atomic.Int64
	return guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventLeaseLost {
			lost.Add(1)
			t.Logf("observed: %v", e.Err)
		}
	}), &lost
}
