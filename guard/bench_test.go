package guard_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// benchStores runs b over miniredis and, when IDEMGUARD_REDIS_ADDR is set,
// a real Redis.
func benchStores(b *testing.B, run func(b *testing.B, g *guard.Guard)) {
	b.Run("miniredis", func(b *testing.B) {
		mr := miniredis.RunT(b)
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolSize: 64})
		defer c.Close()
		s := guard.NewRedisStore(c, guard.RedisOptions{})
		_ = s.LoadScripts(context.Background())
		run(b, guard.New(s, guard.Options{}))
	})
	b.Run("redis", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b), PoolSize: 64})
		defer c.Close()
		s := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(b)})
		if err := s.LoadScripts(context.Background()); err != nil {
			b.Fatal(err)
		}
		run(b, guard.New(s, guard.Options{}))
	})
}

var value = []byte(`{"id":"ord_123","status":"created"}`)

func effect(context.Context, guard.Lease) ([]byte, error) { return value, nil }

// BenchmarkDoFresh: claim + complete of a new key per operation.
func BenchmarkDoFresh(b *testing.B) {
	benchStores(b, func(b *testing.B, g *guard.Guard) {
		var n atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := guard.Key{Scope: "bench", ID: strconv.FormatInt(n.Add(1), 10)}
				if _, err := g.Do(context.Background(), key, "fp", effect); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkDoReplay: a replay of a completed key per operation.
func BenchmarkDoReplay(b *testing.B) {
	benchStores(b, func(b *testing.B, g *guard.Guard) {
		key := guard.Key{Scope: "bench", ID: "replayed"}
		if _, err := g.Do(context.Background(), key, "fp", effect); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				res, err := g.Do(context.Background(), key, "fp", effect)
				if err != nil || !res.Replayed {
					b.Fatal(res, err)
				}
			}
		})
	})
}
