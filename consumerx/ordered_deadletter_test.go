package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// An ordered batch that stops at a message sends no dead letter for a
// message after the stop: a later message whose claim the store answers
// with a mismatch (its id reused with another payload) or with its
// attempts spent is Skipped, not dead-lettered, and is dead-lettered in
// its turn, once every message before it is acknowledged, as a message
// without a usable key keeps its place (docs/design.md, "Batches").
// (The later messages used to be dead-lettered at once, while the
// message ahead of them in their Kafka partition was still to be
// retried: the dead-letter topic got them first.)
func TestProcessBatchOrderedNoDeadLetterPastTheStop(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	ctx := context.Background()
	msgs := batchOf(4)
	ok := func(context.Context, consumerx.Message) error { return nil }
	fails := func(context.Context, consumerx.Message) error { return errors.New("declined") }
	// m2 ran before with another payload: its claim answers a mismatch.
	first := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 2,
		DeadLetter: func(context.Context, consumerx.Message, error) error { return errors.New("dead-letter topic down") }})
	if o, err := first.Process(ctx, consumerx.Message{ID: "m2", Payload: []byte("another order")}, ok); o != consumerx.Processed {
		t.Fatalf("m2's first copy: %s, %v", o, err)
	}
	// m3 failed its two attempts and its dead letter could not be sent:
	// its claim answers exhausted, and its next delivery dead-letters it.
	for range 2 {
		if o, err := first.Process(ctx, msgs[3], fails); o != consumerx.Failed {
			t.Fatalf("m3: %s, %v", o, err)
		}
	}
	var dead []string
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 2,
		DeadLetter: func(_ context.Context, msg consumerx.Message, _ error) error { dead = append(dead, msg.ID); return nil }})
	m0 := fails
	h := func(ctx context.Context, msg consumerx.Message) error {
		if msg.ID == "m0" {
			return m0(ctx, msg)
		}
		return nil
	}
	want := func(round int, batch []consumerx.Message, res []consumerx.BatchResult, outs ...consumerx.Outcome) {
		t.Helper()
		for i, r := range res {
			if r.Outcome != outs[i] {
				t.Errorf("round %d, %s: %s, %v; want %s", round, batch[i].ID, r.Outcome, r.Err, outs[i])
			}
		}
	}
	P, F, S, L := consumerx.Processed, consumerx.Failed, consumerx.Skipped, consumerx.DeadLettered
	ordered := consumerx.BatchOptions{Ordered: true}
	// m0 fails (an attempt left): the batch stops there.
	want(1, msgs, p.ProcessBatch(ctx, msgs, h, ordered), F, S, S, S)
	if len(dead) > 0 {
		t.Errorf("round 1: dead-lettered %v past the stop at m0", dead)
	}
	dead = nil
	// m0 succeeds: m2 is dead-lettered in its turn, and stops the batch.
	m0 = ok
	want(2, msgs, p.ProcessBatch(ctx, msgs, h, ordered), P, P, L, S)
	if fmt.Sprint(dead) != "[m2]" {
		t.Errorf("round 2: dead-lettered %v, want [m2]", dead)
	}
	dead = nil
	want(3, msgs[3:], p.ProcessBatch(ctx, msgs[3:], h, ordered), L)
	if fmt.Sprint(dead) != "[m3]" {
		t.Errorf("round 3: dead-lettered %v, want [m3]", dead)
	}
}
