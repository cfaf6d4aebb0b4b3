package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// lateBatchAnswer is a real store whose rounds of extensions answer only
// after their leases' deadline: after runs once the store has extended,
// before the answers reach the batch heartbeat.
type lateBatchAnswer struct {
	*RedisStore
	after func()
}

func (s lateBatchAnswer) WriteBatch(ctx context.Context, ws []Write) []error {
	errs := s.RedisStore.WriteBatch(ctx, ws)
	if len(ws) > 0 && ws[0].Kind == WriteExtend {
		s.after()
	}
	return errs
}

// TestBeatLateExtensionNotRevived: "A failed or late extension
// never revives a lease" (beat's doc comment; docs/design.md, "Leases").
// A round of extensions whose success comes back after the lease's
// deadline, before the timer that keeps the deadline has fired (a timer
// fires late on a loaded machine), must end the lease as lost, observed
// once, as Do's heartbeat does (TestLateExtensionObservedLost): not push
// its deadline out from when the round was sent. Kills mutant M21
// (batch_keepalive.go: `case err == nil:` for `case err == nil &&
// now.Before(h.valid):`).
func TestBeatLateExtensionNotRevived(t *testing.T) {
	var b *beat
	rs := NewRedisStore(testenv.Redis(t), RedisOptions{Prefix: testenv.Prefix(t)})
	s := lateBatchAnswer{RedisStore: rs}
	s.after = func() {
		b.mu.Lock()
		b.held[0].valid = time.Now() // the deadline passed while the answer was on its way
		b.mu.Unlock()
	}
	var lost atomic.Int32
	g := New(s, Options{Lease: time.Minute, Observer: ObserverFunc(func(_ context.Context, e Event) {
		if e.Kind == EventLeaseLost {
			lost.Add(1)
		}
	})})
	bg := context.Background()
	out, err := g.Claim(bg, Key{Scope: "mutation", ID: "beat-late-extension"}, "fp")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(bg, out.Lease) }()
	l := out.Lease
	b = g.newBeat(bg, s, 1, func(int) *Lease { return &l })
	defer b.stop()
	ctx, err := b.begin(0)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.next = time.Now() // an extension is due
	b.mu.Unlock()
	b.fire()

	if cause := context.Cause(ctx); !errors.Is(cause, ErrLeaseLost) {
		b.mu.Lock()
		valid := b.held[0].valid
		b.mu.Unlock()
		t.Fatalf("the effect's context ended with %v (deadline now %s from now), want ErrLeaseLost: a late extension revived the lease",
			cause, time.Until(valid).Round(time.Millisecond))
	}
	if n := lost.Load(); n != 1 || !b.lossObserved(0) {
		t.Fatalf("the lost lease was observed %d times (lossSeen %v), want once", n, b.lossObserved(0))
	}
}
