package redisstream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// BenchmarkConsume measures messages per second through the adapter on the
// real Redis, with the guard and with the bare handler (the same loop,
// XREADGROUP of 16 and one XACK per batch, without the batch's claims and
// completions), with the same 16 consumers in one run, each running 1 or 8
// entries of a batch at once. The floor rows run the bare handler between
// one pipeline of SET NX and one of SET per batch (consumertest.Floor): the
// most a guard making those two round trips could reach. Compare the
// msgs/s metrics; allocs/op is per message.
//
//	go test -run XXX -bench Consume -benchtime 20000x -benchmem ./consumerx/redisstream/
func BenchmarkConsume(b *testing.B) {
	for _, bc := range []struct {
		mode        string
		concurrency int
	}{{"plain", 1}, {"floor", 1}, {"guard", 1}, {"plain", 8}, {"floor", 8}, {"guard", 8}} {
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
				c, err := New(rdb, g, h, Options{Stream: stream, Group: "bench", Consumer: fmt.Sprint(i), Count: 16,
					Block: 50 * time.Millisecond, Concurrency: bc.concurrency, Process: consumerx.Options{Logger: testenv.Logger(b)}})
				if err != nil {
					b.Fatal(err)
				}
				cs[i] = c
			}
			b.ReportAllocs()
			b.ResetTimer()
			m := consumertest.StartMeter(rdb)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{}, consumers)
			for _, c := range cs {
				batch := c.guarded
				switch mode {
				case "plain":
					batch = plain(h, bc.concurrency)
				case "floor":
					batch = consumertest.Floor(b, rdb, prefix, plain(h, bc.concurrency))
				}
				go func() { _ = c.loop(runCtx, batch); done <- struct{}{} }()
			}
			for handled.Load() < int64(b.N) || benchPending(rdb, stream) != 0 {
				time.Sleep(time.Millisecond) // polling for the end of the run
			}
			m.Report(b, b.N)
			b.StopTimer()
			cancel()
			for range consumers {
				<-done
			}
		})
	}
}

// plain runs a batch through the bare handler, concurrency at once, and
// acknowledges every entry: the adapter's loop without the guard.
func plain(h consumerx.Handler, concurrency int) batchFunc {
	return func(ctx context.Context, msgs []consumerx.Message) []bool {
		acked := make([]bool, len(msgs))
		sem := make(chan struct{}, concurrency)
		var wg sync.WaitGroup
		for i := range msgs {
			if concurrency == 1 {
				acked[i] = h(ctx, msgs[i]) == nil
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				acked[i] = h(ctx, msgs[i]) == nil
			})
		}
		wg.Wait()
		return acked
	}
}

func benchPending(rdb *redis.Client, stream string) int64 {
	p, err := rdb.XPending(context.Background(), stream, "bench").Result()
	if err != nil {
		return -1
	}
	return p.Count
}
