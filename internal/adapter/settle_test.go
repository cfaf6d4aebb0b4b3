package adapter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// unavailableFor returns a write that fails with guard.ErrUnavailable
// (wrapped, as stores wrap it) n times, then returns final; calls counts.
func unavailableFor(n int, final error, calls *int) func(context.Context) error {
	return func(context.Context) error {
		*calls++
		if *calls <= n {
			return fmt.Errorf("store: %w: connection refused", guard.ErrUnavailable)
		}
		return final
	}
}

func TestSettleRetriesUnavailable(t *testing.T) {
	calls := 0
	start := time.Now()
	err := Settle(context.Background(), SettleBudget, unavailableFor(3, nil, &calls))
	if err != nil || calls != 4 {
		t.Fatalf("err %v after %d calls; want nil after 4", err, calls)
	}
	// Backs off 20, 40, 80 ms between them.
	if took := time.Since(start); took < 140*time.Millisecond {
		t.Fatalf("4 tries took %v; want the 20/40/80 ms backoff", took)
	}
}

func TestSettleStops(t *testing.T) {
	other := errors.New("lease lost")
	cases := []struct {
		name   string
		ctx    func() context.Context
		budget time.Duration
		write  func(calls *int) func(context.Context) error
		want   error
		calls  int
	}{
		{"other error", context.Background, SettleBudget,
			func(c *int) func(context.Context) error { return unavailableFor(0, other, c) }, other, 1},
		{"after unavailable, other error", context.Background, SettleBudget,
			func(c *int) func(context.Context) error { return unavailableFor(1, other, c) }, other, 2},
		{"no budget", context.Background, 0,
			func(c *int) func(context.Context) error { return unavailableFor(10, nil, c) }, guard.ErrUnavailable, 1},
		{"context ended", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, SettleBudget,
			func(c *int) func(context.Context) error { return unavailableFor(10, nil, c) }, guard.ErrUnavailable, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := Settle(tc.ctx(), tc.budget, tc.write(&calls))
			if !errors.Is(err, tc.want) || calls != tc.calls {
				t.Fatalf("err %v after %d calls; want %v after %d", err, calls, tc.want, tc.calls)
			}
		})
	}
}

// TestSettleBudget: a store that stays unreachable is given up on within
// the budget, after a few tries, not before.
func TestSettleBudget(t *testing.T) {
	calls := 0
	start := time.Now()
	err := Settle(context.Background(), 300*time.Millisecond, unavailableFor(30, nil, &calls))
	took := time.Since(start)
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("err %v", err)
	}
	// Tries at 0, 20, 60, 140 ms; the next (after 250 ms) would pass the
	// budget. A loaded machine may fit fewer, never more (the write would
	// succeed on its 31st call).
	if calls < 2 || calls > 4 || took > 300*time.Millisecond+2*time.Second {
		t.Fatalf("%d calls in %v", calls, took)
	}
}

// TestSettleContextEndsWait: a context that ends while Settle waits ends
// the wait at once.
func TestSettleContextEndsWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	write := func(context.Context) error {
		calls++
		cancel()
		return guard.ErrUnavailable
	}
	if err := Settle(ctx, time.Hour, write); !errors.Is(err, guard.ErrUnavailable) || calls != 1 {
		t.Fatalf("err %v after %d calls", err, calls)
	}
}
