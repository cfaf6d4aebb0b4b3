package redisstream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The consumer's client is closed between its batch's claims and its
// XACK (the guard's store on a client of its own): Run returns an error
// matching redis.ErrClosed rather than retrying a client that never
// opens again, and the entries it had not acknowledged are taken over
// by another consumer, found done, and acknowledged: each effect once.
func TestClosedClientStopsRun(t *testing.T) {
	const n = 5
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := range n {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	own := redis.NewClient(&redis.Options{Addr: e.rdb.Options().Addr})
	var effects atomic.Int32
	started, release := make(chan struct{}, n), make(chan struct{})
	c, err := New(own, e.g, func(ctx context.Context, msg consumerx.Message) error {
		started <- struct{}{}
		<-release
		effects.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "a", Block: 50 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started // the batch is claimed and its first handler runs
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, redis.ErrClosed) {
			t.Errorf("Run returned %v after its client was closed, want an error matching redis.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10s after its client was closed")
	}
	if n := pending(t, e.rdb, stream, "billing"); n != 5 {
		t.Fatalf("XPENDING = %d once the closed consumer stopped, want its 5 entries", n)
	}
	b := e.consumer(func(context.Context, consumerx.Message) error { effects.Add(1); return nil }, Options{
		Stream: stream, Group: "billing", Consumer: "b", MinIdle: time.Millisecond, ClaimEvery: 20 * time.Millisecond})
	stop := e.run(b)
	testenv.WaitFor(t, 10*time.Second, "the closed consumer's entries taken over and acknowledged", func() bool {
		return pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	if got := effects.Load(); got != n {
		t.Errorf("%d effects, want %d", got, n)
	}
}
