package redisstream

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Entry 1-1 has no live holder: an earlier attempt failed (attempts
// left), or its holder's lease ran out. Consumer a is handed it again (its
// read answered, its claim on the way) when the entry is trimmed, and
// consumer b's reclaim pass finds it deleted (its holder's attempt
// recorded failed, when the lease ran out). a then claims the failed
// record, runs the effect and completes it: b must not have dead-lettered
// the entry meanwhile (a re-drive of the dead letter would run the effect
// a second time), as it does not for an entry with no record yet.
func TestDeletedEntryFailedRetriedElsewhereNotDeadLettered(t *testing.T) {
	for _, earlier := range []string{"failed", "lease run out"} {
		t.Run(earlier, func(t *testing.T) { deletedRetriedElsewhere(t, earlier == "failed") })
	}
}

func deletedRetriedElsewhere(t *testing.T, failed bool) {
	opts := guard.Options{}
	if !failed {
		opts.Lease = 200 * time.Millisecond // the earlier holder's, run out below
	}
	e := newEnv(t, opts)
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	gate := &readGate{consumer: "a", read: make(chan struct{}), open: make(chan struct{})}
	e.rdb.AddHook(gate)
	var ran atomic.Int32
	a := e.consumer(func(context.Context, consumerx.Message) error {
		ran.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "a"})
	// The earlier attempt (1 of 5): failed, or its holder gone.
	key, err := a.Processor().Key(consumerx.Message{ID: ID(stream, "1-1")})
	if err != nil {
		t.Fatal(err)
	}
	held, err := e.g.Claim(ctx, key, defaultFingerprint("charge 1"))
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", held, err)
	}
	if failed {
		if err := e.g.Fail(ctx, held.Lease, errors.New("card service down")); err != nil {
			t.Fatal(err)
		}
	} else {
		testenv.WaitFor(t, 10*time.Second, "the earlier holder's lease to run out", func() bool {
			rec, err := e.g.Get(ctx, key)
			return err == nil && rec.State == guard.StatePending && rec.LeaseLeft == 0
		})
	}
	b := &passes{consumer: "b"}
	e.rdb.AddHook(b)
	dead := &deadLetters{}
	bc := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: 5 * time.Second, ClaimEvery: 10 * time.Millisecond,
			Process: consumerx.Options{DeadLetter: dead.hook}})
	stopA := e.run(a)
	<-gate.read // a has read 1-1 and not claimed it yet
	stopB := deleteThenReclaim(t, e, stream, bc, b)
	close(gate.open)
	testenv.WaitFor(t, 10*time.Second, "a's effect completed", func() bool {
		rec, err := e.g.Get(ctx, key)
		return err == nil && rec.State == guard.StateCompleted
	})
	b.wait(t, 2)
	stopB()
	stopA()
	if ran.Load() != 1 {
		t.Fatalf("effect ran %d times", ran.Load())
	}
	if n := dead.len(); n != 0 {
		t.Errorf("the effect completed, yet the entry was dead-lettered: %v (%v)", dead.ids, dead.causes)
	}
}
