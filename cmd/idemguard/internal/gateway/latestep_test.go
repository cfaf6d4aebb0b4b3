package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
	lost bool // the store did not take the step either
}

func (s *lateStepStore) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	if step.Name == forwardStep && s.late.CompareAndSwap(true, false) {
		if !s.lost {
			if err := s.RedisStore.SaveStep(ctx, lease, index, step); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: test: no answer within the bound", guard.ErrUnavailable)
	}
	return s.RedisStore.SaveStep(ctx, lease, index, step)
}

// TestForwardStepStoredLateIsMarkedUnsent: the forward step is stored but
// its holder hears "unavailable" (Redis answered after the bound; seen in
// TestServeStormDroppedResponses on a loaded machine, where the shared
// Redis answered after fallback's 1 s). The gate writes nothing after a
// step it was not told is stored, so nothing was sent: the client gets
// 503 not-forwarded, and its retry must then reach the upstream, not
// find the step and answer outcome-unknown for a request never sent.
// Whether the store took the step or not, the mark is right: a step it did
// not take is not marked (an unsent mark without its forward step would
// let a later forward pass for one that sent nothing).
func TestForwardStepStoredLateIsMarkedUnsent(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "stored", true: "not stored"}[lost], func(t *testing.T) { testLateStep(t, lost) })
	}
}

func testLateStep(t *testing.T, lost bool) {
	u := newUpstream(t)
	cfg, prefix := config(t, basicConfig, u.URL)
	st := &lateStepStore{RedisStore: guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: prefix}), lost: lost}
	st.late.Store(true)
	e := startConfigured(t, cfg, func(o *Options) { o.Store = st })
	r := post(t, e.srv.URL+"/orders", "k-late", `{"order":"late"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a forward step the store answered late: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	if n := u.count("late"); n != 0 {
		t.Fatalf("the upstream got the request %d times, want 0", n)
	}
	// Released: the record keeps the step and its mark, or no step.
	rec, err := st.Get(context.Background(), guard.Key{Scope: `"acme" POST /orders`, ID: "k-late"})
	want := []string{forwardStep, unsentName(1)}
	if lost {
		want = nil
	}
	var got []string
	for _, s := range rec.Steps {
		got = append(got, s.Name)
	}
	if (err != nil && !errors.Is(err, guard.ErrNotFound)) || !slices.Equal(got, want) {
		t.Fatalf("the released record's steps: %q, %v; want %q", got, err, want)
	}
	r = post(t, e.srv.URL+"/orders", "k-late", `{"order":"late"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the retry: %d %q; want the upstream's 201 (nothing was sent before)", r.status, r.body)
	}
	if n := u.count("late"); n != 1 {
		t.Fatalf("the upstream ran it %d times, want 1", n)
	}
}
