package guard_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// Count the keys a store holds in each state, as idemguard list does,
// without knowing how the store names or encodes its records.
func ExampleRedisStore_ScanRecords() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	ctx := context.Background()
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		req := guard.ClaimRequest{Key: guard.Key{Scope: "payments", ID: id}, Token: "T-" + id, Fingerprint: "fp",
			Lease: time.Minute, TTL: time.Hour}
		if _, err := store.Claim(ctx, req); err != nil {
			log.Fatal(err)
		}
		if id != "order-3" {
			if err := store.Complete(ctx, guard.Lease{Key: req.Key, Token: req.Token}, []byte("ok"), time.Hour); err != nil {
				log.Fatal(err)
			}
		}
	}

	states := map[guard.State]int{}
	err = store.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
		if err != nil {
			fmt.Println("unreadable:", name, err)
			return true
		}
		states[rec.State]++
		return true
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("completed:", states[guard.StateCompleted], "pending:", states[guard.StatePending])
	// Output:
	// completed: 2 pending: 1
}

// traced is a wrapper of the kind promx's Metrics.Store is: it forwards
// guard.DeadlineStore, so a fallback.Store over it still runs the
// primary's calls on the caller's goroutine.
type traced struct{ guard.Store }

func (t traced) HonoursDeadline() bool {
	ds, ok := t.Store.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}

// A RedisStore honours its calls' deadlines when its go-redis client
// enforces them (ContextTimeoutEnabled); a wrapper forwards the answer.
func ExampleDeadlineStore() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	plain := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer plain.Close()
	bounded := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer bounded.Close()

	for _, s := range []guard.Store{
		guard.NewRedisStore(plain, guard.RedisOptions{}),
		traced{guard.NewRedisStore(bounded, guard.RedisOptions{})},
	} {
		ds, ok := s.(guard.DeadlineStore)
		fmt.Println(ok && ds.HonoursDeadline())
	}
	// Output:
	// false
	// true
}
