package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// ctxClaims is a store whose claims get no answer: each waits for its
// context to end and returns the context's error, as a client does that
// checks its context before sending (go-redis's pool) or honours its
// deadline. Its releases get no answer either (the server has stopped
// answering), until their own context ends; it counts them.
type ctxClaims struct {
	guard.Store
	releases atomic.Int32
}

func (s *ctxClaims) Claim(ctx context.Context, _ guard.ClaimRequest) (guard.Outcome, error) {
	<-ctx.Done()
	return guard.Outcome{}, ctx.Err()
}

func (s *ctxClaims) Release(ctx context.Context, _ guard.Lease) error {
	s.releases.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// A claim whose caller's context ended while it was under way is not a
// claim "whose answer was lost" (unheard.go: "an error without a transport
// failure in it (a context that ended, ...) [is] not"; Claim's doc: a
// claim "whose caller's context ended while it was on its way, has no one
// to hear its answer, and its lease runs out like an abandoned one"). So
// no release goes out, and the caller is answered when its context ends.
// A cancelled context is treated so; one whose deadline passed is not:
// context.DeadlineExceeded implements net.Error with Timeout() true, so
// unheard() takes it for a read timeout, and the caller waits for a
// release (up to unheardBound, 1 s) past its own deadline.
func TestCallerDeadlineIsNotALostAnswer(t *testing.T) {
	for _, call := range []string{"Claim", "Do"} {
		t.Run(call, func(t *testing.T) {
			s := &ctxClaims{Store: memstore.New(memstore.Options{})}
			g := guard.New(s, guard.Options{Lease: 10 * time.Second})
			key := guard.Key{Scope: "unheard", ID: call}

			// The cancelled caller, for comparison: no release, answered at once.
			cctx, cancel := context.WithCancel(bg)
			time.AfterFunc(50*time.Millisecond, cancel)
			start := time.Now()
			err := claimVia(cctx, g, call, key)
			t.Logf("cancelled caller: %v after %s, %d releases", err, time.Since(start).Round(time.Millisecond), s.releases.Load())

			s.releases.Store(0)
			dctx, dcancel := context.WithTimeout(bg, 50*time.Millisecond)
			defer dcancel()
			start = time.Now()
			err = claimVia(dctx, g, call, key)
			took := time.Since(start)
			t.Logf("caller past its deadline: %v after %s, %d releases", err, took.Round(time.Millisecond), s.releases.Load())
			if err == nil {
				t.Fatal("the claim succeeded")
			}
			if n := s.releases.Load(); n != 0 {
				t.Errorf("a claim cut off by its caller's deadline sent %d release(s), as if its answer had been lost on the wire", n)
			}
			if took > 500*time.Millisecond {
				t.Errorf("%s returned %s after it was called with a 50ms deadline (it waited for that release)", call, took.Round(time.Millisecond))
			}
		})
	}
}

func claimVia(ctx context.Context, g *guard.Guard, call string, key guard.Key) error {
	switch call {
	case "Claim":
		_, err := g.Claim(ctx, key, "fp")
		return err
	case "Do":
		_, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil })
		return err
	}
	return errors.New("no such call")
}
