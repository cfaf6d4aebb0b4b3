package backstop_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// parallel runs op from 16 goroutines (8 × GOMAXPROCS 2), each call with a
// fresh key id (fresh in every run of the benchmark function too), and
// reports calls per second.
func parallel(b *testing.B, op func(id string) error) {
	b.Helper()
	var n atomic.Int64
	prefix := rand.Text()[:10]
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(fmt.Sprint(prefix, n.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func plainInsert(b *testing.B, db *sql.DB) func(string) error {
	pgenv.Exec(b, db, `CREATE TABLE plain_keys (scope text, id text, PRIMARY KEY (scope, id))`)
	return func(id string) error {
		_, err := db.ExecContext(ctx, `INSERT INTO plain_keys (scope, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, "bench", id)
		return err
	}
}

// BenchmarkPostgresStore: claim + complete of new keys on the PostgreSQL
// Store, beside a plain INSERT … ON CONFLICT DO NOTHING.
func BenchmarkPostgresStore(b *testing.B) {
	db := pgenv.Migrated(b, pgstore.Options{})
	s := pgenv.Store(b, db, pgstore.Options{})
	plain := plainInsert(b, db)
	b.Run("claim+complete", func(b *testing.B) {
		parallel(b, func(id string) error {
			key := guard.Key{Scope: "bench", ID: id}
			tok := "t" + id
			out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			if err != nil || out.Status != guard.Acquired {
				return fmt.Errorf("claim: %v %v", out.Status, err)
			}
			return s.Complete(ctx, guard.Lease{Key: key, Token: tok}, []byte("ok"), time.Hour)
		})
	})
	b.Run("plain-insert-on-conflict", func(b *testing.B) { parallel(b, plain) })
}

// onRedisFixture is what the benchmarks of the backstop on Redis share: a
// migrated database with a business table, a backstop, a Redis store, a
// plain INSERT … ON CONFLICT DO NOTHING, the business insert, and a guard.Func
// that makes it in a transaction of its own (no backstop row).
func onRedisFixture(b *testing.B) (*sql.DB, *backstop.Backstop, *guard.RedisStore, func(string) error,
	func(context.Context, *sql.Tx, guard.Lease) ([]byte, error), guard.Func) {
	db := pgenv.Migrated(b, pgstore.Options{})
	pgenv.PaymentsTable(b, db)
	bs := mustBackstop(b, db, pgstore.Options{})
	rs := guardenv.Store(b, guard.RedisOptions{})
	plain := plainInsert(b, db)
	business := func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence)
		return []byte("ok"), err
	}
	plainTx := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		res, err := business(ctx, tx, l)
		if err != nil {
			return nil, err
		}
		return res, tx.Commit()
	}
	return db, bs, rs, plain, business, plainTx
}

// BenchmarkBackstopOnRedis: what the backstop adds to Guard.Do on Redis.
// Each effect inserts one business row in a transaction; "commit" adds the
// backstop row to that transaction (Backstop.Func), "guarded" also marks
// the holder at claim time (Wrap). Beside them, Guard.Do with no
// database at all, and a plain INSERT … ON CONFLICT DO NOTHING.
func BenchmarkBackstopOnRedis(b *testing.B) {
	_, bs, rs, plain, business, plainTx := onRedisFixture(b)
	do := func(g *guard.Guard, name string, fn guard.Func) func(string) error {
		return func(id string) error {
			_, err := g.Do(ctx, guard.Key{Scope: name, ID: id}, "fp", fn)
			return err
		}
	}
	onRedis := guard.New(rs, guard.Options{})
	guarded := guard.New(backstop.Wrap(rs, bs), guard.Options{})
	b.Run("redis-do-no-db", func(b *testing.B) {
		parallel(b, do(onRedis, "nodb", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }))
	})
	b.Run("redis-do+tx", func(b *testing.B) { parallel(b, do(onRedis, "tx", plainTx)) })
	b.Run("redis-do+tx+commit", func(b *testing.B) { parallel(b, do(onRedis, "commit", bs.Func("fp", business))) })
	b.Run("guarded-do+tx+commit", func(b *testing.B) { parallel(b, do(guarded, "guarded", bs.Func("fp", business))) })
	b.Run("plain-insert-on-conflict", func(b *testing.B) { parallel(b, plain) })
}

// BenchmarkInterleaved runs the variants of the two benchmarks above
// interleaved, call by call, from the same 16 goroutines, so every variant
// meets the same load (this machine is shared) and their ratios are
// comparable. It reports each variant's mean latency in µs.
func BenchmarkInterleaved(b *testing.B) {
	db, bs, rs, plain, business, plainTx := onRedisFixture(b)
	s := pgenv.Store(b, db, pgstore.Options{})
	onRedis := guard.New(rs, guard.Options{})
	guarded := guard.New(backstop.Wrap(rs, bs), guard.Options{})
	do := func(g *guard.Guard, scope string, fn guard.Func) func(string) error {
		return func(id string) error {
			_, err := g.Do(ctx, guard.Key{Scope: scope, ID: id}, "fp", fn)
			return err
		}
	}
	variants := []struct {
		name string
		op   func(string) error
	}{
		{"plain-insert-us", plain},
		{"pgstore-claim+complete-us", func(id string) error {
			key := guard.Key{Scope: "pg", ID: id}
			out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: id, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			if err != nil || out.Status != guard.Acquired {
				return fmt.Errorf("claim: %v %v", out.Status, err)
			}
			return s.Complete(ctx, guard.Lease{Key: key, Token: id}, []byte("ok"), time.Hour)
		}},
		{"redis-do+tx-us", do(onRedis, "tx", plainTx)},
		{"redis-do+tx+commit-us", do(onRedis, "commit", bs.Func("fp", business))},
		{"guarded-do+tx+commit-us", do(guarded, "guarded", bs.Func("fp", business))},
	}
	total := make([]atomic.Int64, len(variants))
	count := make([]atomic.Int64, len(variants))
	var n atomic.Int64
	prefix := rand.Text()[:10]
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			v := int(i) % len(variants)
			start := time.Now()
			if err := variants[v].op(fmt.Sprint(prefix, i)); err != nil {
				b.Error(err)
				return
			}
			total[v].Add(int64(time.Since(start)))
			count[v].Add(1)
		}
	})
	for v := range variants {
		if c := count[v].Load(); c > 0 {
			b.ReportMetric(float64(total[v].Load())/float64(c)/1e3, variants[v].name)
		}
	}
}
