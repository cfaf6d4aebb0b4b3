package guard_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// unavailableRounds is a real batch store whose rounds of extensions
// answer ErrUnavailable while down is set, as a store briefly out of
// reach does.
type unavailableRounds struct {
	*guard.RedisStore
	down   atomic.Bool
	failed atomic.Int32 // rounds refused
	rounds atomic.Int32 // rounds sent
}

func (u *unavailableRounds) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	if len(ws) > 0 && ws[0].Kind == guard.WriteExtend {
		u.rounds.Add(1)
		if u.down.Load() {
			u.failed.Add(1)
			errs := make([]error, len(ws))
			for i := range errs {
				errs[i] = fmt.Errorf("%w: connection refused", guard.ErrUnavailable)
			}
			return errs
		}
	}
	return u.RedisStore.WriteBatch(ctx, ws)
}

// TestBatchHeartbeatRidesOutUnavailable: DoBatch's heartbeat has
// "the same rules for each lease" as Do's (beat's doc comment), whose
// extensions that fail are "tried again, sooner as the deadline nears"
// (TestHeartbeatRidesOutUnavailable): a batch whose extensions fail for
// less than the lease left rides it out, its effect's context stays live
// and its result is stored. Kills mutant N06 (beat.fire without `b.next
// = soonest`: a failed round was tried again only Lease/3 after it was
// sent, so two failures at Lease/3 and 2·Lease/3 left no try before the
// deadline and the lease was lost).
func TestBatchHeartbeatRidesOutUnavailable(t *testing.T) {
	// Three failed rounds and a successful one must fit in a lease.
	const lease = 1200 * time.Millisecond
	s := &unavailableRounds{RedisStore: realStore(t)}
	g := guard.New(s, guard.Options{Lease: lease})
	s.down.Store(true)
	items := []guard.BatchItem{{Key: guard.Key{Scope: "mutation", ID: t.Name()}, Fingerprint: "fp"}}
	res := g.DoBatch(bg, items, func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) {
		testenv.WaitFor(t, 10*time.Second, "three failed rounds, or the effect's context ended", func() bool {
			return s.failed.Load() >= 3 || ctx.Err() != nil
		})
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("the effect's context ended after %d failed rounds, within an outage shorter than the lease: %w",
				s.failed.Load(), context.Cause(ctx))
		}
		s.down.Store(false) // back before the deadline: the next try succeeds
		if time.Now().After(l.Deadline) {
			return nil, fmt.Errorf("the outage outlasted the lease (%s past its deadline): the test proves nothing", time.Since(l.Deadline))
		}
		n := s.rounds.Load()
		testenv.WaitFor(t, 10*time.Second, "a successful round", func() bool { return s.rounds.Load() > n+1 || ctx.Err() != nil })
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("the effect's context ended although an extension succeeded in time: %w", context.Cause(ctx))
		}
		return []byte("ok"), nil
	}, guard.BatchOptions{})
	if res[0].Err != nil || string(res[0].Value) != "ok" {
		t.Fatalf("DoBatch: value %q, err %v", res[0].Value, res[0].Err)
	}
}
