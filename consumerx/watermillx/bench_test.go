package watermillx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// BenchmarkConsume measures messages per second through a Watermill
// router, with the middleware (the guard on the real Redis) and without,
// 16 handlers of one group competing for an in-process queue, in one run.
// Watermill hands a middleware one message at a time, so each message
// costs its own claim and completion (two round trips, shared with other
// handlers' through the store's autopipeliner past 8 calls at once);
// nothing is batched. Compare the msgs/s metrics; allocs/op is per
// message.
//
//	go test -run XXX -bench Consume -benchtime 20000x -benchmem ./consumerx/watermillx/
func BenchmarkConsume(b *testing.B) {
	const consumers = 16
	for _, mode := range []string{"plain", "guard"} {
		b.Run(mode, func(b *testing.B) {
			g, rdb, _ := consumertest.Guard(b, guard.Options{})
			q := newQueue(b.N)
			for i := range b.N {
				_ = q.Publish("orders", message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "message %d", i)))
			}
			r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
			if err != nil {
				b.Fatal(err)
			}
			mw, err := New(g, Options{Group: "bench", Process: consumerx.Options{Logger: testenv.Logger(b)}})
			if err != nil {
				b.Fatal(err)
			}
			var handled atomic.Int64
			for c := range consumers {
				h := r.AddConsumerHandler(fmt.Sprint("bench-", c), "orders", q, func(*message.Message) error {
					handled.Add(1)
					return nil
				})
				if mode == "guard" {
					h.AddMiddleware(mw.Middleware)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			m := consumertest.StartMeter(rdb)
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()
			for handled.Load() < int64(b.N) {
				time.Sleep(time.Millisecond) // polling for the end of the run
			}
			m.Report(b, b.N)
			b.StopTimer()
			if err := r.Close(); err != nil {
				b.Error(err)
			}
			<-done
			_ = q.Close()
		})
	}
}
