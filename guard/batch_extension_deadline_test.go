package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestBatchExtensionDeadlineFromSent is TestExtensionDeadlineFromSent
// for DoBatch's heartbeat (beat): docs/design.md, "Leases", and beat's doc
// comment say each lease's deadline is (when the last extension that
// succeeded for it was SENT) + Lease − LeaseMargin(Lease). The server ran
// the extension at the send or later, so its lease ends no sooner; dating
// the deadline from the extension's answer keeps the effect's context
// alive up to the answer's delay past the server's lease, while another
// claim may take the key over.
//
// The first extension's answer comes back 250ms after the server ran it;
// the second hangs until it is given up. Its context's deadline is the
// lease's deadline in force, which must be validity after the first
// extension was sent, not after its answer came.
func TestBatchExtensionDeadlineFromSent(t *testing.T) {
	const lease = 600 * time.Millisecond
	validity := lease - guard.LeaseMargin(lease)
	for round := 1; ; round++ {
		if batchExtensionDeadlineFromSent(t, lease, validity, round) {
			return
		}
		if round == 3 {
			t.Fatalf("in %d rounds the second extension was never sent before the lease's deadline: the machine is too slow to tell", round)
		}
	}
}

func batchExtensionDeadlineFromSent(t *testing.T, lease, validity time.Duration, round int) bool {
	var (
		mu       sync.Mutex
		sent     time.Time
		deadline time.Time
		bounded  bool
	)
	// hooked is a plain Store (its embedded interface hides RedisStore's
	// WriteBatch): DoBatch's heartbeat sends its extensions through
	// Extend, one per key.
	h := &hooked{Store: realStore(t), onWire: true}
	h.beforeExtend = func(ctx context.Context, n int32) {
		if n == 1 {
			mu.Lock()
			sent = time.Now()
			mu.Unlock()
			return
		}
		if n == 2 {
			mu.Lock()
			deadline, bounded = ctx.Deadline()
			mu.Unlock()
		}
		<-ctx.Done() // the next one hangs until given up
	}
	h.afterExtend = func(n int32, err error) {
		if n == 1 {
			time.Sleep(250 * time.Millisecond) // its answer is slow to come back
		}
	}
	g := guard.New(h, guard.Options{Lease: lease})
	items := []guard.BatchItem{{Key: guard.Key{Scope: "s", ID: fmt.Sprintf("batch-slow-answer-%d", round)}, Fingerprint: "fp"}}
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, guard.BatchOptions{})
	if !errors.Is(res[0].Err, guard.ErrLeaseLost) {
		t.Fatalf("DoBatch = %+v, want ErrLeaseLost", res[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if h.extends.Load() < 2 {
		t.Logf("round %d: the lease's deadline passed before the second extension was sent; again", round)
		return false
	}
	if !bounded {
		t.Fatal("the second extension's context has no deadline")
	}
	// Counted from the send, the deadline is at most validity after the
	// hook's reading of the clock (the heartbeat read it first); counted
	// from the answer, 250ms more.
	if d := deadline.Sub(sent); d > validity || d < validity-150*time.Millisecond {
		t.Errorf("the lease's deadline after the first extension: %s after it was sent, want %s (an extension dated from its answer: %s)",
			d, validity, validity+250*time.Millisecond)
	}
	return true
}
