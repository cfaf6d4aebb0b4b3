package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// A batch of payouts: the claims go out together, each payout runs under
// its own lease, and the results are stored together. A payout that
// fails is recorded as failed alone; one already made replays.
func ExampleGuard_DoBatch() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	if err := store.LoadScripts(context.Background()); err != nil {
		log.Fatal(err)
	}
	g := guard.New(store, guard.Options{})
	ctx := context.Background()

	// payout-2 was made before.
	if _, err := g.Do(ctx, guard.Key{Scope: "payouts", ID: "payout-2"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("paid earlier"), nil
	}); err != nil {
		log.Fatal(err)
	}
	items := []guard.BatchItem{
		{Key: guard.Key{Scope: "payouts", ID: "payout-1"}, Fingerprint: "fp"},
		{Key: guard.Key{Scope: "payouts", ID: "payout-2"}, Fingerprint: "fp"},
		{Key: guard.Key{Scope: "payouts", ID: "payout-3"}, Fingerprint: "fp"},
	}
	res := g.DoBatch(ctx, items, func(ctx context.Context, i int, lease guard.Lease) ([]byte, error) {
		if i == 2 {
			return nil, errors.New("bank declined")
		}
		return fmt.Appendf(nil, "paid at fence %d", lease.Fence), nil
	}, guard.BatchOptions{Concurrency: 4})
	for i, r := range res {
		fmt.Printf("%s: %s replayed=%v err=%v\n", items[i].Key.ID, r.Value, r.Replayed, r.Err)
	}
	rec, _ := g.Get(ctx, items[2].Key)
	fmt.Println(items[2].Key.ID, "is", rec.State)
	// Output:
	// payout-1: paid at fence 1 replayed=false err=<nil>
	// payout-2: paid earlier replayed=true err=<nil>
	// payout-3:  replayed=false err=bank declined
	// payout-3 is failed
}

// The BatchStore calls DoBatch makes, for callers that drive the steps
// themselves: one round trip claims every key, one ends every claim.
func ExampleRedisStore_ClaimBatch() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	ctx := context.Background()

	var reqs []guard.ClaimRequest
	for _, id := range []string{"a", "b"} {
		reqs = append(reqs, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: id}, Token: "holder-" + id,
			Fingerprint: "fp", Lease: 30 * time.Second, TTL: time.Hour})
	}
	out, errs := store.ClaimBatch(ctx, reqs)
	var ws []guard.Write
	for i := range out {
		fmt.Println(reqs[i].Key.ID, out[i].Status, errs[i])
		ws = append(ws, guard.Write{Kind: guard.WriteComplete, Lease: out[i].Lease, Result: []byte("done"), TTL: time.Hour})
	}
	fmt.Println(store.WriteBatch(ctx, ws))
	out, _ = store.ClaimBatch(ctx, reqs)
	fmt.Println(out[0].Status, string(out[0].Result))
	// Output:
	// a acquired <nil>
	// b acquired <nil>
	// [<nil> <nil>]
	// replay done
}
