package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// BenchmarkDo: Guard.Do on a memstore from GOMAXPROCS goroutines: fresh
// keys (claim + complete) and replays of a completed key; the store's
// claim + complete without the Guard; and a baseline that only inserts
// into a map under a mutex (the least an in-memory guard must do).
//
//	go test -run '^$' -bench . -benchmem ./memstore
func BenchmarkDo(b *testing.B) {
	result := make([]byte, 200)
	fn := func(context.Context, guard.Lease) ([]byte, error) { return result, nil }
	var seq atomic.Int64

	b.Run("fresh", func(b *testing.B) {
		g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := guard.Key{Scope: "bench", ID: fmt.Sprint(seq.Add(1))}
				if _, err := g.Do(context.Background(), key, "fp", fn); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("replay", func(b *testing.B) {
		g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
		key := guard.Key{Scope: "bench", ID: "replayed"}
		if _, err := g.Do(context.Background(), key, "fp", fn); err != nil {
			b.Fatal(err)
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if res, err := g.Do(context.Background(), key, "fp", fn); err != nil || !res.Replayed {
					b.Error(res, err)
					return
				}
			}
		})
	})
	b.Run("store-claim-complete", func(b *testing.B) { // the store alone, without the Guard's timers and contexts
		s := memstore.New(memstore.Options{})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := guard.Key{Scope: "bench", ID: fmt.Sprint(seq.Add(1))}
				r := guard.ClaimRequest{Key: key, Token: "tok", Fingerprint: "fp", Lease: guard.DefaultLease, TTL: guard.DefaultTTL}
				if _, err := s.Claim(context.Background(), r); err != nil {
					b.Error(err)
					return
				}
				if err := s.Complete(context.Background(), guard.Lease{Key: key, Token: "tok"}, result, guard.DefaultTTL); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("baseline-mutex-map", func(b *testing.B) {
		var mu sync.Mutex
		m := map[guard.Key][]byte{}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				key := guard.Key{Scope: "bench", ID: fmt.Sprint(seq.Add(1))}
				mu.Lock()
				if _, ok := m[key]; !ok {
					m[key] = append([]byte{}, result...)
				}
				mu.Unlock()
			}
		})
	})
}
