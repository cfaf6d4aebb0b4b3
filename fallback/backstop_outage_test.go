package fallback_test

import (
	"errors"
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
