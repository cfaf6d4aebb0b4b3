package consumertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// FailPanicLong is issue 18's batch of eight messages, numbered 0 to 7:
// message Fails fails on its first run, Panics panics on every run, Stuck
// outlives its lease on its first run (it waits for its context, which
// MaxRun ends), Long runs one and a half leases on its first run (its
// lease kept alive); the others succeed. It records each message's
// attempts, effects, outcomes and dead letters, and Check says whether
// each ended as it must: every other message run once and acknowledged by
// its one delivery, the failed one run again, the panicked one a failed
// attempt each time and dead-lettered once at MaxAttempts 2, the cut-off
// holder never completing. Set the fields before the first Run.
type FailPanicLong struct {
	Lease                      time.Duration
	Fails, Panics, Stuck, Long int
	// Began, if set, is called as each run begins, with whether it is the
	// message's first (an adapter's check that the eight run at once).
	Began func(i int, first bool)
	// StuckCut, if set, is called when the stuck message's first run has
	// been cut off, before it returns.
	StuckCut func()

	mu       sync.Mutex
	attempts map[int][]int
	effects  [8]int
	outcomes map[int][]consumerx.Outcome
	errs     map[int][]error
	dead     map[int][]error
}

// Run is message i's handler, under the context the adapter gives it.
func (b *FailPanicLong) Run(ctx context.Context, i int) error {
	l, _ := consumerx.LeaseFrom(ctx)
	b.mu.Lock()
	if b.attempts == nil {
		b.attempts = map[int][]int{}
	}
	b.attempts[i] = append(b.attempts[i], l.Attempt)
	first := len(b.attempts[i]) == 1
	b.mu.Unlock()
	if b.Began != nil {
		b.Began(i, first)
	}
	switch {
	case i == b.Panics:
		panic("nil map")
	case i == b.Fails && first:
		return errors.New("gateway timeout")
	case i == b.Stuck && first:
		<-ctx.Done() // it outlives its lease: MaxRun cuts it off
		if b.StuckCut != nil {
			b.StuckCut()
		}
		return context.Cause(ctx)
	case i == b.Long && first:
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(b.Lease + b.Lease/2):
		}
	}
	b.mu.Lock()
	b.effects[i]++
	b.mu.Unlock()
	return nil
}

// Process returns o with the hooks that record outcomes and dead letters
// (it answers nil to a dead letter) and MaxAttempts 2; num gives a
// message's number.
func (b *FailPanicLong) Process(o consumerx.Options, num func(consumerx.Message) int) consumerx.Options {
	o.MaxAttempts = 2
	o.DeadLetter = func(_ context.Context, msg consumerx.Message, cause error) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.dead == nil {
			b.dead = map[int][]error{}
		}
		b.dead[num(msg)] = append(b.dead[num(msg)], cause)
		return nil
	}
	o.OnOutcome = func(_ context.Context, msg consumerx.Message, out consumerx.Outcome, err error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.outcomes == nil {
			b.outcomes, b.errs = map[int][]consumerx.Outcome{}, map[int][]error{}
		}
		b.outcomes[num(msg)] = append(b.outcomes[num(msg)], out)
		b.errs[num(msg)] = append(b.errs[num(msg)], err)
	}
	return o
}

// Ran reports whether every message of is has begun a run.
func (b *FailPanicLong) Ran(is ...int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, i := range is {
		if len(b.attempts[i]) == 0 {
			return false
		}
	}
	return true
}

// Acked is how many messages' last outcome acknowledges them.
func (b *FailPanicLong) Acked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, outs := range b.outcomes {
		if len(outs) > 0 && outs[len(outs)-1].Ack() {
			n++
		}
	}
	return n
}

// Outcomes returns message i's outcomes so far, one a delivery.
func (b *FailPanicLong) Outcomes(i int) []consumerx.Outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]consumerx.Outcome(nil), b.outcomes[i]...)
}

// Runs reports message i's runs as a list of attempts ("[1 2]").
func (b *FailPanicLong) Runs(i int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprint(b.attempts[i])
}

// Check fails t for each message that did not end as it must; noun names
// a message in the adapter's words ("record").
func (b *FailPanicLong) Check(t testing.TB, noun string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range 8 {
		wantEffects, wantAttempts, last := 1, "[1]", consumerx.Processed
		switch i {
		case b.Fails, b.Stuck:
			wantAttempts = "[1 2]"
		case b.Panics:
			wantEffects, wantAttempts, last = 0, "[1 2]", consumerx.DeadLettered
		}
		if b.effects[i] != wantEffects {
			t.Errorf("%s %d: %d effects, want %d", noun, i, b.effects[i], wantEffects)
		}
		if got := fmt.Sprint(b.attempts[i]); got != wantAttempts {
			t.Errorf("%s %d ran on attempts %s, want %s", noun, i, got, wantAttempts)
		}
		// Acknowledged once, by its last delivery; before it, nothing
		// acknowledged it.
		outs := b.outcomes[i]
		for k, o := range outs {
			if o.Ack() != (k == len(outs)-1) || o == consumerx.Interrupted {
				t.Errorf("%s %d: outcomes %v; want it acknowledged by its last only", noun, i, outs)
				break
			}
		}
		if len(outs) == 0 || outs[len(outs)-1] != last {
			t.Errorf("%s %d: outcomes %v; want the last %s", noun, i, outs, last)
		}
	}
	if outs := b.outcomes[b.Fails]; len(outs) == 0 || outs[0] != consumerx.Failed {
		t.Errorf("the failed %s: outcomes %v; want Failed first", noun, outs)
	}
	if outs, e := b.outcomes[b.Stuck], b.errs[b.Stuck]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.Is(e[0], guard.ErrMaxRun) {
		t.Errorf("the cut-off %s: outcomes %v, errors %v; want Failed first, with guard.ErrMaxRun", noun, outs, e)
	}
	var pe *guard.PanicError
	if outs, e := b.outcomes[b.Panics], b.errs[b.Panics]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.As(e[0], &pe) || pe.Value != "nil map" {
		t.Errorf("the panicking %s: outcomes %v, errors %v; want Failed first, with the panic", noun, outs, e)
	}
	if d := b.dead[b.Panics]; len(d) != 1 || !errors.Is(d[0], guard.ErrExhausted) || !errors.Is(d[0], guard.ErrPanicked) {
		t.Errorf("the panicking %s's dead letters: %v; want one, exhausted by the panic", noun, d)
	}
	if len(b.dead) != 1 {
		t.Errorf("dead letters %v; want the panicking %s's alone", b.dead, noun)
	}
}
