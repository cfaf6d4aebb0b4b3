package adapter

import (
	"context"
	"errors"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// SettleBudget bounds how long an adapter keeps retrying the write that
// ends a claim (Complete, Fail, Release, a step's save) while the store is
// unreachable. A claim neither completed nor released stays pending until
// its lease runs out, and every retry of the key meanwhile is told it is
// in progress (409, Aborted). Right after Redis comes back, go-redis
// answers new connections with its last dial error for up to a second (it
// probes the server once a second), so two seconds see the write through
// a restart.
const SettleBudget = 2 * time.Second

// Settle runs write until it succeeds, fails for a reason other than the
// store being unreachable (guard.ErrUnavailable; ErrLeaseLost, say: nothing
// of the caller's is left to end), ctx ends, or budget has passed, backing
// off between tries (20 ms, doubled up to 250 ms). It returns write's last
// error. The writes it repeats must be safe to repeat (guard.Store's
// rule).
func Settle(ctx context.Context, budget time.Duration, write func(context.Context) error) error {
	deadline := time.Now().Add(budget)
	delay := 20 * time.Millisecond
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		err := write(ctx)
		if err == nil || !errors.Is(err, guard.ErrUnavailable) || ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return err
		case <-timer.C:
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}
