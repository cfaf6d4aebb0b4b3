package guard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// A batch's heartbeat whose leases are all lost has nothing left to do,
// however long the effects go on (an effect that ignores its context):
// its timer is not due again before the batch ends it. It was set, over
// and over, for the extension that would have been next, long past, and
// spun a core (960ms of CPU a second, measured) until the last effect
// returned.
func TestBeatIdleOnceAllLost(t *testing.T) {
	// The claim, the release and begin must come within the lease's
	// first deadline (87ms at first): a round a loaded machine held back
	// past it proves nothing and runs again with a lease twice as long.
	testenv.OnTime(t, "a lease", 90*time.Millisecond, 4, func(lease time.Duration) bool {
		return beatIdleOnceAllLost(t, lease)
	})
}

func beatIdleOnceAllLost(t *testing.T, lease time.Duration) (late bool) {
	s := NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)})
	g := New(s, Options{Lease: lease})
	key := Key{Scope: "beat", ID: "all-lost/" + lease.String()}
	began := time.Now()
	out, err := g.Claim(context.Background(), key, "fp")
	if errors.Is(err, ErrUnavailable) && time.Since(began) >= lease-LeaseMargin(lease) {
		return true // not answered within the lease's first deadline
	}
	if err != nil {
		t.Fatal(err)
	}
	l := out.Lease
	if err := g.Release(context.Background(), l); err != nil { // so the extensions answer LOST
		t.Fatal(err)
	}
	b := g.newBeat(context.Background(), s, 1, func(int) *Lease { return &l })
	defer b.stop()
	if _, err := b.begin(0); err != nil {
		if errors.Is(err, ErrLeaseLost) && !time.Now().Before(l.Deadline) {
			return true // the deadline had passed before begin
		}
		t.Fatal(err)
	}
	b.mu.Lock()
	ctx := &b.held[0].ctx
	b.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease was not found lost")
	}
	// Past the extension that would have come next, the timer must not
	// be due: nothing is.
	b.mu.Lock()
	next := b.next
	b.mu.Unlock()
	testenv.WaitFor(t, 10*time.Second, "the next extension's time", func() bool { return time.Now().After(next.Add(lease)) })
	b.mu.Lock()
	due := b.due
	b.mu.Unlock()
	if d := time.Until(due); d < time.Minute {
		t.Fatalf("with every lease lost, the heartbeat's timer is due in %s", d)
	}
	return false
}
