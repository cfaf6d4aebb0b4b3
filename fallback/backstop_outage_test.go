package fallback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestOutageHolderEndEndsMarkLease: a holder claimed through Redis
// (backstop.Wrap, which marks it with its lease in the keys table the
// secondary shares) when Redis dies; it then fails or releases its claim.
// Redis cannot take that write, but the next claim, in the secondary,
// must not be told the key is in progress for the rest of a lease (a
// minute here) nobody holds. A holder that completes then has its result
// stored in the mark's row, and the next claim replays it.
func TestOutageHolderEndEndsMarkLease(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"fail", "release", "complete"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			p, s := overBackstop(t)
			g := guard.New(s, guard.Options{Lease: time.Minute})
			k := key(t.Name())
			a, err := g.Claim(bg, k, "fp")
			if err != nil {
				t.Fatal(err)
			}
			p.srv.Kill()
			openBreaker(t, s)
			switch end {
			case "fail":
				err = g.Fail(bg, a.Lease, errors.New("declined"))
			case "release":
				err = g.Release(bg, a.Lease)
			case "complete":
				err = g.Complete(bg, a.Lease, []byte("paid"))
			}
			if err != nil {
				t.Fatalf("%s during the outage: %v", end, err)
			}
			out, err := g.Claim(bg, k, "fp")
			if end == "complete" {
				if err != nil || out.Status != guard.Replay || string(out.Result) != "paid" {
					t.Fatalf("claim in the secondary after the holder completed = %s %q, %v; want its replay", out.Status, out.Result, err)
				}
				return
			}
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim in the secondary after the holder's %s = %s, %v; want acquired at once", end, out.Status, err)
			}
		})
	}
}

// TestOutageHolderKeepsMarkLease: a holder claimed through Redis
// (backstop.Wrap on the secondary's tables) is still running, extending
// its lease, when Redis dies. Its extensions land on its mark in the
// secondary, so a duplicate claimed in the secondary long after the
// holder's first lease would have run out is told the key is in progress,
// and, once the holder completed, replays its result: the effect runs
// once, never twice at once.
func TestOutageHolderKeepsMarkLease(t *testing.T) {
	t.Parallel()
	// Every heartbeat (one a third of a lease) and every duplicate's claim
	// must be answered within a lease: a holder whose heartbeat a loaded
	// machine held back past its deadline has lost its lease, and a
	// duplicate is then right to take the key (make test: at a lease of
	// 2s, a duplicate ran; 600ms before that, a duplicate's claim was
	// refused as late). Such a round proves nothing and runs again with a
	// lease twice as long; in every round a duplicate that runs while the
	// holder's context is live fails the test.
	testenv.OnTime(t, "a lease", 2*time.Second, 3, func(lease time.Duration) bool {
		return outageHolderKeepsMarkLease(t, lease)
	})
}

// outageHolderKeepsMarkLease runs TestOutageHolderKeepsMarkLease's case
// with lease; late reports that the holder lost its lease (its heartbeat
// was not answered before its deadline) or a duplicate's claim was
// answered after its own, which proves nothing.
func outageHolderKeepsMarkLease(t *testing.T, lease time.Duration) (late bool) {
	// A holder's context whose deadline passed ends when its keepalive's
	// timer fires, which a loaded machine can delay this long.
	const lateGrace = 100 * time.Millisecond
	validity := lease - guard.LeaseMargin(lease)
	p, s := overBackstop(t)
	g := guard.New(s, guard.Options{Lease: lease})
	k := key(t.Name() + "/" + lease.String())
	var runs atomic.Int64
	claimed, finish := make(chan struct{}), make(chan struct{})
	var holder context.Context // the holder's effect context, set before claimed closes
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(bg, k, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			runs.Add(1)
			holder = ctx
			close(claimed)
			select {
			case <-finish:
				return []byte("paid"), nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
		done <- err
	}()
	<-claimed
	stopHolder := func() error {
		close(finish)
		return <-done
	}
	p.srv.Kill()
	openBreaker(t, s)
	// Three leases later the holder is still running.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		sent := time.Now()
		_, err := g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			runs.Add(1)
			if holder.Err() == nil && !testenv.EndsWithin(holder, lateGrace) {
				t.Errorf("a duplicate ran while the holder's context was live (still live %s later)", lateGrace)
			}
			return []byte("twice"), nil
		})
		switch {
		case errors.Is(err, guard.ErrInProgress):
		case holder.Err() != nil && errors.Is(context.Cause(holder), guard.ErrLeaseLost):
			// The holder lost its lease: its heartbeat was late, and the
			// duplicate's answer, whatever it was, proves nothing.
			t.Logf("the holder lost its lease: %v (a duplicate: %v)", context.Cause(holder), err)
			_ = stopHolder()
			return true
		case errors.Is(err, guard.ErrUnavailable) && time.Since(sent) >= validity:
			t.Logf("a duplicate's claim, answered after %s: %v", time.Since(sent), err)
			_ = stopHolder()
			return true // the duplicate's claim was answered after its deadline
		default:
			_ = stopHolder()
			t.Fatalf("a duplicate while the holder runs = %v, want ErrInProgress", err)
		}
		time.Sleep(lease / 4) // a client's retry pause
	}
	if err := stopHolder(); err != nil {
		if errors.Is(err, guard.ErrLeaseLost) && holder.Err() != nil {
			t.Logf("the holder lost its lease: %v", err)
			return true // its heartbeat was late after the last duplicate
		}
		t.Fatalf("the holder, run across the outage: %v", err)
	}
	res, err := g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		runs.Add(1)
		return []byte("twice"), nil
	})
	if err != nil || !res.Replayed || string(res.Value) != "paid" {
		t.Fatalf("a duplicate once the holder completed = %+v, %v; want its replay", res, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the effect ran %d times", n)
	}
	return false
}

// overBackstop is a fallback Store over Redis wrapped by backstop.Wrap,
// with a pgstore.Store on the backstop's tables as its secondary; its
// breaker opens at the first failure and stays open for the test.
func overBackstop(t *testing.T) (primary, *fallback.Store) {
	t.Helper()
	p := newPrimary(t)
	pg, db := pgStore(t)
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, backstop.Wrap(p.store, b), fallback.Options{
		Policy: fallback.Secondary, Secondary: pg,
		FailuresToOpen: 1, OpenTimeout: time.Hour, Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet,
	})
	return p, s
}
