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
	p, s := overBackstop(t)
	// Every heartbeat (one a third of a lease) and every duplicate's claim
	// must be answered within a lease: 600ms was within a stall of a
	// loaded machine (a duplicate's claim refused as late is not
	// ErrInProgress).
	const lease = 2 * time.Second
	g := guard.New(s, guard.Options{Lease: lease})
	k := key(t.Name())
	var runs atomic.Int64
	claimed, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(bg, k, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			runs.Add(1)
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
	p.srv.Kill()
	openBreaker(t, s)
	// Three leases later the holder is still running.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		_, err := g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			runs.Add(1)
			return []byte("twice"), nil
		})
		if !errors.Is(err, guard.ErrInProgress) {
			t.Fatalf("a duplicate while the holder runs = %v, want ErrInProgress", err)
		}
		time.Sleep(lease / 4) // a client's retry pause
	}
	close(finish)
	if err := <-done; err != nil {
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
