package guard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// hangingExtends is a real batch store whose batches of extensions reach
// no server until release is closed (a partition, under a client that
// waits out its read timeout whatever the context says, as go-redis does
// by default); its other calls go through.
type hangingExtends struct {
	*guard.RedisStore
	release chan struct{}
}

func (h hangingExtends) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	if len(ws) > 0 && ws[0].Kind == guard.WriteExtend {
		select {
		case <-h.release:
		case <-time.After(10 * time.Second):
		}
		errs := make([]error, len(ws))
		for i := range errs {
			errs[i] = guard.ErrUnavailable
		}
		return errs
	}
	return h.RedisStore.WriteBatch(ctx, ws)
}

// A batch's heartbeat round that hangs past the leases' deadline does not
// keep them: every effect's context ends at its lease's deadline, on the
// batch's timer, before another claim of its key can succeed (checked as
// that claim succeeds, give or take the timer's lateness on a loaded
// machine, lateGrace as in TestNoOverlapUnderChaos: a context kept live
// by the hanging round stays so until this check lets the round go), and
// the batch reports ErrLeaseLost per item.
func TestDoBatchDeadlineWhileExtensionHangs(t *testing.T) {
	// The batch's claims must be answered within the lease's first
	// deadline: a round a loaded machine held back past it proves nothing
	// and runs again with a lease twice as long.
	testenv.OnTime(t, "a lease", 600*time.Millisecond, 4, func(lease time.Duration) bool {
		return doBatchDeadlineWhileExtensionHangs(t, lease)
	})
}

func doBatchDeadlineWhileExtensionHangs(t *testing.T, lease time.Duration) (late bool) {
	const lateGrace = 100 * time.Millisecond
	s := hangingExtends{realStore(t), make(chan struct{})}
	g := guard.New(s, guard.Options{Lease: lease, MaxRun: 5 * lease}) // MaxRun: a regression fails in seconds
	other := guard.New(s.RedisStore, guard.Options{Lease: lease})
	items := batchItems("hang/"+lease.String(), 2)
	var (
		mu   sync.Mutex
		ctxs = make([]context.Context, len(items))
	)
	began := time.Now()
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		mu.Lock()
		ctxs[i] = ctx
		mu.Unlock()
		if i == 0 {
			go func() {
				defer close(s.release)
				for j, it := range items {
					_, err := claimWhenFree(t, other, it.Key, 5*lease, func(guard.Lease) {
						mu.Lock()
						c := ctxs[j]
						mu.Unlock()
						if c == nil || c.Err() == nil && !testenv.EndsWithin(c, lateGrace) {
							t.Errorf("item %d: another claim succeeded while the batch's effect held a live context (still live %s later)", j, lateGrace)
						}
					})
					if err != nil {
						t.Error(err)
					}
				}
			}()
		}
		<-ctx.Done()
		if now := time.Now(); now.Before(l.Deadline) {
			t.Errorf("item %d cancelled %s before its deadline", i, l.Deadline.Sub(now))
		}
		return nil, context.Cause(ctx)
	}, guard.BatchOptions{Concurrency: len(items)})
	// The batch does not wait for the hanging round; the other claims end it.
	mu.Lock()
	started := ctxs[0] != nil
	mu.Unlock()
	if started {
		<-s.release
	}
	for i, r := range res {
		if errors.Is(r.Err, guard.ErrUnavailable) && ctxs[i] == nil && time.Since(began) >= lease-guard.LeaseMargin(lease) {
			return true // the claims were not answered within the lease's first deadline
		}
	}
	for i, r := range res {
		if !errors.Is(r.Err, guard.ErrLeaseLost) {
			t.Errorf("item %d: %v, want ErrLeaseLost", i, r.Err)
		}
	}
	return false
}
