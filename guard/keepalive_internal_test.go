package guard

import (
	"context"
	"errors"
	"testing"
	"time"
)

// queueGuard is a Guard with only what its claim queue uses: the queue
// calls no store.
func queueGuard() *Guard {
	opts := Options{}.withDefaults()
	return &Guard{claims: newClaimQueue(), opts: opts, validity: opts.Lease - LeaseMargin(opts.Lease)}
}

// claimDone waits up to a generous bound for the claim context of k to
// end, and returns its error.
func claimDone(t *testing.T, k *keepalive) error {
	t.Helper()
	select {
	case <-(*callCtx)(k).Done():
		return (*callCtx)(k).Err()
	case <-time.After(5 * time.Second):
		t.Fatal("the claim's context did not end at its bound")
		return nil
	}
}

// A claim that joins the queue ahead of one sent earlier (a goroutine
// that read the clock, then waited to join) still ends at its own bound:
// the queue's one timer is moved for it, and the later claim behind it is
// not ended with it.
func TestClaimQueueEarlierBoundJoinsLater(t *testing.T) {
	g := queueGuard()
	now := time.Now()
	later := g.newKeepalive(context.Background(), now.Add(time.Hour))
	later.claim()
	defer later.stop()
	sooner := g.newKeepalive(context.Background(), now.Add(30*time.Millisecond))
	sooner.claim()
	defer sooner.stop()

	if err := claimDone(t, sooner); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the claim ended with %v, want context.DeadlineExceeded", err)
	}
	if !sooner.timedOut() {
		t.Error("a claim ended at its bound does not report it timed out")
	}
	if err := (*callCtx)(later).Err(); err != nil || later.timedOut() {
		t.Errorf("a claim bounded an hour later ended with the earlier one: %v", err)
	}
	later.stop()
	g.claims.mu.Lock()
	defer g.claims.mu.Unlock()
	if l := g.claims.lists[bounds]; l.head != nil || l.tail != nil {
		t.Error("the queue still holds claims that ended")
	}
}

// A claim at the head of the queue that is answered (leaves) does not
// take the timer with it: the claim behind it still ends at its bound.
func TestClaimQueueBoundAfterHeadLeaves(t *testing.T) {
	g := queueGuard()
	now := time.Now()
	head := g.newKeepalive(context.Background(), now.Add(20*time.Millisecond))
	head.claim()
	next := g.newKeepalive(context.Background(), now.Add(60*time.Millisecond))
	next.claim()
	defer next.stop()
	head.stop() // answered
	if err := (*callCtx)(head).Err(); !errors.Is(err, context.Canceled) || head.timedOut() {
		t.Errorf("an answered claim: Err %v, timed out %v; want context.Canceled, not timed out", err, head.timedOut())
	}
	if err := claimDone(t, next); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the claim ended with %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(now); took < 60*time.Millisecond {
		t.Errorf("the claim ended after %s, before its bound", took)
	}
}

// A claim of Do whose caller's context can be cancelled is answered
// without a watch of it when the answer comes within claimWatchDelay;
// one still under way then watches it, and ends as soon as the caller
// gives up. Err reports the caller's cancellation at once either way.
func TestClaimWatchesCallerOnlyWhenSlow(t *testing.T) {
	g := queueGuard()
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	claim := func() (*keepalive, context.Context) {
		k := g.newKeepalive(parent, time.Now().Add(g.validity))
		c := k.claimContext()
		k.claim()
		return k, c
	}
	fast, _ := claim()
	fast.stop() // answered at once
	slow, sctx := claim()
	defer slow.stop()
	watched := func(k *keepalive) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.unwatch != nil
	}
	for start := time.Now(); !watched(slow); {
		if time.Since(start) > 10*time.Second {
			t.Fatal("a claim under way past claimWatchDelay does not watch its caller")
		}
		time.Sleep(time.Millisecond)
	}
	if watched(fast) {
		t.Error("a claim answered at once watched its caller")
	}
	if sctx.Err() != nil {
		t.Fatal("the claim's context ended before its caller gave up")
	}
	cancel()
	select {
	case <-sctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the claim's context did not end with its caller's")
	}
	if !errors.Is(sctx.Err(), context.Canceled) || slow.timedOut() {
		t.Errorf("the claim's context ended with %v (timed out %v), want the caller's context.Canceled", sctx.Err(), slow.timedOut())
	}

	// A claim sent after its caller gave up: Err says so at once, and
	// Done agrees.
	k, c := claim()
	defer k.stop()
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("the claim's context of a caller that gave up: Err %v, want context.Canceled", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Error("the claim's context: Err is not nil, but Done is open")
	}
}

