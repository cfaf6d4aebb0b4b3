package fallback_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// FailOpen is an explicit choice: with the primary up the guard works as
// ever; with it down every claim is let through, unguarded, with a
// warning each, and the holder's writes are no-ops.
func TestFailOpenLetsThroughAndWarns(t *testing.T) {
	p := newPrimary(t)
	var logs testenv.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s := newStore(t, p.store, fallback.Options{Policy: fallback.FailOpen, FailuresToOpen: 2, Logger: logger})
	g := guard.New(s, guard.Options{})
	ran := newEffects()
	do := func(id string) (guard.Result, error) {
		return g.Do(bg, guard.Key{Scope: "open", ID: id}, "fp", func(_ context.Context, l guard.Lease) ([]byte, error) {
			ran.add(id)
			if fallback.Unguarded(l) != (l.Fence == 0) {
				t.Errorf("lease %+v: Unguarded and Fence 0 disagree", l)
			}
			return []byte("ok"), nil
		})
	}

	if _, err := do("up"); err != nil {
		t.Fatal(err)
	}
	if res, err := do("up"); err != nil || !res.Replayed {
		t.Fatalf("repeat with the primary up = %+v, %v; want replay", res, err)
	}
	if strings.Contains(logs.String(), "UNGUARDED") {
		t.Fatalf("warned with the primary up: %s", logs.String())
	}

	p.srv.Kill()
	const n = 5
	for i := range n {
		res, err := do("down")
		if err != nil || res.Replayed || !fallback.Unguarded(res.Lease) || res.Lease.Fence != 0 {
			t.Fatalf("call %d with the primary down = %+v, %v; want an unguarded run", i, res, err)
		}
	}
	if got := ran.get("down"); got != n {
		t.Fatalf("effect ran %d times, want %d: FailOpen stops no duplicate", got, n)
	}
	if got := strings.Count(logs.String(), "running effect UNGUARDED"); got != n {
		t.Fatalf("%d warnings for %d unguarded runs:\n%s", got, n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "key=open/down") {
		t.Fatalf("warnings lack level or key:\n%s", logs.String())
	}
	if st := s.State(); st.String() != "open" {
		t.Fatalf("breaker %v, want open", st)
	}
}

// A token carrying the prefix of unguarded leases is refused, not
// misrouted.
func TestReservedTokenRefused(t *testing.T) {
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{Logger: quiet})
	_, err := s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "i"}, Token: "fallback-open:X",
		Fingerprint: "fp", Lease: time.Second, TTL: time.Minute})
	if !errors.Is(err, fallback.ErrReservedToken) {
		t.Fatalf("claim with reserved token = %v, want ErrReservedToken", err)
	}
	if p.sent.n.Load() != 0 {
		t.Fatalf("a refused claim reached the primary")
	}
}

// New refuses configurations that could only fail later: with an error
// for options that come from configuration, with a panic for a nil
// primary (a programming error).
func TestNewRefusesBadOptions(t *testing.T) {
	rs := guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: testenv.Prefix(t)})
	for name, tc := range map[string]struct {
		opts fallback.Options
		want string
	}{
		"secondary without store": {fallback.Options{Policy: fallback.Secondary}, "needs Options.Secondary"},
		"unknown policy":          {fallback.Options{Policy: fallback.Policy(9)}, "unknown Policy 9"},
	} {
		s, err := fallback.New(rs, tc.opts)
		if err == nil || s != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, %v; want no Store and an error containing %q", name, s, err, tc.want)
		}
	}
	if s, err := fallback.New(nil, fallback.Options{}); err == nil || s != nil || !strings.Contains(err.Error(), "nil primary") {
		t.Errorf("nil primary: New = %v, %v; want no Store and an error", s, err)
	}
	if s, err := fallback.New(rs, fallback.Options{Policy: fallback.FailOpen, Secondary: rs}); err != nil || s == nil {
		t.Errorf("a Secondary under FailOpen is ignored, not refused: %v, %v", s, err)
	}
	for p, want := range map[fallback.Policy]string{fallback.FailClosed: "fail-closed", fallback.Secondary: "secondary",
		fallback.FailOpen: "fail-open", fallback.Policy(9): "unknown"} {
		if p.String() != want {
			t.Errorf("Policy(%d).String() = %q, want %q", p, p.String(), want)
		}
	}
}

// panicky is a real store whose Claim panics for one key.
type panicky struct{ guard.Store }

func (p panicky) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if req.Key.ID == "boom" {
		panic("store bug")
	}
	return p.Store.Claim(ctx, req)
}

// A panic in the primary reaches the caller (it is not swallowed by the
// bounded call), and the breaker counts it as a failure.
func TestPanicInPrimaryReachesCaller(t *testing.T) {
	p := newPrimary(t)
	s := newStore(t, panicky{p.store}, fallback.Options{FailuresToOpen: 1, Logger: quiet})
	func() {
		defer func() {
			if r := recover(); r != "store bug" {
				t.Fatalf("recovered %v, want the store's panic", r)
			}
		}()
		_, _ = s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "boom"}, Token: "T", Fingerprint: "fp",
			Lease: time.Second, TTL: time.Minute})
		t.Fatal("Claim returned after its store panicked")
	}()
	if st := s.State(); st.String() != "open" {
		t.Fatalf("breaker %v after a panicking call, want open", st)
	}
}
