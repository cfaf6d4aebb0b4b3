package promx_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/promx"
)

// TestFallbackOverTimedStore: a fallback.Store over m.Store(a RedisStore)
// keeps what it has over the RedisStore itself: its calls but claims run
// on the caller's goroutine (the client ends them by their deadline: the
// timed store forwards guard.DeadlineStore; a claim never runs inline,
// fallback's TestLateClaimReleasedUnderDeadlines), and steps are kept (it
// forwards guard.StepStore); and the calls are timed.
func TestFallbackOverTimedStore(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	seen := &testenv.Senders{}
	c.AddHook(seen)
	rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t), Unpipelined: true})
	reg := prometheus.NewRegistry()
	m, err := promx.New(reg, promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fallback.New(m.Store(rs), fallback.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	key := guard.Key{Scope: "metrics", ID: "inline"}
	out, err := fb.Claim(ctx, guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %v, %v", out.Status, err)
	}
	claimed := len(seen.IDs())
	if err := fb.SaveStep(ctx, out.Lease, 0, guard.StepResult{Name: "reserve", Result: []byte("r-1")}); err != nil {
		t.Fatalf("SaveStep through the timed store: %v", err)
	}
	if rec, err := rs.Get(ctx, key); err != nil || len(rec.Steps) != 1 || rec.Steps[0].Name != "reserve" {
		t.Fatalf("record after SaveStep: %+v, %v", rec, err)
	}
	if err := fb.Complete(ctx, out.Lease, []byte("ok"), time.Minute); err != nil {
		t.Fatal(err)
	}

	me := testenv.GoroutineID()
	ids := seen.IDs()[claimed:]
	if len(ids) < 3 {
		t.Fatalf("%d commands seen after the claim, want at least 3", len(ids))
	}
	for i, id := range ids {
		if id != me {
			t.Fatalf("command %d sent from goroutine %s, not the caller's (%s): the inline path was lost", i, id, me)
		}
	}
	got := gathered(t, reg)
	for _, op := range []string{"claim", "complete"} {
		if n := got["idemguard_store_duration_seconds{op="+op+",result=ok}"]; n != 1 {
			t.Errorf("%s timed %v times, want 1", op, n)
		}
	}
}

// TestTimedStoreKeepsStepsAsItsStore: the timed store of a StepStore
// answers guard.KeepsSteps as that store does. Timing a fallback.Store
// over a primary that keeps no steps, guard.Step answers
// guard.ErrStepsUnsupported before the step runs, in every attempt (it ran
// the step each time, its result kept nowhere); timing one over a
// RedisStore, the step runs once.
func TestTimedStoreKeepsStepsAsItsStore(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)})
	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		primary guard.Store
		keeps   bool
	}{
		{"redis store", rs, true},
		{"no steps", struct{ guard.Store }{rs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb, err := fallback.New(tc.primary, fallback.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			timed := m.Store(fb)
			storetest.StepRunsWhereKept(t, timed, guard.Key{Scope: "metrics-steps", ID: tc.name}, tc.keeps)
		})
	}
}
