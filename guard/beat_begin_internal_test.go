package guard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestBeatBeginPastDeadline: beat.begin "reports false, with the
// context cancelled and the cause returned, when the lease is no longer
// held or its deadline has passed: the effect must not run" (its doc
// comment; docs/design.md, "Leases": the holder's context is done before
// any other claim can succeed). The heartbeat's timer ends a lease at its
// deadline, but a timer fires late on a loaded machine or after a GC
// pause, and an item of a batch waiting for its turn (Concurrency) can
// start its effect in that gap: begin's own check is then all that stands
// between the effect and a lease the server may already have given away.
// Here the timer is stopped (as late as a timer can be) and the lease's
// deadline has passed: begin must refuse to start the effect.
func TestBeatBeginPastDeadline(t *testing.T) {
	s := NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)})
	g := New(s, Options{Lease: time.Second})
	l := Lease{Key: Key{Scope: "beat", ID: "begin-past-deadline"}, Token: "A", Fence: 1, Attempt: 1,
		Deadline: time.Now().Add(time.Hour)}
	b := g.newBeat(context.Background(), s, 1, func(int) *Lease { return &l })
	defer b.stop()
	// The timer is late: it has not fired by the time the deadline passed.
	b.mu.Lock()
	b.timer.Stop()
	b.held[0].valid = time.Now().Add(-time.Millisecond)
	b.mu.Unlock()

	ctx, err := b.begin(0)
	if !errors.Is(err, ErrLeaseLost) {
		t.Errorf("begin after the lease's deadline = %v, want an error matching ErrLeaseLost (the effect must not run)", err)
	}
	if ctx.Err() == nil {
		t.Error("the effect's context is live after the lease's deadline")
	}
}