// A claim that watched its caller and then ran into its bound stops the
// watch: a caller's context that lives on (a consumer's) does not keep a
// registration for every claim that timed out.
func TestClaimTimedOutStopsWatch(t *testing.T) {
	g := queueGuard()
	g.opts.Lease = time.Second
	g.validity = g.opts.Lease - LeaseMargin(g.opts.Lease)
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := g.newKeepalive(parent, time.Now().Add(g.validity))
	c := k.claimContext()
	k.claim()
	defer k.stop()
	if err := claimDone(t, k); !errors.Is(err, context.DeadlineExceeded) || c.Err() != err {
		t.Fatalf("the claim ended with %v, want context.DeadlineExceeded", err)
	}
	k.mu.Lock()
	unwatch := k.unwatch
	k.mu.Unlock()
	if unwatch == nil {
		t.Fatal("a claim under way for a second did not watch its caller")
	}
	if unwatch() {
		t.Error("a claim that timed out still watched its caller")
	}
}

// queueHolds reports which of g's claim queue lists still hold a
// keepalive.
func queueHolds(g *Guard) []int {
	g.claims.mu.Lock()
	defer g.claims.mu.Unlock()
	var held []int
	for i, l := range g.claims.lists {
		if l.head != nil || l.tail != nil {
			held = append(held, i)
		}
	}
	return held
}

// A run that ends before its first extension, and its write, are kept by
// the claim queue: no timer of their own; the keepalive moves from the
// queue's bounds to its runs as the run starts, stays there through the
// write, and leaves the queue when it stops.
func TestShortRunCostsNoTimer(t *testing.T) {
	g := queueGuard()
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := g.newKeepalive(parent, time.Now().Add(g.validity))
	_ = k.claimContext()
	k.claim()
	if !k.start(Lease{}) {
		t.Fatal("the run did not start")
	}
	g.claims.mu.Lock()
	in := k.q[0].in && k.list0 == runs && !k.q[1].in
	g.claims.mu.Unlock()
	if !in || k.timer != nil {
		t.Fatalf("running: in the queue's runs only %v, timer %v; want true, nil", in, k.timer)
	}
	_ = k.detach()
	if k.timer != nil {
		t.Fatal("the write made a timer of its own")
	}
	k.stop()
	if held := queueHolds(g); len(held) != 0 || k.timer != nil {
		t.Fatalf("after stop: the queue's lists %v still hold keepalives, timer %v", held, k.timer)
	}
}

// The claim queue fires a write's bound: a write that ends a claim, made
// with no run before it (as DoBatch's is, after its claims), gets a
// context that ends at max(Lease, 1s) with context.DeadlineExceeded, and
// the keepalive leaves the queue.
func TestQueuedWriteBound(t *testing.T) {
	g := queueGuard()
	g.opts.Lease = MinLease // the bound is max(Lease, 1s): 1s
	k := g.newKeepalive(context.Background(), time.Now().Add(time.Hour))
	k.claim()
	k.halt()
	start := time.Now()
	wctx := k.detach()
	defer k.stop()
	select {
	case <-wctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the write's context did not end at its bound")
	}
	if took := time.Since(start); took < time.Second || !errors.Is(wctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("the write's context ended after %s with %v; want 1s or more, context.DeadlineExceeded", took, wctx.Err())
	}
	k.stop()
	if held := queueHolds(g); len(held) != 0 {
		t.Fatalf("the queue's lists %v still hold the keepalive", held)
	}
}
