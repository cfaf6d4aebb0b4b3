package guard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// causeOnBound is a store whose completions get no answer: each waits for
// its context to end and returns context.Cause of it, as a store that
// bounds a call on a goroutine of its own does (fallback.Store).
type causeOnBound struct{ guard.Store }

func (s causeOnBound) Complete(ctx context.Context, _ guard.Lease, _ []byte, _ time.Duration) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

// TestWriteBoundNotTheCallersCause: the caller cancelled its context with
// a cause of its own (errgroup, a consumer's shutdown) while the effect
// ran; the completion then got no answer within its bound. The bound's
// context gave the caller's cause to context.Cause (it passed every
// value, the context package's own too, to the caller's context), so Do
// returned that cause, not ErrUnavailable: a write of unknown outcome read
// as the caller's refusal.
func TestWriteBoundNotTheCallersCause(t *testing.T) {
	g := guard.New(causeOnBound{realStore(t)}, guard.Options{Lease: 300 * time.Millisecond})
	shutdown := errors.New("consumer shutting down")
	for _, c := range []struct {
		name  string
		cause error
	}{{"plain cancel", nil}, {"cancel with a cause", shutdown}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(bg)
			defer cancel(nil)
			_, err := g.Do(ctx, guard.Key{Scope: "writecause", ID: c.name}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				cancel(c.cause) // the caller goes away once the effect is done
				return []byte("done"), nil
			})
			if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, shutdown) || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
				t.Fatalf("completion unanswered at its bound: %v; want ErrUnavailable for the bound's deadline, not the caller's cause", err)
			}
		})
	}
}
