package fallback_test

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// BenchmarkClaimComplete measures one claim and one complete of a fresh
// key on the real Redis: straight on the RedisStore, through a closed
// fallback (breaker + bounded call), and through a fallback in its
// switch-back window (each acquisition also reads the Postgres secondary).
func BenchmarkClaimComplete(b *testing.B) {
	rdb := testenv.Redis(b)
	direct := guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(b)})
	if err := direct.LoadScripts(bg); err != nil {
		b.Fatal(err)
	}
	// A client that ends calls by their context's deadline: the fallback
	// calls it on the caller's goroutine.
	ctxClient := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b), PoolSize: 64, ContextTimeoutEnabled: true})
	defer ctxClient.Close()
	ctxDirect := guard.NewRedisStore(ctxClient, guard.RedisOptions{Prefix: testenv.Prefix(b)})
	run := func(b *testing.B, s guard.Store) {
		prefix := rand.Text()[:8]
		var n atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(16) // 32 goroutines on 2 cores: a server's concurrency
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := guard.Key{Scope: "bench", ID: fmt.Sprintf("%s-%d", prefix, n.Add(1))}
				out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Minute})
				if err != nil || out.Status != guard.Acquired {
					b.Errorf("claim: %v %v", out.Status, err)
					return
				}
				if err := s.Complete(bg, guard.Lease{Key: key, Token: "T"}, []byte("ok"), time.Minute); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("redis", func(b *testing.B) { run(b, direct) })
	b.Run("fallback", func(b *testing.B) { run(b, newStore(b, direct, fallback.Options{Logger: quiet})) })
	b.Run("redis-ctx-timeouts", func(b *testing.B) { run(b, ctxDirect) })
	b.Run("fallback-ctx-timeouts", func(b *testing.B) { run(b, newStore(b, ctxDirect, fallback.Options{Logger: quiet})) })
	b.Run("fallback-checking-secondary", func(b *testing.B) {
		pg, _ := pgStore(b)
		s := newStore(b, direct, fallback.Options{Policy: fallback.Secondary, Secondary: pg, Logger: quiet,
			SecondaryTimeout: 10 * time.Second})
		s.ConsultSecondary(time.Now().Add(time.Hour))
		run(b, s)
	})
}
