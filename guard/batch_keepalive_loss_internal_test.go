package guard

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// hangingExtendRounds is a real store whose batches of extensions reach
// no server until release is closed, whatever their context says (as
// go-redis without ContextTimeoutEnabled waits out its read timeout).
type hangingExtendRounds struct {
	*RedisStore
	entered chan struct{}
	release chan struct{}
}

func (h *hangingExtendRounds) WriteBatch(ctx context.Context, ws []Write) []error {
	if len(ws) > 0 && ws[0].Kind == WriteExtend {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return h.RedisStore.WriteBatch(ctx, ws)
}

// TestBeatLossObservedBeforeHaltReturns: a lease the batch heartbeat
// found lost is observed before halt returns (the batch's write then does
// not observe it again). A late timer callback found lease 0 past its
// MaxRun in the call that started the others' extensions, and held the
// loss's event across that round: halt returned, and DoBatch with it,
// before the Observer heard it, or never while the round hung (found by
// review).
// heardEvents is an Observer that keeps every event it hears.
type heardEvents struct {
	mu     sync.Mutex
	events []Event
}

func (h *heardEvents) Observe(_ context.Context, e Event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// heard reports whether an event of kind for key was heard.
func (h *heardEvents) heard(kind EventKind, key Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.events {
		if e.Kind == kind && e.Key == key {
			return true
		}
	}
	return false
}

func TestBeatLossObservedBeforeHaltReturns(t *testing.T) {
	const lease = 3 * time.Second
	obs := &heardEvents{}
	rs := NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)})
	s := &hangingExtendRounds{RedisStore: rs, entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(s.release) // the hanging round answers once the test is done
	g := New(s, Options{Lease: lease, MaxRun: 20 * time.Millisecond, Observer: obs})
	ctx := context.Background()
	var leases [2]Lease
	for i := range leases {
		out, err := g.Claim(ctx, Key{Scope: "beat-loss", ID: []string{"a", "b"}[i]}, "fp")
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = out.Lease
	}
	b := g.newBeat(ctx, s, 2, func(i int) *Lease { return &leases[i] })
	defer b.stop()

	// Hold the timer back (a late callback), then start lease 0's effect.
	b.mu.Lock()
	b.stopped = true
	b.timer.Stop()
	b.mu.Unlock()
	if _, err := b.begin(0); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	maxRun, next := b.held[0].maxRun, b.next
	b.mu.Unlock()
	testenv.WaitFor(t, 5*time.Second, "MaxRun of lease 0 and the first extension to be due", func() bool {
		now := time.Now()
		return now.After(maxRun) && now.After(next)
	})
	if time.Now().After(leases[0].Deadline) {
		t.Fatal("the machine was too slow: the first deadline passed before the late firing")
	}

	// The late timer callback.
	b.mu.Lock()
	b.stopped = false
	b.mu.Unlock()
	go b.fire()
	<-s.entered // lease 0 lost (MaxRun), lease 1's extension under way and hanging

	b.halt() // as segment does once every effect has returned
	if !b.lossObserved(0) {
		t.Fatal("setup: lease 0 not found lost by the heartbeat")
	}
	if !obs.heard(EventLeaseLost, leases[0].Key) {
		t.Errorf("halt returned, lossObserved(0) = true (the batch's write will not observe it), "+
			"but the Observer has not heard EventLeaseLost for %s: it waits in fire until the hanging extension round answers", leases[0].Key)
	}
}

// corruptExtends answers every batch of extensions with ErrCorrupt, as a
// record overwritten under a running holder would.
type corruptExtends struct {
	*RedisStore
	answered chan struct{}
}

func (c *corruptExtends) WriteBatch(ctx context.Context, ws []Write) []error {
	if len(ws) == 0 || ws[0].Kind != WriteExtend {
		return c.RedisStore.WriteBatch(ctx, ws)
	}
	errs := make([]error, len(ws))
	for i, w := range ws {
		errs[i] = fmt.Errorf("%w: extend %s: test", ErrCorrupt, w.Lease.Key)
	}
	select {
	case c.answered <- struct{}{}:
	default:
	}
	return errs
}

// TestBeatObservesCorruptExtension: an extension the store answers with
// ErrCorrupt is observed as EventCorrupt by the batch heartbeat, as Do's
// heartbeat observes it (only ErrUnavailable was).
func TestBeatObservesCorruptExtension(t *testing.T) {
	obs := &heardEvents{}
	s := &corruptExtends{RedisStore: NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)}), answered: make(chan struct{}, 1)}
	g := New(s, Options{Lease: 300 * time.Millisecond, Observer: obs})
	key := Key{Scope: "beat-corrupt", ID: "a"}
	g.DoBatch(context.Background(), []BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, _ Lease) ([]byte, error) {
		<-s.answered // an extension was answered
		// The heartbeat reads the answer after the store returned it: the
		// effect returns once it did (a batch that ended first halts the
		// heartbeat, and an answer after that changes nothing, by design).
		testenv.WaitFor(t, 10*time.Second, "EventCorrupt observed", func() bool { return obs.heard(EventCorrupt, key) })
		return nil, nil
	}, BatchOptions{})
	if !obs.heard(EventCorrupt, key) {
		t.Errorf("events %v: no EventCorrupt for the extension answered corrupt", obs.events)
	}
}
