package jetstreamx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// BenchmarkConsume measures messages per second through Consume on an
// embedded nats-server (its CPU counts as the client's), with the guard on
// the real Redis and with the bare handler (the same loop: fetches of 16,
// one ack per message; without the claims and completions), 16 Consume
// loops on one durable consumer, in one run. Compare the msgs/s metrics;
// allocs/op is per message.
//
//	go test -run XXX -bench Consume -benchtime 20000x -benchmem ./consumerx/jetstreamx/
func BenchmarkConsume(b *testing.B) {
	const consumers = 16
	for _, mode := range []string{"plain", "guard"} {
		b.Run(mode, func(b *testing.B) {
			g, rdb, _ := consumertest.Guard(b, guard.Options{})
			js, stop := startNATS(b)
			defer stop()
			ctx := context.Background()
			stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
			if err != nil {
				b.Fatal(err)
			}
			cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
				Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1,
			})
			if err != nil {
				b.Fatal(err)
			}
			for i := range b.N {
				if _, err := js.PublishAsync("orders.1", fmt.Appendf(nil, "message %d", i)); err != nil {
					b.Fatal(err)
				}
			}
			<-js.PublishAsyncComplete()
			var handled atomic.Int64
			h := func(context.Context, consumerx.Message) error { handled.Add(1); return nil }
			hd, err := New(g, h, Options{Group: "bench", Batch: 16, MaxWait: 50 * time.Millisecond,
				Process: consumerx.Options{Logger: testenv.Logger(b)}})
			if err != nil {
				b.Fatal(err)
			}
			run := batchFunc(hd.guarded)
			if mode == "plain" {
				run = consumertest.Plain(h)
			}
			b.ReportAllocs()
			b.ResetTimer()
			m := consumertest.StartMeter(rdb)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{}, consumers)
			for range consumers {
				go func() { _ = hd.consume(runCtx, cons, run); done <- struct{}{} }()
			}
			for handled.Load() < int64(b.N) {
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
