package fallback_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func claimReq(id, token string) guard.ClaimRequest {
	return guard.ClaimRequest{Key: guard.Key{Scope: "breaker", ID: id}, Token: token, Fingerprint: "fp",
		Lease: 5 * time.Second, TTL: time.Minute}
}

// The breaker opens after exactly FailuresToOpen unavailable calls, makes
// no network call while open, half-opens after OpenTimeout, and a probe on
// a live primary closes it. The store's own answers (ErrLeaseLost,
// ErrNotFound, in-progress) never count against the primary.
func TestBreakerOpensAfterFailuresAndHalfOpens(t *testing.T) {
	// The open breaker's checks must come before OpenTimeout has passed
	// since it opened: a round a loaded machine held back past that
	// proves nothing (the breaker half-opened meanwhile) and runs again
	// with an OpenTimeout twice as long.
	testenv.OnTime(t, "an OpenTimeout", 300*time.Millisecond, 4, func(open time.Duration) bool {
		return breakerOpensAndHalfOpens(t, open)
	})
}

// breakerOpensAndHalfOpens runs TestBreakerOpensAfterFailuresAndHalfOpens'
// case with an OpenTimeout of open; late reports that a check of the open
// breaker came after open had passed since it opened.
func breakerOpensAndHalfOpens(t *testing.T, open time.Duration) (late bool) {
	p := newPrimary(t)
	var mu sync.Mutex
	var changes []string
	s := newStore(t, p.store, fallback.Options{
		FailuresToOpen: 3,
		OpenTimeout:    open,
		Timeout:        3 * time.Second,
		Logger:         quiet,
		OnStateChange: func(from, to fallback.State) {
			mu.Lock()
			changes = append(changes, from.String()+"→"+to.String())
			mu.Unlock()
		},
	})

	// Answers that are not unavailability: many of them, breaker stays closed.
	if _, err := s.Claim(bg, claimReq("held", "A")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if out, err := s.Claim(bg, claimReq("held", "B")); err != nil || out.Status != guard.InProgress {
			t.Fatalf("claim held = %v, %v", out.Status, err)
		}
		if err := s.Complete(bg, guard.Lease{Key: claimReq("held", "").Key, Token: "stale"}, nil, time.Minute); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("stale complete = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Get(bg, guard.Key{Scope: "breaker", ID: "absent"}); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("get absent = %v, want ErrNotFound", err)
		}
	}
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("after store answers, breaker %v, want closed", st)
	}

	p.srv.Kill()
	var opened time.Time // no later than the breaker opened
	for i := 1; i <= 3; i++ {
		sent := time.Now()
		if _, err := s.Claim(bg, claimReq("k", "T")); !isUnavailable(err) {
			t.Fatalf("claim %d on dead primary = %v, want ErrUnavailable", i, err)
		}
		want := fallback.StateClosed
		if i == 3 {
			want, opened = fallback.StateOpen, sent
		}
		if st := s.State(); st != want {
			t.Fatalf("after %d failures breaker %v, want %v", i, st, want)
		}
	}

	// Open: every claim and read answers at once, without touching the
	// network.
	sent := p.sent.n.Load()
	for i := 0; i < 50; i++ {
		_, err := s.Claim(bg, claimReq("k", "T"))
		if !isUnavailable(err) || !errors.Is(err, fallback.ErrBreakerOpen) {
			if time.Since(opened) >= open {
				return true
			}
			t.Fatalf("claim while open = %v, want ErrUnavailable and ErrOpenState", err)
		}
		if _, err := s.Get(bg, claimReq("k", "").Key); !isUnavailable(err) {
			t.Fatalf("get while open = %v", err)
		}
	}
	if got := p.sent.n.Load(); got != sent {
		if time.Since(opened) >= open {
			return true
		}
		t.Fatalf("open breaker sent %d commands/dials to the primary", got-sent)
	}
	// A holder's write is still tried (TestHolderWriteWhileBreakerOpen);
	// the primary is dead, and the breaker stays open.
	if err := s.Complete(bg, guard.Lease{Key: claimReq("k", "").Key, Token: "T"}, nil, time.Minute); !isUnavailable(err) {
		t.Fatalf("complete while open = %v", err)
	}
	if st := s.State(); st != fallback.StateOpen {
		if time.Since(opened) >= open {
			return true
		}
		t.Fatalf("breaker %v after a holder's write while open, want open", st)
	}

	// Half-open after OpenTimeout; a probe on a still-dead primary opens it again.
	waitFor(t, 5*time.Second+open, "half-open", func() bool { return s.State() == fallback.StateHalfOpen })
	probed := time.Now()
	if _, err := s.Claim(bg, claimReq("k", "T")); !isUnavailable(err) {
		t.Fatalf("probe on dead primary = %v", err)
	}
	if st := s.State(); st != fallback.StateOpen {
		if time.Since(probed) >= open {
			return true
		}
		t.Fatalf("failed probe left breaker %v, want open", st)
	}

	// Primary back: the next probe closes it.
	p.srv.Restart()
	waitFor(t, 5*time.Second+open, "half-open again", func() bool { return s.State() == fallback.StateHalfOpen })
	out, err := s.Claim(bg, claimReq("k", "T"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("probe on live primary = %v, %v", out.Status, err)
	}
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("successful probe left breaker %v, want closed", st)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed"}
	if len(changes) != len(want) {
		t.Fatalf("state changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("state changes %v, want %v", changes, want)
		}
	}
	return false
}

