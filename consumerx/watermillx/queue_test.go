package watermillx

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
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

// queue is a Subscriber whose subscriptions compete for one queue of
// messages, as the members of a consumer group do on a broker: each
// message goes to one subscription at a time; a nacked one goes back to
// the queue for any of them, unless it was delivered limit times (if
// limit is set, as a RabbitMQ quorum queue's delivery-limit or an SQS
// maxReceiveCount): then it is dropped, and counted in dropped.
type queue struct {
	in      chan *message.Message
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	limit   int
	mu      sync.Mutex
	times   map[*message.Message]int // deliveries of each message
	dropped atomic.Int32
}

func newQueue(size int) *queue {
	return &queue{in: make(chan *message.Message, size), closed: make(chan struct{})}
}

func (q *queue) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		q.in <- m
	}
	return nil
}

func (q *queue) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	q.wg.Go(func() {
		defer close(out)
		for {
			var m *message.Message
			select {
			case m = <-q.in:
			case <-ctx.Done():
				return
			case <-q.closed:
				return
			}
			d := m.Copy() // each delivery its own ack
			select {
			case out <- d:
			case <-ctx.Done():
				q.in <- m
				return
			case <-q.closed:
				return
			}
			select {
			case <-d.Acked():
			case <-d.Nacked():
				if q.spent(m) {
					q.dropped.Add(1)
					continue
				}
				q.in <- m // back to the queue, for any subscription
			case <-q.closed:
				return
			}
		}
	})
	return out, nil
}

// spent counts a delivery of m and reports whether m reached the limit.
func (q *queue) spent(m *message.Message) bool {
	if q.limit == 0 {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.times == nil {
		q.times = map[*message.Message]int{}
	}
	q.times[m]++
	return q.times[m] >= q.limit
}

func (q *queue) Close() error {
	q.once.Do(func() { close(q.closed) })
	q.wg.Wait()
	return nil
}

// The checkpoint through the middleware: 10,000 messages, 3,000 of them a
// message published again (the same UUID), 50 handlers of one group
// competing for the queue: 7,000 effects, every duplicate recognised.
// Watermill hands the middleware one message at a time: each costs its
// own claim and completion.
func TestTenThousandWithDuplicatesFiftyConsumers(t *testing.T) {
	const distinct, dups, consumers = 7000, 3000, 50
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	q := newQueue(2 * (distinct + dups))
	var outs consumertest.Outcomes
	mw, err := New(g, Options{Group: "billing", InProgressDelay: 20 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	effects := make([]atomic.Int32, distinct)
	for c := range consumers {
		h := b.router.AddConsumerHandler(fmt.Sprint("billing-", c), "orders", q, func(msg *message.Message) error {
			var i int
			if _, err := fmt.Sscanf(string(msg.Payload), "order %d", &i); err != nil {
				return err
			}
			effects[i].Add(1)
			return nil
		})
		h.AddMiddleware(mw.Middleware)
	}
	t.Cleanup(func() { _ = q.Close() }) // after the router closed (cleanups run last first)
	b.start()
	uuids := make([]string, distinct)
	ids := make([]int, 0, distinct+dups)
	for i := range distinct {
		uuids[i] = watermill.NewUUID()
		ids = append(ids, i)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	ids = append(ids, rng.Perm(distinct)[:dups]...)
	rng.Shuffle(len(ids), func(a, b int) { ids[a], ids[b] = ids[b], ids[a] })
	start := time.Now()
	for _, i := range ids {
		_ = q.Publish("orders", message.NewMessage(uuids[i], fmt.Appendf(nil, "order %d", i)))
	}
	testenv.WaitFor(t, 90*time.Second, "every delivery acknowledged", func() bool {
		all := outs.All()
		return all[consumerx.Processed]+all[consumerx.Duplicate] == distinct+dups && len(q.in) == 0
	})
	elapsed := time.Since(start)
	total := 0
	for i := range effects {
		n := int(effects[i].Load())
		total += n
		if n != 1 {
			t.Errorf("order %d ran %d times", i, n)
		}
	}
	if all := outs.All(); total != distinct || all[consumerx.Processed] != distinct || all[consumerx.Duplicate] != dups ||
		all[consumerx.DeadLettered] != 0 {
		t.Errorf("%d effects, deliveries %v; want %d processed, %d duplicates", total, all, distinct, dups)
	}
	t.Logf("%d messages, %d handlers: %s; deliveries %v", distinct+dups, consumers, elapsed, outs.All())
}
