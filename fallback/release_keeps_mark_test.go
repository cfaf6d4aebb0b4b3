package fallback_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestReleaseKeepsWrapMark: the recommended composition
// (fallback.New(backstop.Wrap(redis, b), Secondary: pgstore on the same
// tables)). A first attempt records a step in Redis (its effect happened)
// and is released: Redis keeps the key (failed, with the step), and Wrap
// keeps the holder's mark in PostgreSQL on purpose (backstop.Wrap's doc,
// wrappedStore.forgot: "or another payload could take the key once
// primary lost it"), ending only its lease. A Store whose switch-back
// checks are on (ConsultSecondary at start-up, as the package doc advises,
// or any Store in the TTL after an outage) must not undo that: its
// Release, finding the mark (pending, the holder's token) in the shared
// keys table, took it for a lease of the secondary's and released it
// there too, which expired the mark. Once Redis then loses the key (what
// the backstop is there for), a request with another payload took the
// key and ran instead of being refused as a mismatch. The same sequence
// on a Store without the checks keeps the mark (the control subtest).
func TestReleaseKeepsWrapMark(t *testing.T) {
	t.Parallel()
	for _, consulting := range []bool{false, true} {
		t.Run(map[bool]string{false: "no-checks", true: "checks-on"}[consulting], func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)})
			db := pgenv.Migrated(t, pgstore.Options{})
			b, err := backstop.New(db, pgstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			sec := pgenv.Store(t, db, pgstore.Options{})
			s, err := fallback.New(backstop.Wrap(rs, b), fallback.Options{Policy: fallback.Secondary, Secondary: sec, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			if consulting {
				s.ConsultSecondary(time.Now().Add(time.Hour))
			}
			key := guard.Key{Scope: "s", ID: "k"}
			req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "pay 10", Lease: 10 * time.Second, TTL: 24 * time.Hour}
			out, err := s.Claim(bg, req)
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim = %s, %v", out.Status, err)
			}
			// A step whose effect happened (a charge downstream), kept in Redis.
			if err := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
				t.Fatalf("save step: %v", err)
			}
			if err := s.Release(bg, out.Lease); err != nil {
				t.Fatalf("release: %v", err)
			}
			if rec, err := rs.Get(bg, key); err != nil || len(rec.Steps) != 1 {
				t.Fatalf("Redis after the release: %s with %d steps, %v; want the key kept with its step", rec.State, len(rec.Steps), err)
			}
			rec, err := sec.Get(bg, key)
			if err != nil {
				t.Errorf("the holder's mark after the release: %v; want it kept (Redis kept the key, with a step whose effect happened)", err)
			} else if rec.Token != "A" {
				t.Errorf("the mark after the release bears %q; want A's", rec.Token)
			}

			// Redis loses the key (a failover before replication, an eviction).
			if err := c.FlushAll(bg).Err(); err != nil {
				t.Fatal(err)
			}
			other := guard.ClaimRequest{Key: key, Token: "B", Fingerprint: "pay 99", Lease: 10 * time.Second, TTL: 24 * time.Hour}
			out, err = s.Claim(bg, other)
			switch {
			case err != nil:
				t.Fatalf("claim with another payload: %v", err)
			case out.Status == guard.Acquired:
				t.Errorf("a request with another payload took the key once Redis lost it (fence %d): want %s, the backstop's mark refusing it", out.Lease.Fence, guard.Mismatch)
			case out.Status != guard.Mismatch:
				t.Errorf("claim with another payload = %s; want %s", out.Status, guard.Mismatch)
			}
			if errors.Is(err, guard.ErrUnavailable) {
				t.Fatal(err)
			}
		})
	}
}