// A caller that gives up (cancelled context) says nothing about the
// primary: it never opens the breaker.
func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{FailuresToOpen: 1, Logger: quiet})
	ctx, cancel := context.WithCancel(bg)
	cancel()
	for i := 0; i < 5; i++ {
		if _, err := s.Claim(ctx, claimReq("c", "T")); !errors.Is(err, context.Canceled) {
			t.Fatalf("claim with cancelled ctx = %v, want context.Canceled", err)
		}
	}
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("cancelled calls opened the breaker: %v", st)
	}
}

// Fail-closed on a primary that accepts connections but does not answer
// (CLIENT PAUSE): every request gets ErrUnavailable within the bound, no
// effect runs, and once the breaker is open the rest answer without
// waiting at all.
func TestFailClosedWithinBound(t *testing.T) {
	// go-redis ignores a context's deadline on the socket unless
	// ContextTimeoutEnabled: the fallback then runs each call on a
	// goroutine of its own; with it, on the caller's. Both must hold the
	// bound.
	t.Run("default client", func(t *testing.T) {
		failClosedWithinBound(t, newPrimary(t, func(o *redis.Options) { o.DialerRetries = 0 }))
	})
	t.Run("ContextTimeoutEnabled", func(t *testing.T) {
		failClosedWithinBound(t, newPrimary(t, func(o *redis.Options) { o.DialerRetries, o.ContextTimeoutEnabled = 0, true }))
	})
}

func failClosedWithinBound(t *testing.T, p primary) {
	admin := p.srv.Client()
	if err := p.store.LoadScripts(bg); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(bg, "CLIENT", "PAUSE", "5000", "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	// A paused server answers nothing, CLIENT UNPAUSE included: end the
	// calls abandoned at their bound by killing it.
	defer p.srv.Kill()

	const bound = 200 * time.Millisecond
	s := newStore(t, p.store, fallback.Options{Timeout: bound, FailuresToOpen: 4, OpenTimeout: time.Hour, Logger: quiet})
	g := guard.New(s, guard.Options{Lease: 5 * time.Second})
	var ran atomic.Int64
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran.Add(1); return []byte("x"), nil }

	var wg sync.WaitGroup
	var slowest atomic.Int64
	errs := make(chan error, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := g.Do(bg, guard.Key{Scope: "fc", ID: "k"}, "fp", fn)
			d := int64(time.Since(start))
			for {
				cur := slowest.Load()
				if d <= cur || slowest.CompareAndSwap(cur, d) {
					break
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !isUnavailable(err) {
			t.Fatalf("Do on paused primary = %v, want ErrUnavailable", err)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("effect ran %d times with the primary unavailable under FailClosed", n)
	}
	// Generous slack for a loaded 2-core machine; without the bound the
	// paused server holds a call for go-redis's 3s read timeout and more.
	if d := time.Duration(slowest.Load()); d > bound+time.Second {
		t.Fatalf("slowest request took %s, bound %s", d, bound)
	}
	if st := s.State(); st != fallback.StateOpen {
		t.Fatalf("breaker %v after 32 timeouts, want open", st)
	}
	// Open: answered without a call to the primary.
	sent := p.sent.n.Load()
	if _, err := g.Do(bg, guard.Key{Scope: "fc", ID: "k"}, "fp", fn); !isUnavailable(err) {
		t.Fatalf("Do with open breaker = %v", err)
	}
	if p.sent.n.Load() != sent || ran.Load() != 0 {
		t.Fatalf("open breaker reached the primary or ran the effect")
	}
}
