package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// slowClaimAnswers is a plain Store (no ClaimBatch: DoBatch claims key by
// key through it) whose claims run at once in the store but whose answers
// take delay to come back, as over a slow link. It remembers when each
// claim was sent.
type slowClaimAnswers struct {
	guard.Store
	delay time.Duration

	mu   sync.Mutex
	sent map[guard.Key]time.Time
}

func (s *slowClaimAnswers) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.mu.Lock()
	s.sent[req.Key] = time.Now()
	s.mu.Unlock()
	out, err := s.Store.Claim(ctx, req)
	time.Sleep(s.delay) // the answer is slow to come back
	return out, err
}

func (s *slowClaimAnswers) sentAt(k guard.Key) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[k]
}

// TestFirstDeadlineFromClaimSent: the server ran the claim no sooner than
// it was sent, so the lease it granted may end Lease after the send; the
// holder's first deadline (Lease.Deadline, and the effect's context) is
// sent + Lease − LeaseMargin (docs/design.md, "Leases"), whatever the
// answer's delay, in every entry point that claims: Do, Hold and DoBatch.
// The proof's partition test checks Do's; a DoBatch that dated its leases
// from the claims' answers passed the nemesis, the partition tests and
// the batch tests, its effects running up to the answer's delay past the
// server's lease (a mutation review of the proof suite).
func TestFirstDeadlineFromClaimSent(t *testing.T) {
	const lease = 600 * time.Millisecond
	const delay = 150 * time.Millisecond
	validity := lease - guard.LeaseMargin(lease)
	for _, tc := range []struct {
		name string
		run  func(g *guard.Guard, k guard.Key) (deadline, ctxDeadline time.Time, err error)
	}{
		{"Do", func(g *guard.Guard, k guard.Key) (d, cd time.Time, err error) {
			_, err = g.Do(context.Background(), k, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				d = l.Deadline
				cd, _ = ctx.Deadline()
				return []byte("ok"), nil
			})
			return d, cd, err
		}},
		{"Hold", func(g *guard.Guard, k guard.Key) (d, cd time.Time, err error) {
			out, h, err := g.Hold(context.Background(), k, "fp")
			if err != nil {
				return d, cd, err
			}
			d = out.Lease.Deadline
			cd, _ = h.Context().Deadline()
			return d, cd, h.Complete([]byte("ok"))
		}},
		{"DoBatch", func(g *guard.Guard, k guard.Key) (d, cd time.Time, err error) {
			res := g.DoBatch(context.Background(), []guard.BatchItem{{Key: k, Fingerprint: "fp"}},
				func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) {
					d = l.Deadline
					cd, _ = ctx.Deadline()
					return []byte("ok"), nil
				}, guard.BatchOptions{})
			return d, cd, res[0].Err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &slowClaimAnswers{Store: memstore.New(memstore.Options{}), delay: delay, sent: map[guard.Key]time.Time{}}
			g := guard.New(s, guard.Options{Lease: lease})
			k := guard.Key{Scope: "first-deadline", ID: tc.name}
			d, cd, err := tc.run(g, k)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			sent := s.sentAt(k)
			// The guard read its clock before the store's hook did, so
			// counted from the send the deadline is at most validity
			// after sent; counted from the answer, delay more.
			if got := d.Sub(sent); got > validity {
				t.Errorf("Lease.Deadline is %s after the claim was sent, want at most %s (dated from the answer: %s)",
					got, validity, validity+delay)
			}
			if !cd.IsZero() {
				if got := cd.Sub(sent); got > validity {
					t.Errorf("the effect's context ends %s after the claim was sent, want at most %s", got, validity)
				}
			}
		})
	}
}
