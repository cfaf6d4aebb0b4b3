package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// lateStepStore stores a step and then, once, answers the forward step as
// a store that did not answer in time would (fallback's bound on a call
// to Redis, a read timeout): the step is in the record, its holder was
// told the store is unavailable.
type lateStepStore struct {
	*guard.RedisStore
	late atomic.Bool
}

func (s *lateStepStore) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	err := s.RedisStore.SaveStep(ctx, lease, index, step)
	if err == nil && step.Name == forwardStep && s.late.CompareAndSwap(true, false) {
		return fmt.Errorf("%w: test: no answer within the bound (the step was stored)", guard.ErrUnavailable)
	}
	return err
}

// TestForwardStepStoredLateIsMarkedUnsent: the forward step is stored but
// its holder hears "unavailable" (Redis answered after the bound; seen in
// TestServeStormDroppedResponses on a loaded machine, where the shared
// Redis answered after fallback's 1 s). The gate writes nothing after a
// step it was not told is stored, so nothing was sent: the client gets
// 503 not-forwarded, and its retry must then reach the upstream, not
// find the step and answer outcome-unknown for a request never sent.
func TestForwardStepStoredLateIsMarkedUnsent(t *testing.T) {
	u := newUpstream(t)
	cfg, prefix := config(t, basicConfig, u.URL)
	st := &lateStepStore{RedisStore: guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: prefix})}
	st.late.Store(true)
	e := startConfigured(t, cfg, func(o *Options) { o.Store = st })
	r := post(t, e.srv.URL+"/orders", "k-late", `{"order":"late"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a forward step the store answered late: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	if n := u.count("late"); n != 0 {
		t.Fatalf("the upstream got the request %d times, want 0", n)
	}
	r = post(t, e.srv.URL+"/orders", "k-late", `{"order":"late"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the retry: %d %q; want the upstream's 201 (nothing was sent before)", r.status, r.body)
	}
	if n := u.count("late"); n != 1 {
		t.Fatalf("the upstream ran it %d times, want 1", n)
	}
}
