package guard_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// BenchmarkDoBatch measures DoBatch of 16 fresh keys on the real Redis,
// one batch at a time, against the store's two pipelines alone
// (ClaimBatch and WriteBatch) and against the bare pipelines of the same
// native commands (SET NX GET, SET): what each layer costs per key.
//
//	go test -run XXX -bench DoBatch -benchmem ./guard/
func BenchmarkDoBatch(b *testing.B) {
	const size = 16
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b)})
	defer c.Close()
	s := guardenv.StoreOn(b, c, guard.RedisOptions{})
	g := guard.New(s, guard.Options{})
	ctx := context.Background()
	next := 0
	items := func() []guard.BatchItem {
		it := make([]guard.BatchItem, size)
		for i := range it {
			next++
			it[i] = guard.BatchItem{Key: guard.Key{Scope: "bench", ID: strconv.Itoa(next)}, Fingerprint: "fp"}
		}
		return it
	}
	fn := func(context.Context, int, guard.Lease) ([]byte, error) { return value, nil }
	per := func(b *testing.B) { b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/key") }
	b.Run("DoBatch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, r := range g.DoBatch(ctx, items(), fn, guard.BatchOptions{}) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
		per(b)
	})
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			it := items()
			reqs := make([]guard.ClaimRequest, size)
			for i := range reqs {
				reqs[i] = guard.ClaimRequest{Key: it[i].Key, Token: "ABCDEFGHIJKLMNOPQRSTUVWXYZ", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			}
			out, errs := s.ClaimBatch(ctx, reqs)
			ws := make([]guard.Write, size)
			for i := range ws {
				if errs[i] != nil {
					b.Fatal(errs[i])
				}
				ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: out[i].Lease, Result: value, TTL: time.Hour}
			}
			for _, err := range s.WriteBatch(ctx, ws) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		per(b)
	})
	b.Run("native", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			it := items()
			if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range it {
					p.SetNX(ctx, s.Name(it[i].Key), "pending", time.Minute)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range it {
					p.Set(ctx, s.Name(it[i].Key), value, time.Hour)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		per(b)
	})
}
