package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// replyLost is a real store whose next claim is taken by the store but
// whose answer is lost on the way back, as when the client's read timeout
// is shorter than the server's answer: the caller gets the transport's
// error, as RedisStore reports it.
type replyLost struct {
	guard.Store
	lose atomic.Bool
}

func (s *replyLost) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := s.Store.Claim(ctx, req)
	if err == nil && s.lose.CompareAndSwap(true, false) {
		timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		return guard.Outcome{}, fmt.Errorf("%w: %w", guard.ErrUnavailable, timeout)
	}
	return out, err
}

// TestClaimReplyLost: a claim the store took but whose answer the caller
// never heard does not keep the key for a lease, nor spend an attempt of
// an effect that never ran: the guard releases its own token before it
// reports ErrUnavailable, so the next call runs the effect at once as the
// first attempt, also under MaxAttempts 1 (where the lease running out
// would have left the key exhausted). Through Do, Claim, Hold and Wait.
func TestClaimReplyLost(t *testing.T) {
	calls := map[string]func(g *guard.Guard, key guard.Key) error{
		"Do": func(g *guard.Guard, key guard.Key) error {
			_, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				t.Error("the effect ran although the claim's answer was lost")
				return nil, nil
			})
			return err
		},
		"Claim": func(g *guard.Guard, key guard.Key) error {
			_, err := g.Claim(bg, key, "fp")
			return err
		},
		"Hold": func(g *guard.Guard, key guard.Key) error {
			_, h, err := g.Hold(bg, key, "fp")
			if h != nil {
				h.Stop()
			}
			return err
		},
		"Wait": func(g *guard.Guard, key guard.Key) error {
			_, err := g.Wait(bg, key, "fp", guard.WaitOptions{})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			s := &replyLost{Store: realStore(t)}
			g := guard.New(s, guard.Options{Lease: time.Minute, MaxAttempts: 1})
			key := guard.Key{Scope: "reply-lost", ID: name}
			s.lose.Store(true)
			if err := call(g, key); !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("claim whose answer was lost: %v, want ErrUnavailable", err)
			}
			ran := 0
			res, err := g.Do(bg, key, "fp", func(_ context.Context, l guard.Lease) ([]byte, error) {
				ran++
				if l.Attempt != 1 {
					t.Errorf("attempt %d, want 1: the lost claim was counted", l.Attempt)
				}
				return []byte("done"), nil
			})
			if err != nil || ran != 1 || string(res.Value) != "done" {
				t.Fatalf("next call: %q, %v, effect ran %d times; want it run once at once", res.Value, err, ran)
			}
		})
	}
}

// replyLostBatch is replyLost for batches: its next ClaimBatch is taken
// by the store, every answer of it lost.
type replyLostBatch struct {
	*guard.RedisStore
	lose atomic.Bool
}

func (s *replyLostBatch) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	out, errs := s.RedisStore.ClaimBatch(ctx, reqs)
	if s.lose.CompareAndSwap(true, false) {
		timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		for i := range errs {
			out[i], errs[i] = guard.Outcome{}, fmt.Errorf("%w: %w", guard.ErrUnavailable, timeout)
		}
	}
	return out, errs
}

// TestBatchClaimReplyLost: DoBatch releases the claims of a batch whose
// answers were lost, as Do does, and observes no release for them
// (nobody heard of them being acquired).
func TestBatchClaimReplyLost(t *testing.T) {
	s := &replyLostBatch{RedisStore: realStore(t)}
	var events []guard.EventKind
	g := guard.New(s, guard.Options{Lease: time.Minute, MaxAttempts: 1, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		events = append(events, e.Kind)
	})})
	items := []guard.BatchItem{{Key: guard.Key{Scope: "reply-lost", ID: "b1"}, Fingerprint: "fp"}, {Key: guard.Key{Scope: "reply-lost", ID: "b2"}, Fingerprint: "fp"}}
	s.lose.Store(true)
	for i, r := range g.DoBatch(bg, items, func(context.Context, int, guard.Lease) ([]byte, error) {
		t.Error("an effect ran although its claim's answer was lost")
		return nil, nil
	}, guard.BatchOptions{}) {
		if !errors.Is(r.Err, guard.ErrUnavailable) {
			t.Fatalf("item %d: %v, want ErrUnavailable", i, r.Err)
		}
	}
	for _, e := range events {
		if e != guard.EventUnavailable {
			t.Errorf("events %v, want unavailable alone", events)
			break
		}
	}
	ran := 0
	for i, r := range g.DoBatch(bg, items, func(_ context.Context, _ int, l guard.Lease) ([]byte, error) {
		ran++
		if l.Attempt != 1 {
			t.Errorf("attempt %d, want 1: the lost claim was counted", l.Attempt)
		}
		return []byte("done"), nil
	}, guard.BatchOptions{}) {
		if r.Err != nil || string(r.Value) != "done" {
			t.Errorf("item %d next batch: %q, %v; want it run at once", i, r.Value, r.Err)
		}
	}
	if ran != len(items) {
		t.Errorf("effects ran %d times, want %d", ran, len(items))
	}
}
