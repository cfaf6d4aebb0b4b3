package redisstream

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Options.Block "bounds how long Run takes to return after ctx is
// cancelled". A Block under a millisecond (500µs, a fast poll) was sent as
// BLOCK 0, which Redis reads as "wait for ever": an idle consumer sat in
// XREADGROUP until go-redis's read timeout (Block + 10s) cut it, and Run
// returned only then.
func TestBlockUnderAMillisecondBoundsRun(t *testing.T) {
	e := newEnv(t, guard.Options{})
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: e.prefix + "idle", Group: "g", Consumer: "c", Block: 500 * time.Microsecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "the group created", func() bool {
		g, err := e.rdb.XInfoGroups(context.Background(), e.prefix+"idle").Result()
		return err == nil && len(g) == 1
	})
	time.Sleep(100 * time.Millisecond) // not for sync: the consumer is then in XREADGROUP, or about to be
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		t.Logf("Run returned %v after cancel", time.Since(start))
	case <-time.After(3 * time.Second):
		<-done
		t.Fatalf("Run with Block 500µs returned %v after its context was cancelled, want well under 3s", time.Since(start).Round(time.Millisecond))
	}
}
