package pgstore_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestReadOnlyStoreReplays: a Store whose database refuses writes (a role
// or session made read only; a hot standby, which a primary demoted in a
// failover is until the connections reach the new one) still answers a
// claim of a completed key with its stored result, as the Redis store
// replays under OOM (docs/design.md, failure modes): the record is there,
// and a replay writes nothing. Any claim that needs a write (a new key, a
// failed or abandoned one) or is not a replay (another payload, a live
// holder) stays guard.ErrUnavailable: a replica may lag, so its read
// decides nothing but a result already committed. The claim's first
// statement is an INSERT, so every claim was refused, replays too.
func TestReadOnlyStoreReplays(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, rw, ro *sql.DB, replayed func(testing.TB)) {
		if err := pgstore.Migrate(ctx, rw, pgstore.Options{}); err != nil {
			t.Fatal(err)
		}
		w := pgenv.Store(t, rw, pgstore.Options{})
		claim := func(s *pgstore.Store, id, token, fp string) (guard.Outcome, error) {
			return s.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: id}, Token: token, Fingerprint: fp,
				Lease: time.Minute, TTL: time.Hour, MaxAttempts: 3})
		}
		for _, id := range []string{"done", "empty", "held", "failed"} {
			out, err := claim(w, id, "A", "fp")
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim %s = %+v, %v", id, out, err)
			}
			switch id {
			case "done":
				err = w.Complete(ctx, out.Lease, []byte("ch_1\x00\xff"), time.Hour)
			case "empty":
				err = w.Complete(ctx, out.Lease, nil, time.Hour)
			case "failed":
				err = w.Fail(ctx, out.Lease, "declined", time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		replayed(t)
		r := pgenv.Store(t, ro, pgstore.Options{})
		for id, want := range map[string]string{"done": "ch_1\x00\xff", "empty": ""} {
			out, err := claim(r, id, "B", "fp")
			if err != nil || out.Status != guard.Replay || string(out.Result) != want || out.Result == nil {
				t.Errorf("read-only claim of the completed key %q = %s %q, %v; want its replay %q", id, out.Status, out.Result, err, want)
			}
		}
		for _, c := range []struct{ id, fp string }{{"done", "other"}, {"held", "fp"}, {"failed", "fp"}, {"new", "fp"}} {
			if out, err := claim(r, c.id, "B", c.fp); !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("read-only claim of %s with %s = %s, %v; want guard.ErrUnavailable", c.id, c.fp, out.Status, err)
			}
		}
	}
	t.Run("read-only session", func(t *testing.T) {
		t.Parallel()
		rw, dsn := testenv.Postgres(t)
		check(t, rw, pgenv.ReadOnly(t, dsn), func(testing.TB) {})
	})
	t.Run("hot standby", func(t *testing.T) {
		t.Parallel()
		pair := pgenv.StartStandby(t)
		check(t, pair.Primary, pair.Standby, pair.Replayed)
	})
}
