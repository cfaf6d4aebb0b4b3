package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// refuseComplete is a store (without batches) that refuses every
// completion of one key, as a Redis that stopped taking writes would.
type refuseComplete struct {
	guard.Store
	id string
}

func (s *refuseComplete) Complete(ctx context.Context, l guard.Lease, r []byte, ttl time.Duration) error {
	if l.Key.ID == s.id {
		return fmt.Errorf("%w: refused (test)", guard.ErrUnavailable)
	}
	return s.Store.Complete(ctx, l, r, ttl)
}

// TestOrderedNoDeadLetterPastRefusedCompletion: an Ordered batch stops at
// its first message that is neither processed nor a duplicate, and
// consumerx "sends no dead letter past the stop" (docs/design.md). Message
// a's handler succeeds but its completion is refused (a is Failed); b's
// handler, after a's, has run by then (completions are written once every
// handler returned) and fails its last attempt: b is Failed, not
// dead-lettered (and acknowledged) before a (found by review). Its next
// delivery dead-letters it.
func TestOrderedNoDeadLetterPastRefusedCompletion(t *testing.T) {
	rdb := testenv.Redis(t)
	store := &refuseComplete{Store: guardenv.StoreOn(t, rdb, guard.RedisOptions{}), id: "a"}
	g := guard.New(store, guard.Options{Lease: 2 * time.Second})
	var dead atomic.Int32
	p := newProcessor(t, g, "orders", consumerx.Options{
		MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			dead.Add(1)
			t.Logf("dead letter sent for %s: %v", msg.ID, cause)
			return nil
		},
	})
	var ranB atomic.Bool
	h := func(ctx context.Context, msg consumerx.Message) error {
		if msg.ID == "b" {
			ranB.Store(true)
			return errors.New("b fails")
		}
		return nil
	}
	msgs := []consumerx.Message{{ID: "a", Payload: []byte("1")}, {ID: "b", Payload: []byte("2")}}
	out := p.ProcessBatch(context.Background(), msgs, h, consumerx.BatchOptions{Ordered: true})
	t.Logf("a: %s %v; b: %s %v", out[0].Outcome, out[0].Err, out[1].Outcome, out[1].Err)
	if out[0].Outcome != consumerx.Failed {
		t.Fatalf("a: %s; the test wants a's completion refused (Failed)", out[0].Outcome)
	}
	if out[1].Outcome != consumerx.Failed || dead.Load() != 0 {
		t.Fatalf("b: %s, %d dead letters sent: dead-lettered (and acknowledged) past the ordered batch's stop at a", out[1].Outcome, dead.Load())
	}
	if !ranB.Load() {
		t.Fatal("b's handler did not run: the test wants it run before a's completion was refused")
	}
	again := p.ProcessBatch(context.Background(), msgs[1:], h, consumerx.BatchOptions{Ordered: true})
	if again[0].Outcome != consumerx.DeadLettered || dead.Load() != 1 || !errors.Is(again[0].Err, guard.ErrExhausted) {
		t.Errorf("b delivered again: %s %v, %d dead letters; want it dead-lettered, its attempts spent", again[0].Outcome, again[0].Err, dead.Load())
	}
}
