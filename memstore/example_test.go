package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// In a unit test: the code under test takes a guard.Store, and the test
// gives it a memstore instead of a Redis.
func Example() {
	store := memstore.New(memstore.Options{})
	g := guard.New(store, guard.Options{})

	charges := 0
	charge := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		charges++
		return []byte(`{"charge":"ch_1"}`), nil
	}
	key := guard.Key{Scope: "tenant-42/POST /charges", ID: "retry-safe-key"}
	for range 3 { // the client retries twice
		res, err := g.Do(context.Background(), key, "sha256-of-request", charge)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
	}
	fmt.Println("charges:", charges)
	// Output:
	// {"charge":"ch_1"} replayed=false
	// {"charge":"ch_1"} replayed=true
	// {"charge":"ch_1"} replayed=true
	// charges: 1
}

// A test clock makes a crashed holder's lease run out without sleeping:
// the next caller recovers the key with a higher fence, and the old
// holder can no longer write.
func ExampleNew() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	g := guard.New(store, guard.Options{Lease: 30 * time.Second})
	ctx := context.Background()
	key := guard.Key{Scope: "orders", ID: "order-7"}

	crashed, _ := g.Claim(ctx, key, "fp") // a worker takes the key and dies
	now = now.Add(30 * time.Second)       // its lease runs out

	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		fmt.Printf("fence %d, attempt %d, recovered %v\n", l.Fence, l.Attempt, l.Recovered)
		return []byte("shipped"), nil
	})
	fmt.Println(string(res.Value), err)
	err = g.Complete(ctx, crashed.Lease, []byte("late"))
	fmt.Println(errors.Is(err, guard.ErrLeaseLost))
	// Output:
	// fence 2, attempt 2, recovered true
	// shipped <nil>
	// true
}

// A bounded store refuses new keys when full, before any effect runs; it
// never forgets a key it holds to make room.
func ExampleOptions_maxRecords() {
	store := memstore.New(memstore.Options{MaxRecords: 1})
	g := guard.New(store, guard.Options{})
	ctx := context.Background()
	send := func(ctx context.Context, l guard.Lease) ([]byte, error) { return []byte("sent"), nil }

	_, err := g.Do(ctx, guard.Key{Scope: "mail", ID: "1"}, "fp", send)
	fmt.Println(err)
	_, err = g.Do(ctx, guard.Key{Scope: "mail", ID: "2"}, "fp", send)
	fmt.Println(errors.Is(err, memstore.ErrFull), errors.Is(err, guard.ErrUnavailable))
	fmt.Println(store.Stats().Records)
	// Output:
	// <nil>
	// true true
	// 1
}
