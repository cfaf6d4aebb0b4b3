package kafkax

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// BenchmarkConsume measures records per second through the adapter on an
// in-process kfake broker (its CPU counts as the client's), with the guard
// on the real Redis and with the bare handler (the same loop: polls of at
// most 16 records, partitions at once, one commit per poll; without the
// claims and completions), 16 group members on 16 partitions, in one run.
// The floor row runs the bare handler between one pipeline of SET NX and
// one of SET per poll (consumertest.Floor): the most a guard making those
// two round trips could reach. Compare the msgs/s metrics; allocs/op is
// per record.
//
//	go test -run XXX -bench Consume -benchtime 20000x -benchmem ./consumerx/kafkax/
func BenchmarkConsume(b *testing.B) {
	const members = 16
	for _, mode := range []string{"plain", "floor", "guard"} {
		b.Run(mode, func(b *testing.B) {
			g, rdb, prefix := consumertest.Guard(b, guard.Options{})
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(members, "orders"))
			if err != nil {
				b.Fatal(err)
			}
			defer cluster.Close()
			addrs := cluster.ListenAddrs()
			producer, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			if err != nil {
				b.Fatal(err)
			}
			defer producer.Close()
			ctx := context.Background()
			recs := make([]*kgo.Record, 0, 1000)
			for i := range b.N {
				recs = append(recs, &kgo.Record{Topic: "orders", Value: fmt.Appendf(nil, "message %d", i)})
				if len(recs) == cap(recs) || i == b.N-1 {
					if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
						b.Fatal(err)
					}
					recs = recs[:0]
				}
			}
			var handled, batches atomic.Int64
			h := func(context.Context, consumerx.Message) error { handled.Add(1); return nil }
			clients := make([]*kgo.Client, members)
			cs := make([]*Consumer, members)
			for i := range cs {
				clients[i], err = kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("bench"), kgo.ConsumeTopics("orders"),
					kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(50*time.Millisecond),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				if err != nil {
					b.Fatal(err)
				}
				cs[i], err = New(clients[i], g, h, Options{MaxPollRecords: 16, Process: consumerx.Options{Logger: testenv.Logger(b)}})
				if err != nil {
					b.Fatal(err)
				}
			}
			batch := func(c *Consumer) batchFunc {
				inner := batchFunc(c.guarded)
				switch mode {
				case "plain":
					inner = consumertest.Plain(h)
				case "floor":
					inner = consumertest.Floor(b, rdb, prefix, consumertest.Plain(h))
				}
				return func(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult {
					batches.Add(1)
					return inner(ctx, msgs)
				}
			}
			// The members join with fetching paused; the clock starts once
			// the group is stable, every member with a partition.
			for _, cl := range clients {
				cl.PauseFetchTopics("orders")
			}
			runCtx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Go(func() { _ = c.loop(runCtx, batch(c)) })
			}
			adm := kadm.NewClient(producer)
			testenv.WaitFor(b, time.Minute, "the group to settle, every member with a partition", func() bool {
				groups, err := adm.DescribeGroups(ctx, "bench")
				if err != nil {
					return false
				}
				d := groups["bench"]
				if d.State != "Stable" || len(d.Members) != members {
					return false
				}
				for _, mb := range d.Members {
					if a, ok := mb.Assigned.AsConsumer(); !ok || len(a.Topics) == 0 {
						return false
					}
				}
				return true
			})
			b.ReportAllocs()
			b.ResetTimer()
			m := consumertest.StartMeter(rdb)
			for _, cl := range clients {
				cl.ResumeFetchTopics("orders")
			}
			for handled.Load() < int64(b.N) {
				time.Sleep(time.Millisecond) // polling for the end of the run
			}
			m.Report(b, b.N)
			b.ReportMetric(float64(b.N)/float64(batches.Load()), "msgs/batch")
			b.StopTimer()
			cancel()
			wg.Wait()
			closeMembers(clients)
		})
	}
}
