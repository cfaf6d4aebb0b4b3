package backstop

import (
	"context"
	"errors"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// settleBudget bounds how long the store Wrap returns keeps retrying a write to the
// primary store that ends a claim (Complete, Fail, Release) while the
// primary cannot be reached. A claim left pending strands its key for a
// whole lease (every retry meanwhile is told it is in progress), though
// the backstop could answer it at once. Right after Redis comes back,
// go-redis answers new connections with its last dial error for up to a
// second (it probes the server once a second): two seconds see a write
// through a restart.
const settleBudget = 2 * time.Second

// settle runs write until it succeeds, fails for another reason than the
// store being unreachable, ctx ends, or budget has passed; it backs off
// between tries (20 ms, doubled up to 250 ms). The writes it repeats are
// safe to repeat (guard.Store's rule).
func settle(ctx context.Context, budget time.Duration, write func() error) error {
	deadline := time.Now().Add(budget)
	delay := 20 * time.Millisecond
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		err := write()
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
