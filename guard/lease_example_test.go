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

// The lease a claim hands out ends, by the client's clock, a margin
// before the server's: Deadline = sent + Lease − LeaseMargin(Lease).
// KeepAlive (and Do) extend it and cancel the effect's context then.
func ExampleLeaseMargin() {
	for _, lease := range []time.Duration{900 * time.Millisecond, 30 * time.Second} {
		fmt.Printf("lease %s: margin %s, context ends %s after the claim was sent\n",
			lease, guard.LeaseMargin(lease), lease-guard.LeaseMargin(lease))
	}
	// Output:
	// lease 900ms: margin 11ms, context ends 889ms after the claim was sent
	// lease 30s: margin 302ms, context ends 29.698s after the claim was sent
}

// A holder that hangs is stopped after MaxRun: its context is cancelled
// with ErrMaxRun, and the key can be claimed again once the lease has run
// out.
func ExampleOptions_maxRun() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}),
		guard.Options{Lease: 3 * time.Second, MaxRun: 50 * time.Millisecond})

	_, err = g.Do(context.Background(), guard.Key{Scope: "jobs", ID: "report-7"}, "fp",
		func(ctx context.Context, lease guard.Lease) ([]byte, error) {
			<-ctx.Done() // a stuck call that honours its context
			return nil, context.Cause(ctx)
		})
	fmt.Println(errors.Is(err, guard.ErrMaxRun), errors.Is(err, guard.ErrLeaseLost))
	// Output: true true
}
