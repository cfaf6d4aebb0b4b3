package jetstreamx

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The NATS server goes away while a handler runs, for longer than the
// consumer's AckWait, and comes back (its JetStream state on disk): the
// holder's connection drops and reconnects, its in-progress reports are
// lost meanwhile, and the server redelivers the message to a second
// consumer of the durable. That one finds it in progress (the holder's
// lease is alive) and Naks it until the holder's Ack, sent after the
// reconnect, takes it; both consumers go on consuming. The effect happens
// once, never in both at once, and nothing is left unacknowledged.
func TestServerRestartMidHandler(t *testing.T) {
	const ackWait = 600 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	port, dir := testenv.FreePort(t), t.TempDir()
	start := func() *server.Server {
		ns, err := server.NewServer(&server.Options{
			Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			ns.Shutdown()
			t.Fatal("nats-server not ready")
		}
		return ns
	}
	var (
		nsMu sync.Mutex
		ns   = start()
	)
	t.Cleanup(func() {
		nsMu.Lock()
		defer nsMu.Unlock()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	connect := func() jetstream.JetStream {
		nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	jsA, jsB := connect(), connect()
	ctx := context.Background()
	consA := ordersConsumer(t, jsA, jetstream.ConsumerConfig{AckWait: ackWait})
	consB, err := jsB.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		running = map[string]int{}
		overlap []string
		outs    consumertest.Outcomes
		held    atomic.Int32 // B found the held message in progress
	)
	started, resume := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	handler := func(ctx context.Context, msg consumerx.Message) error {
		mu.Lock()
		running[msg.ID]++
		if running[msg.ID] > 1 {
			overlap = append(overlap, msg.ID)
		}
		mu.Unlock()
		if msg.ID == "order-1" {
			startOnce.Do(func() { close(started) })
			select {
			case <-resume:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		running[msg.ID]--
		effects[msg.ID]++
		return nil
	}
	popts := consumerx.Options{Logger: testenv.Logger(t), OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
		if o == consumerx.InProgress && errors.Is(err, guard.ErrInProgress) {
			held.Add(1)
		}
		outs.Hook(ctx, msg, o, err)
	}}
	opts := Options{Group: "billing", MaxWait: 100 * time.Millisecond, InProgressDelay: 100 * time.Millisecond, Batch: 1, Process: popts}
	hA, err := New(g, handler, opts)
	if err != nil {
		t.Fatal(err)
	}
	hB, err := New(g, handler, opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- hA.Consume(runCtx, consA) }()
	var resumeOnce sync.Once
	members := 1
	defer func() {
		resumeOnce.Do(func() { close(resume) })
		stop()
		for range members {
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		}
	}()
	if _, err := jsA.Publish(ctx, "orders.1", []byte("charge 1"), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	<-started
	// B starts pulling only now: order-1 is A's.
	members++
	go func() { done <- hB.Consume(runCtx, consB) }()
	nsMu.Lock()
	ns.Shutdown()
	ns.WaitForShutdown()
	// Down for two AckWaits: A's in-progress reports are lost, and the
	// server, back, redelivers order-1.
	<-time.After(2 * ackWait)
	ns = start()
	nsMu.Unlock()
	testenv.WaitFor(t, 20*time.Second, "B finding order-1 in progress at A", func() bool { return held.Load() > 0 })
	resumeOnce.Do(func() { close(resume) })
	if _, err := jsB.Publish(ctx, "orders.2", []byte("charge 2"), jetstream.WithMsgID("order-2")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "both orders done and acknowledged", func() bool {
		mu.Lock()
		n := effects["order-1"] + effects["order-2"]
		mu.Unlock()
		if n < 2 {
			return false
		}
		info, err := consB.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("run at once by both consumers: %v", overlap)
	}
	for _, id := range []string{"order-1", "order-2"} {
		if effects[id] != 1 {
			t.Errorf("%s: %d effects, want 1", id, effects[id])
		}
	}
	t.Logf("B found order-1 in progress %d times; outcomes %v", held.Load(), outs.Entries())
}
