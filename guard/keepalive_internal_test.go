package guard

import (
	"context"
	"errors"
	"testing"
	"time"
)

// queueGuard is a Guard with only what its claim queue uses: the queue
// calls no store.
func queueGuard() *Guard { return &Guard{claims: new(claimQueue), opts: Options{}.withDefaults()} }

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
	if g.claims.head != nil || g.claims.tail != nil {
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
