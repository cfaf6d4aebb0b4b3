package backstop_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapMarkStrictIsolation: on a database whose default
// isolation is REPEATABLE READ or SERIALIZABLE (a server's or role's
// setting; pgstore's own statements are made for it), a claim through
// the store Wrap returns whose mark meets a concurrent write of the key's
// row (the previous holder's Fail ending its mark's lease; the live
// holder's keepalive extending its mark after Redis lost the key) fails
// with PostgreSQL's serialization failure: the claim answers
// guard.ErrUnavailable (a 503, a consumer's redelivery, a count against a
// fallback breaker) where it must answer what the row says: acquired with
// a fence above the failed holder's, or in progress while the live
// holder's lease lasts. The mark is one statement that changed nothing
// when it failed so, and is safe to run again, as pgstore's Store runs its
// statements again (pgsql.RetryLostRace). At READ COMMITTED the same
// race is answered right (the subtest passes), so the test isolates the
// isolation level.
//
// The concurrent write is made by a transaction of the test that holds
// the row while the claim's mark waits for it (seen waiting in
// pg_stat_activity), then commits: the same UPDATE the store makes
// (unmark, extend), on the same row.
func TestWrapMarkStrictIsolation(t *testing.T) {
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		for _, tc := range []struct {
			name string
			// lose: Redis lost the holder's record; else the holder
			// failed in Redis (the ordinary retry after a failure).
			lose bool
			// write is the concurrent statement on A's mark ($1 id, $2 token).
			write string
			want  guard.Status
		}{
			{"retry after a failure, its unmark racing", false,
				`UPDATE idemguard_keys SET leased_until = NULL, expires_at = statement_timestamp() + interval '1 hour'
					WHERE scope = 'payments' AND id = $1 AND token = $2`, guard.Acquired},
			{"redis lost the holder, its extension racing", true,
				`UPDATE idemguard_keys SET leased_until = statement_timestamp() + interval '30 seconds',
					expires_at = statement_timestamp() + interval '1 hour'
					WHERE scope = 'payments' AND id = $1 AND token = $2`, guard.InProgress},
		} {
			t.Run(level+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				direct, db, waitLocked := pgenv.Isolated(t, level)
				client := testenv.Redis(t)
				rs := guardenv.StoreOn(t, client, guard.RedisOptions{})
				s := backstop.Wrap(rs, mustBackstop(t, db, pgstore.Options{}))
				key := newKey(t)
				req := func(tok string) guard.ClaimRequest {
					return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: 30 * time.Second, TTL: time.Hour, MaxAttempts: 5}
				}
				a, err := s.Claim(ctx, req("A"))
				if err != nil || a.Status != guard.Acquired {
					t.Fatalf("A's claim = %s, %v", a.Status, err)
				}
				if tc.lose {
					if err := client.Del(ctx, rs.Name(key)).Err(); err != nil {
						t.Fatal(err)
					}
				} else if err := rs.Fail(ctx, a.Lease, "boom", time.Hour); err != nil { // primary only: Wrap's unmark is the racing write
					t.Fatal(err)
				}
				tx, err := direct.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }()
				if res, err := tx.ExecContext(ctx, tc.write, key.ID, "A"); err != nil {
					t.Fatal(err)
				} else if n, _ := res.RowsAffected(); n != 1 {
					t.Fatalf("the racing write changed %d rows, want A's mark", n)
				}
				type answer struct {
					out guard.Outcome
					err error
				}
				done := make(chan answer, 1)
				go func() {
					out, err := s.Claim(ctx, req("B"))
					done <- answer{out, err}
				}()
				waitLocked("B's mark waiting for the row")
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				var got answer
				select {
				case got = <-done:
				case <-time.After(20 * time.Second):
					t.Fatal("B's claim did not return")
				}
				if got.err != nil {
					t.Fatalf("B's claim = %v; want %s (the row: A's mark, its write committed)", got.err, tc.want)
				}
				if got.out.Status != tc.want {
					t.Fatalf("B's claim = %s; want %s", got.out.Status, tc.want)
				}
				if tc.want == guard.Acquired && got.out.Lease.Fence <= a.Lease.Fence {
					t.Fatalf("B's fence %d, not above A's %d", got.out.Lease.Fence, a.Lease.Fence)
				}
			})
		}
	}
}
