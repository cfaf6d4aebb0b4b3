package storetest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// LeasesNeverOverlap races workers claimants on one key of s for about
// run, on the real clock (a store whose leases run out in real time: a
// real server, memstore on its default clock). Each holder then fails,
// releases, or dies (does nothing, so the next claim recovers the key
// once its lease ran out). A holder owns the key from its claim's answer
// until it sends its failure or release, or, dying, until the deadline
// the guard gives it (sent + lease − guard.LeaseMargin; docs/design.md,
// "Leases"), and never past that deadline. A claim answered at or after
// its deadline is released unused, as guard releases one: the store's
// lease may have run out before the answer came, so it owns nothing
// (counting it from its answer would fail a correct store whose reply a
// loaded machine held back). No two of these windows may overlap, and every acquisition
// has a larger fence than the one before (after a released first attempt
// too, which leaves the key absent but keeps its fence: rule 4), and
// a dead holder's key must be seen taken over after its lease ran out (a
// store that never recovers it fails). Windows are measured on this
// process's clock from causally ordered events (a claim's answer comes
// after the write that ended the previous holder's window), so a loaded
// machine cannot make a correct store fail.
func LeasesNeverOverlap(t *testing.T, s guard.Store, lease time.Duration, workers int, run time.Duration) {
	t.Helper()
	type window struct {
		start, end time.Time
		fence      int64
		attempt    int
		how        string
	}
	key := guard.Key{Scope: "overlap", ID: t.Name() + "/" + rand.Text()[:10]}
	var (
		mu         sync.Mutex
		windows    []window
		lateClaims int // answered Acquired at or after their deadline: not used
		wg         sync.WaitGroup
	)
	stop := time.Now().Add(run)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(stop); n++ {
				tok := fmt.Sprintf("w%d-%d-%s", w, n, rand.Text()[:6])
				sent := time.Now()
				out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if out.Status != guard.Acquired {
					time.Sleep(time.Millisecond) // a claimant polling a busy key, not synchronisation
					continue
				}
				// The holder may act until deadline, counted from when it
				// sent the claim; a claim answered at or after it is not
				// used but released, as guard releases a late claim: the
				// store's lease may be over, and the key another's.
				deadline := sent.Add(lease - guard.LeaseMargin(lease))
				win := window{start: time.Now(), fence: out.Lease.Fence, attempt: out.Lease.Attempt}
				if !win.start.Before(deadline) {
					if err := s.Release(ctx, out.Lease); err != nil && !errors.Is(err, guard.ErrLeaseLost) {
						t.Errorf("release of a late claim: %v", err)
					}
					mu.Lock()
					lateClaims++
					mu.Unlock()
					continue
				}
				switch n % 3 {
				case 0:
					win.how, win.end = "failed", earliest(time.Now(), deadline)
					err = s.Fail(ctx, out.Lease, "boom", time.Hour)
				case 1:
					win.how, win.end = "released", earliest(time.Now(), deadline)
					err = s.Release(ctx, out.Lease)
				default:
					win.how, win.end = "died", deadline
				}
				if err != nil && !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("%s: %v", win.how, err)
				}
				mu.Lock()
				windows = append(windows, win)
				mu.Unlock()
				if win.how == "died" {
					time.Sleep(time.Until(win.end)) // a dead holder claims nothing until its window has passed
				}
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(windows, func(a, b window) int { return a.start.Compare(b.start) })
	died, recovered := 0, 0
	for i, w := range windows {
		if w.how == "died" {
			died++
		}
		if i == 0 {
			continue
		}
		p := windows[i-1]
		if p.how == "died" {
			recovered++ // the key taken over once its dead holder's lease ran out
		}
		if w.start.Before(p.end) {
			t.Errorf("holder with fence %d acquired %s before the holder with fence %d (%s) ended its window",
				w.fence, p.end.Sub(w.start), p.fence, p.how)
		}
		// A released first attempt leaves the key absent, but its
		// marker keeps the fence: the next is above it (rule 4).
		if w.fence <= p.fence {
			t.Errorf("fence %d acquired after fence %d (%s)", w.fence, p.fence, p.how)
		}
	}
	if len(windows) < 3 || recovered == 0 {
		// A store that never recovers a dead holder's key passes the
		// checks above with its first few holders: it must be seen to.
		t.Errorf("%d holders, %d of them died, %d keys taken over after a death: the race proves nothing", len(windows), died, recovered)
	}
	t.Logf("%d holders (%d died, %d taken over after them), no two windows overlap; %d claims answered too late to use",
		len(windows), died, recovered, lateClaims)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
