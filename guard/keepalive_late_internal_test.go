package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// lateAnswer is a real store whose extensions answer only after their
// lease's deadline: after runs once the store has extended, before the
// answer reaches the heartbeat.
type lateAnswer struct {
	Store
	after func()
}

func (s lateAnswer) Extend(ctx context.Context, lease Lease, d time.Duration) error {
	err := s.Store.Extend(ctx, lease, d)
	s.after()
	return err
}

// An extension whose success comes back after the lease's deadline, before
// the timer that keeps the deadline has fired, ends the run as a lost
// lease and is observed as one (EventLeaseLost), as DoBatch's heartbeat
// does: the effect sees ErrLeaseLost, and the Observer heard nothing of
// it when the effect then gave up and the claim was released.
func TestLateExtensionObservedLost(t *testing.T) {
	var k *keepalive
	s := lateAnswer{Store: NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)})}
	s.after = func() {
		k.mu.Lock()
		k.valid = time.Now() // the deadline passed while the answer was on its way
		k.mu.Unlock()
	}
	var lost atomic.Int32
	g := New(s, Options{Lease: time.Minute, Observer: ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventLeaseLost {
			lost.Add(1)
		}
	})})
	bg := context.Background()
	k, out, err := g.keptClaim(bg, Key{Scope: "late", ID: "extension"}, "fp", CallOptions{}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(bg, out.Lease) }()
	defer k.stop()
	k.mu.Lock()
	k.beat = time.Now() // an extension is due
	k.mu.Unlock()
	k.fire()
	if cause := context.Cause(k.ctx); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("the effect's context ended with %v, want ErrLeaseLost", cause)
	}
	if n := lost.Load(); n != 1 || !k.lossObserved() {
		t.Fatalf("the lost lease was observed %d times (lossSeen %v), want once", n, k.lossObserved())
	}
}
