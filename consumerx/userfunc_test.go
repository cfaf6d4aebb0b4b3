package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// A Key or Fingerprint function that panics for one message is that
// message's bad input, as a key function's error is: the message is
// dead-lettered (once per broker id, the cause matching ErrNoKey and
// guard.ErrPanicked) and the other messages of its batch run and end as
// they would have, each effect once; nothing panics out of Process or
// ProcessBatch. Ordered, the bad message keeps its place.
func TestUserFunctionPanicIsThatMessagesBadInput(t *testing.T) {
	for _, fn := range []string{"Key", "Fingerprint"} {
		t.Run(fn, func(t *testing.T) {
			g, _, _ := consumertest.Guard(t, guard.Options{})
			var dead []string
			var causes []error
			opts := consumerx.Options{DeadLetter: func(_ context.Context, msg consumerx.Message, c error) error {
				dead, causes = append(dead, msg.ID), append(causes, c)
				return nil
			}}
			poison := func(msg consumerx.Message) {
				if msg.ID == "m2" || msg.ID == "single" {
					panic("nil map in " + fn)
				}
			}
			if fn == "Key" {
				opts.Key = func(msg consumerx.Message) (string, error) { poison(msg); return msg.ID, nil }
			} else {
				opts.Fingerprint = func(msg consumerx.Message) string { poison(msg); return string(msg.Payload) }
			}
			p := newProcessor(t, g, "billing-"+fn, opts)
			var mu sync.Mutex
			effects := map[string]int{}
			h := func(_ context.Context, msg consumerx.Message) error {
				mu.Lock()
				defer mu.Unlock()
				effects[msg.ID]++
				return nil
			}
			ctx := context.Background()
			P, D, L, S := consumerx.Processed, consumerx.Duplicate, consumerx.DeadLettered, consumerx.Skipped
			check := func(name string, res []consumerx.BatchResult, want ...consumerx.Outcome) {
				t.Helper()
				for i, r := range res {
					if r.Outcome != want[i] {
						t.Errorf("%s, m%d: %s, %v; want %s", name, i, r.Outcome, r.Err, want[i])
					}
				}
			}
			msgs := batchOf(5)
			var res []consumerx.BatchResult
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("ProcessBatch panicked: %v", v)
					}
				}()
				res = p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Concurrency: 2})
			}()
			check("batch", res, P, P, L, P, P)
			if len(res) == 5 && (!errors.Is(res[2].Err, consumerx.ErrNoKey) || !errors.Is(res[2].Err, guard.ErrPanicked)) {
				t.Errorf("m2's error %v; want ErrNoKey and ErrPanicked", res[2].Err)
			}
			// Delivered again: the others are duplicates, m2's dead letter
			// is not sent again.
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("ordered ProcessBatch panicked: %v", v)
					}
				}()
				res = p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true})
			}()
			check("ordered redelivery", res, D, D, L, S, S)

			var o consumerx.Outcome
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("Process panicked: %v", v)
					}
				}()
				o, err = p.Process(ctx, consumerx.Message{ID: "single", Payload: []byte("x")}, h)
			}()
			var pe *guard.PanicError
			if o != L || !errors.Is(err, consumerx.ErrNoKey) || !errors.As(err, &pe) || pe.Value != "nil map in "+fn {
				t.Errorf("Process: %s, %v; want dead-lettered, ErrNoKey, the panic", o, err)
			}
			if fmt.Sprint(dead) != "[m2 single]" || fmt.Sprint(effects) != "map[m0:1 m1:1 m3:1 m4:1]" {
				t.Errorf("dead-lettered %v, effects %v", dead, effects)
			}
			for _, c := range causes {
				if !errors.Is(c, consumerx.ErrNoKey) || !errors.Is(c, guard.ErrPanicked) {
					t.Errorf("cause %v; want ErrNoKey and ErrPanicked", c)
				}
			}
		})
	}
}

// A DeadLetter that panics for one message is a dead letter not sent, as
// one returning an error is: the message is Failed (an error matching
// guard.ErrPanicked), not acknowledged, and dead-lettered on a later
// delivery; the other messages of its batch end as they would have, and
// nothing panics out of Process or ProcessBatch.
func TestDeadLetterPanicIsNotSent(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	fail := true
	var dead []string
	p := newProcessor(t, g, "billing", consumerx.Options{
		Key: func(msg consumerx.Message) (string, error) {
			if msg.ID == "m1" || msg.ID == "single" {
				return "", errors.New("no order id")
			}
			return msg.ID, nil
		},
		DeadLetter: func(_ context.Context, msg consumerx.Message, _ error) error {
			if fail {
				panic("dead-letter topic client is nil")
			}
			dead = append(dead, msg.ID)
			return nil
		}})
	ran := 0
	h := func(context.Context, consumerx.Message) error { ran++; return nil }
	ctx := context.Background()
	msgs := batchOf(3)
	for round, want := range [][]consumerx.Outcome{
		{consumerx.Processed, consumerx.Failed, consumerx.Processed},
		{consumerx.Duplicate, consumerx.DeadLettered, consumerx.Duplicate},
	} {
		var res []consumerx.BatchResult
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("round %d: ProcessBatch panicked: %v", round, v)
				}
			}()
			res = p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
		}()
		for i, r := range res {
			if r.Outcome != want[i] {
				t.Errorf("round %d, m%d: %s, %v; want %s", round, i, r.Outcome, r.Err, want[i])
			}
		}
		if round == 0 && len(res) == 3 && !errors.Is(res[1].Err, guard.ErrPanicked) {
			t.Errorf("m1's error %v; want ErrPanicked", res[1].Err)
		}
		var o consumerx.Outcome
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("round %d: Process panicked: %v", round, v)
				}
			}()
			o, _ = p.Process(ctx, consumerx.Message{ID: "single"}, h)
		}()
		if o != want[1] {
			t.Errorf("round %d, Process: %s; want %s", round, o, want[1])
		}
		fail = false
	}
	if ran != 2 || fmt.Sprint(dead) != "[m1 single]" {
		t.Errorf("ran %d, dead-lettered %v; want 2, [m1 single]", ran, dead)
	}
}
