package redisstream

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// BenchmarkConsume measures messages per second through the adapter on the
// real Redis, with the guard and with the bare handler (the same loop,
// XREADGROUP and batched XACK, without claim and complete), with the same
// 16 consumers in one run, each running 1 or 8 entries of a batch at once.
// Compare the msgs/s metrics.
func BenchmarkConsume(b *testing.B) {
	for _, bc := range []struct {
		mode        string
		concurrency int
	}{{"plain", 1}, {"guard", 1}, {"plain", 8}, {"guard", 8}} {
		mode := bc.mode
		b.Run(fmt.Sprintf("%s/concurrency=%d", mode, bc.concurrency), func(b *testing.B) {
			g, rdb, prefix := consumertest.Guard(b, guard.Options{})
			ctx := context.Background()
			stream := prefix + "bench"
			pipe := rdb.Pipeline()
			for i := range b.N {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", fmt.Sprintf("message %d", i)}})
				if pipe.Len() == 1000 {
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			var handled atomic.Int64
			h := func(context.Context, consumerx.Message) error { handled.Add(1); return nil }
			const consumers = 16
			cs := make([]*Consumer, consumers)
			for i := range cs {
				c, err := New(rdb, g, h, Options{Stream: stream, Group: "bench", Consumer: fmt.Sprint(i),
					Block: 50 * time.Millisecond, Concurrency: bc.concurrency, Process: consumerx.Options{Logger: consumertest.Quiet}})
				if err != nil {
					b.Fatal(err)
				}
				if mode == "plain" {
					c.process = func(ctx context.Context, msg consumerx.Message) (consumerx.Outcome, error) {
						return consumerx.Processed, h(ctx, msg)
					}
				}
				cs[i] = c
			}
			b.ResetTimer()
			start := time.Now()
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{}, consumers)
			for _, c := range cs {
				go func() { _ = c.Run(runCtx); done <- struct{}{} }()
			}
			for handled.Load() < int64(b.N) || benchPending(rdb, stream) != 0 {
				time.Sleep(time.Millisecond) // polling for the end of the run
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			for range consumers {
				<-done
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

func benchPending(rdb *redis.Client, stream string) int64 {
	p, err := rdb.XPending(context.Background(), stream, "bench").Result()
	if err != nil {
		return -1
	}
	return p.Count
}
