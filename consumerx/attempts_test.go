package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// One Guard (limit 4) serves a consumer group that dead-letters after 2
// attempts, one with no limit, one that takes the guard's limit, and a
// caller of the Guard itself, all at once: each sees its own limit, as
// guard.CallOptions gives it, with no second Guard built.
func TestMaxAttemptsPerGroupOnOneGuard(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{MaxAttempts: 4})
	ctx := context.Background()
	errBoom := errors.New("boom")
	fail := func(context.Context, consumerx.Message) error { return errBoom }

	var mu sync.Mutex
	dead := map[string]int{} // group/id → dead letters
	deadLetter := func(group string) func(context.Context, consumerx.Message, error) error {
		return func(_ context.Context, msg consumerx.Message, cause error) error {
			if !errors.Is(cause, guard.ErrExhausted) {
				t.Errorf("%s/%s dead-lettered with %v", group, msg.ID, cause)
			}
			mu.Lock()
			dead[group+"/"+msg.ID]++
			mu.Unlock()
			return nil
		}
	}
	two := newProcessor(t, g, "two", consumerx.Options{MaxAttempts: 2, DeadLetter: deadLetter("two")})
	unlimited := newProcessor(t, g, "unlimited", consumerx.Options{MaxAttempts: -1, DeadLetter: deadLetter("unlimited")})
	inherit := newProcessor(t, g, "inherit", consumerx.Options{DeadLetter: deadLetter("inherit")})
	if two.MaxAttempts() != 2 || unlimited.MaxAttempts() != 0 || inherit.MaxAttempts() != 4 {
		t.Fatalf("limits: %d, %d, %d", two.MaxAttempts(), unlimited.MaxAttempts(), inherit.MaxAttempts())
	}

	// deliver sends msg to p until it is dead-lettered (or n times), and
	// returns on which delivery it was.
	deliver := func(p *consumerx.Processor, msg consumerx.Message, n int, batch bool) (int, error) {
		for i := 1; i <= n; i++ {
			var (
				o   consumerx.Outcome
				err error
			)
			if batch {
				r := p.ProcessBatch(ctx, []consumerx.Message{msg}, fail, consumerx.BatchOptions{})[0]
				o, err = r.Outcome, r.Err
			} else {
				o, err = p.Process(ctx, msg, fail)
			}
			switch o {
			case consumerx.DeadLettered:
				return i, nil
			case consumerx.Failed:
				if !errors.Is(err, errBoom) {
					return i, fmt.Errorf("%s/%s delivery %d: %w", p.Group(), msg.ID, i, err)
				}
			default:
				return i, fmt.Errorf("%s/%s delivery %d: %s, %w", p.Group(), msg.ID, i, o, err)
			}
		}
		return n + 1, nil
	}
	type job struct {
		p     *consumerx.Processor
		id    string
		batch bool
		want  int // the delivery that dead-letters; 9 for never in 8
	}
	jobs := []job{
		{two, "a", false, 2}, {two, "b", true, 2},
		{inherit, "a", false, 4}, {inherit, "b", true, 4},
		{unlimited, "a", false, 9}, {unlimited, "b", true, 9},
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			got, err := deliver(j.p, consumerx.Message{ID: j.id, Payload: []byte(j.id)}, 8, j.batch)
			if err != nil {
				t.Error(err)
			} else if got != j.want {
				t.Errorf("%s/%s (batch %v): dead-lettered on delivery %d, want %d", j.p.Group(), j.id, j.batch, got, j.want)
			}
		})
	}
	// Meanwhile a caller of the Guard itself keeps the guard's limit.
	wg.Go(func() {
		key := guard.Key{Scope: "direct", ID: "a"}
		for i := 1; i <= 4; i++ {
			if _, err := g.Do(ctx, key, "", func(context.Context, guard.Lease) ([]byte, error) { return nil, errBoom }); !errors.Is(err, errBoom) {
				t.Errorf("direct attempt %d: %v", i, err)
			}
		}
		if _, err := g.Do(ctx, key, "", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }); !errors.Is(err, guard.ErrExhausted) {
			t.Errorf("direct attempt 5: %v, want ErrExhausted (the guard's limit)", err)
		}
	})
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"two/a": 1, "two/b": 1, "inherit/a": 1, "inherit/b": 1}
	if fmt.Sprint(dead) != fmt.Sprint(want) {
		t.Fatalf("dead letters %v, want %v", dead, want)
	}
}

// Dead-lettering is retried past the guard's limit: a DeadLetter that
// fails more often than the guard's MaxAttempts still runs on the next
// delivery, and once.
func TestDeadLetterRetriedPastGuardLimit(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	var calls atomic.Int32
	p := newProcessor(t, g, "dl", consumerx.Options{DeadLetter: func(context.Context, consumerx.Message, error) error {
		if calls.Add(1) <= 3 {
			return errors.New("dead-letter queue down")
		}
		return nil
	}})
	msg := consumerx.Message{ID: "m", Payload: []byte("x")}
	fail := func(context.Context, consumerx.Message) error { return errors.New("boom") }
	for i := 1; i <= 3; i++ {
		if o, err := p.Process(ctx, msg, fail); o != consumerx.Failed || err == nil {
			t.Fatalf("delivery %d: %s, %v, want Failed (dead letter not written)", i, o, err)
		}
	}
	for i := 4; i <= 5; i++ {
		if o, err := p.Process(ctx, msg, fail); o != consumerx.DeadLettered || !errors.Is(err, guard.ErrExhausted) {
			t.Fatalf("delivery %d: %s, %v, want DeadLettered", i, o, err)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("DeadLetter called %d times, want 4", n)
	}
}
