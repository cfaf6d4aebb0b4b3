package guard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// hooked is a real store with hooks around its calls, to hold a call up
// the way a slow or partitioned network would.
type hooked struct {
	guard.Store
	beforeClaim  func()                             // before a claim reaches the store
	afterClaim   func(guard.Outcome)                // after the store answered a claim
	beforeExtend func(ctx context.Context, n int32) // before the n-th extension (from 1) reaches the store
	extends      atomic.Int32
	// onWire: an extension, once past beforeExtend, reaches the server
	// whatever its context says, as a request already sent does.
	onWire bool
	// afterExtend hears how the n-th extension ended.
	afterExtend func(n int32, err error)
}

func (h *hooked) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if h.beforeClaim != nil {
		h.beforeClaim()
	}
	out, err := h.Store.Claim(ctx, req)
	if err == nil && h.afterClaim != nil {
		h.afterClaim(out)
	}
	return out, err
}

func (h *hooked) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	n := h.extends.Add(1)
	if h.beforeExtend != nil {
		h.beforeExtend(ctx, n)
	}
	if h.onWire {
		ctx = context.WithoutCancel(ctx)
	}
	err := h.Store.Extend(ctx, l, d)
	if h.afterExtend != nil {
		h.afterExtend(n, err)
	}
	return err
}

// realStore is a RedisStore on the shared Redis under a prefix of the
// test's own.
func realStore(t *testing.T) *guard.RedisStore {
	t.Helper()
	s := guardenv.Store(t, guard.RedisOptions{})
	return s
}

// claimWhenFree claims key through g until it is acquired, polling every
// few milliseconds so that it succeeds as soon as the server lets it.
// onAcquired runs as soon as the claim is known to have succeeded.
func claimWhenFree(t *testing.T, g *guard.Guard, key guard.Key, limit time.Duration, onAcquired func(guard.Lease)) (guard.Lease, error) {
	deadline := time.Now().Add(limit)
	for {
		out, err := g.Claim(bg, key, "fp")
		if err == nil && out.Status == guard.Acquired {
			onAcquired(out.Lease)
			return out.Lease, nil
		}
		if !errors.Is(err, guard.ErrInProgress) && !errors.Is(err, guard.ErrUnavailable) {
			return guard.Lease{}, fmt.Errorf("claim: %+v, %v", out, err)
		}
		if time.Now().After(deadline) {
			return guard.Lease{}, fmt.Errorf("not acquired within %s: %v", limit, err)
		}
		time.Sleep(2 * time.Millisecond) // waiting for the server's lease to run out
	}
}

// The effect's context ends at the lease's deadline while the extension
// that would keep it alive hangs (a partition, and a client that waits
// out its read timeout whatever the context says, as go-redis does by
// default), before another claim can succeed, and not before the
// deadline.
func TestDeadlineCancelsWhileExtensionHangs(t *testing.T) {
	const lease = time.Second
	release := make(chan struct{})
	h := &hooked{Store: realStore(t), beforeExtend: func(ctx context.Context, _ int32) {
		select { // no answer until the other holder has the key, or a read timeout
		case <-release:
		case <-time.After(3 * lease):
		}
	}}
	g := guard.New(h, guard.Options{Lease: lease})
	other := guard.New(h.Store, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "partitioned"}

	var aCtx atomic.Pointer[context.Context]
	var cancelledAt atomic.Int64
	bDone := make(chan error, 1)
	_, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		aCtx.Store(&ctx)
		go func() {
			_, err := claimWhenFree(t, other, key, 5*lease, func(guard.Lease) {
				if (*aCtx.Load()).Err() == nil {
					t.Error("B's claim succeeded while A's context was live")
				}
			})
			close(release)
			bDone <- err
		}()
		<-ctx.Done()
		cancelledAt.Store(time.Now().UnixNano())
		if h.extends.Load() != 1 {
			t.Errorf("%d extensions started, want 1 (hanging)", h.extends.Load())
		}
		if now := time.Now(); now.Before(l.Deadline) {
			t.Errorf("cancelled %s before the deadline", l.Deadline.Sub(now))
		}
		if d := time.Until(l.Deadline.Add(lease)); d < 0 || !errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
			t.Errorf("cause %v, %s after the deadline", context.Cause(ctx), -d)
		}
		return nil, context.Cause(ctx)
	})
	if !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("Do = %v, want the effect's ErrLeaseLost", err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
}

// An extension that succeeds only after the deadline (the server still
// had the lease) revives nothing: the context stays cancelled, the
// heartbeat does not go on, and the key is free once the lease the late
// extension set runs out, while the effect, ignoring its context, still
// runs.
func TestLateExtensionDoesNotRevive(t *testing.T) {
	const lease = 900 * time.Millisecond
	cancelled := make(chan struct{})
	// The claim takes 200ms to reach the server, so the server's lease
	// ends 200ms after the client's deadline: room for the late
	// extension to arrive while the server still has the lease.
	h := &hooked{Store: realStore(t), onWire: true, beforeClaim: func() { time.Sleep(200 * time.Millisecond) }}
	lateDone := make(chan error, 1)
	h.beforeExtend = func(_ context.Context, n int32) {
		if n == 1 {
			select { // held past the client's deadline, then sent
			case <-cancelled:
			case <-time.After(3 * lease):
			}
		}
	}
	h.afterExtend = func(n int32, err error) {
		if n == 1 {
			lateDone <- err
		}
	}
	g := guard.New(h, guard.Options{Lease: lease})
	other := guard.New(h.Store, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "late-extension"}
	start := time.Now()
	res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		<-ctx.Done()
		close(cancelled)
		if err := <-lateDone; err != nil {
			return nil, fmt.Errorf("the late extension failed (%w): the test proves nothing", err)
		}
		// Ignore the context: keep running until someone else has the key.
		b, err := claimWhenFree(t, other, key, 5*lease, func(guard.Lease) {})
		if err != nil {
			return nil, err
		}
		if !b.Recovered || b.Fence != l.Fence+1 {
			return nil, fmt.Errorf("B's lease %+v, want recovered with fence %d", b, l.Fence+1)
		}
		return []byte("late"), nil
	})
	if !errors.Is(err, guard.ErrLeaseLost) || string(res.Value) != "late" {
		t.Fatalf("Do = %+v, %v; want the value and ErrLeaseLost (B took over)", res, err)
	}
	if n := h.extends.Load(); n != 1 {
		t.Fatalf("%d extensions, want 1: the heartbeat went on after the deadline", n)
	}
	if took := time.Since(start); took < lease+lease/2 {
		t.Fatalf("B took the key after %s: the late extension did not reach the server, the test proves nothing", took)
	}
}

// A claim answered after its lease's deadline is not used: Do does not
// run the effect and Claim hands out no lease; both give ErrUnavailable
// and release the claim, attempt uncounted.
func TestClaimAnsweredLateIsReleased(t *testing.T) {
	const lease = 300 * time.Millisecond
	var slow atomic.Bool
	h := &hooked{Store: realStore(t), afterClaim: func(guard.Outcome) {
		if slow.Load() {
			time.Sleep(lease) // the answer is slow to come back
		}
	}}
	g := guard.New(h, guard.Options{Lease: lease})

	// A first attempt fails, so the late claim is attempt 2.
	key := guard.Key{Scope: "s", ID: "late-claim"}
	if _, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, errors.New("first attempt fails")
	}); err == nil {
		t.Fatal("first attempt did not fail")
	}
	slow.Store(true)
	_, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("the effect ran on a claim answered after its deadline")
		return nil, nil
	})
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Do with a late claim = %v, want ErrUnavailable", err)
	}
	// The error names the option to raise.
	if !strings.Contains(err.Error(), "answered after the lease's deadline") || !strings.Contains(err.Error(), "Options.Lease 300ms") {
		t.Fatalf("Do with a late claim = %v, want it to name Options.Lease 300ms", err)
	}
	out, err := g.Claim(bg, key, "fp")
	if !errors.Is(err, guard.ErrUnavailable) || out.Status != 0 {
		t.Fatalf("Claim answered late = %+v, %v; want no outcome and ErrUnavailable", out, err)
	}
	slow.Store(false)
	res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || res.Lease.Attempt != 2 || res.Lease.Recovered {
		t.Fatalf("after two late claims: %+v, %v; want attempt 2 (late claims released, uncounted)", res.Lease, err)
	}

	// A fresh key: the late claim leaves nothing behind.
	slow.Store(true)
	fresh := guard.Key{Scope: "s", ID: "late-fresh"}
	if _, err := g.Claim(bg, fresh, "fp"); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("late fresh claim = %v", err)
	}
	if _, err := g.Get(bg, fresh); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("record after a late fresh claim: %v, want released", err)
	}
}

// Claim sets the lease's deadline from when it was sent; KeepAlive keeps
// it, and cancels at once a lease whose deadline has passed.
func TestClaimDeadlineAndKeepAlive(t *testing.T) {
	const lease = 2 * time.Second
	g := guard.New(realStore(t), guard.Options{Lease: lease})
	before := time.Now()
	out, err := g.Claim(bg, guard.Key{Scope: "s", ID: "deadline"}, "fp")
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	validity := lease - guard.LeaseMargin(lease)
	if d := out.Lease.Deadline; d.Before(before.Add(validity)) || d.After(after.Add(validity)) {
		t.Fatalf("deadline %s not within [sent + %s]", d, validity)
	}
	if m := guard.LeaseMargin(lease); m != 22*time.Millisecond {
		t.Fatalf("LeaseMargin(2s) = %s, want 22ms", m)
	}
	expired := out.Lease
	expired.Deadline = time.Now().Add(-time.Millisecond)
	ctx, stop := g.KeepAlive(bg, expired)
	defer stop()
	if !errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
		t.Fatalf("KeepAlive of a lease past its deadline: cause %v, want ErrLeaseLost at once", context.Cause(ctx))
	}
	if err := g.Complete(bg, out.Lease, []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// An effect shorter than a third of the lease costs no goroutine: nothing
// of the guard runs beside it.
func TestShortEffectStartsNoGoroutine(t *testing.T) {
	g := realGuard(t, guard.Options{Lease: 3 * time.Second})
	for i := range 20 {
		_, err := g.Do(bg, guard.Key{Scope: "s", ID: fmt.Sprint("short-", i)}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			if strings.Contains(stacks, "guard.(*keepalive)") {
				return nil, fmt.Errorf("a guard goroutine runs beside a short effect:\n%s", stacks)
			}
			return []byte("v"), nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// MaxRun: the effect's context ends with ErrMaxRun (and ErrLeaseLost),
// the attempt is recorded as failed, and the key runs again.
func TestMaxRunCancels(t *testing.T) {
	const maxRun = 300 * time.Millisecond
	g := realGuard(t, guard.Options{Lease: 3 * time.Second, MaxRun: maxRun})
	key := guard.Key{Scope: "s", ID: "hung"}
	start := time.Now()
	_, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(10 * maxRun):
			return nil, errors.New("not cancelled at MaxRun")
		}
	})
	took := time.Since(start)
	if !errors.Is(err, guard.ErrMaxRun) || !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("Do = %v, want a cause matching ErrMaxRun and ErrLeaseLost", err)
	}
	if took < maxRun {
		t.Fatalf("cancelled after %s, before MaxRun %s", took, maxRun)
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StateFailed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "maximum run time") {
		t.Fatalf("record %+v, %v; want failed after attempt 1 with the MaxRun cause", rec, err)
	}
	res, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || res.Lease.Attempt != 2 {
		t.Fatalf("retry = %+v, %v", res, err)
	}
}

// MaxRun stops the heartbeat: an effect that ignores its context keeps
// running, but another claim recovers the key once the lease runs out.
func TestMaxRunFreesKeyOfHungEffect(t *testing.T) {
	const lease, maxRun = 600 * time.Millisecond, 700 * time.Millisecond
	h := &hooked{Store: realStore(t)}
	g := guard.New(h, guard.Options{Lease: lease, MaxRun: maxRun})
	other := guard.New(h.Store, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "ignores-ctx"}
	res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		select {
		case <-ctx.Done():
		case <-time.After(10 * maxRun):
			return nil, errors.New("not cancelled at MaxRun")
		}
		if !errors.Is(context.Cause(ctx), guard.ErrMaxRun) {
			return nil, fmt.Errorf("cause %v, want ErrMaxRun", context.Cause(ctx))
		}
		extends := h.extends.Load()
		b, err := claimWhenFree(t, other, key, 4*lease, func(guard.Lease) {})
		if err != nil {
			return nil, fmt.Errorf("the key was not freed after MaxRun: %w", err)
		}
		if !b.Recovered || h.extends.Load() != extends {
			return nil, fmt.Errorf("B's lease %+v, extensions %d → %d", b, extends, h.extends.Load())
		}
		return []byte("too late"), nil
	})
	if !errors.Is(err, guard.ErrLeaseLost) || string(res.Value) != "too late" {
		t.Fatalf("Do = %+v, %v; want the value and ErrLeaseLost", res, err)
	}
}

func TestMaxRunDefaults(t *testing.T) {
	s, _ := miniStore(t)
	if got := guard.New(s, guard.Options{}).Options().MaxRun; got != 5*time.Minute || guard.DefaultMaxRun != 5*time.Minute {
		t.Errorf("default MaxRun = %s, want 5m", got)
	}
	if got := guard.New(s, guard.Options{MaxRun: -time.Second}).Options().MaxRun; got >= 0 {
		t.Errorf("negative MaxRun = %s, want no limit (-1)", got)
	}
	// No limit: an effect longer than a tiny MaxRun would be runs on.
	g := guard.New(s, guard.Options{Lease: 300 * time.Millisecond, MaxRun: -1})
	_, err := g.Do(bg, guard.Key{Scope: "s", ID: "unbounded"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(500 * time.Millisecond): // longer than the lease: heartbeats keep it
			return []byte("v"), nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A context derived from the claim's (as a store or its client may make)
// ends with it and costs no goroutine.
func TestClaimContextDerived(t *testing.T) {
	var derived atomic.Pointer[context.Context]
	h := &hooked{Store: realStore(t), afterClaim: func(guard.Outcome) {}}
	g := guard.New(storeFunc{h, func(ctx context.Context) {
		d, cancel := context.WithTimeout(ctx, time.Hour)
		_ = cancel // ended by the claim's context, checked below
		derived.Store(&d)
		buf := make([]byte, 1<<20)
		if n := runtime.Stack(buf, true); strings.Contains(string(buf[:n]), "propagateCancel") {
			t.Error("deriving from the claim's context started a goroutine")
		}
	}}, guard.Options{})
	if _, err := g.Do(bg, guard.Key{Scope: "s", ID: "derived"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("v"), nil
	}); err != nil {
		t.Fatal(err)
	}
	d := *derived.Load()
	select {
	case <-d.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from the claim's did not end with it")
	}
}

// storeFunc calls onClaim with the claim's context before the claim.
type storeFunc struct {
	guard.Store
	onClaim func(ctx context.Context)
}

func (s storeFunc) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.onClaim(ctx)
	return s.Store.Claim(ctx, req)
}

// The claim's context ends with the caller's: a caller that gives up
// while its claim is on the way is not kept waiting for the answer, and a
// context derived from the claim's ends too, without a goroutine.
func TestClaimContextEndsWithCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	g := guard.New(storeFunc{realStore(t), func(cctx context.Context) {
		d, dcancel := context.WithTimeout(cctx, time.Hour)
		defer dcancel()
		buf := make([]byte, 1<<20)
		if n := runtime.Stack(buf, true); strings.Contains(string(buf[:n]), "propagateCancel") {
			t.Error("deriving from the claim's context started a goroutine")
		}
		cancel()
		for _, c := range []context.Context{cctx, d} {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Error("the claim's context (or one derived from it) did not end with the caller's")
				return
			}
		}
		if !errors.Is(cctx.Err(), context.Canceled) {
			t.Errorf("the claim's context ended with %v, want the caller's context.Canceled", cctx.Err())
		}
	}}, guard.Options{})
	_, err := g.Do(ctx, guard.Key{Scope: "s", ID: "caller-gone"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("the effect ran after its caller gave up during the claim")
		return nil, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
}

// Do's owner tokens are as rand.Text makes them (26 characters of the
// base32 alphabet), differ from call to call, and stay what the record
// keeps after Do returns.
func TestDoTokens(t *testing.T) {
	g := realGuard(t, guard.Options{})
	seen := map[string]bool{}
	var leases []guard.Lease
	for i := range 200 {
		key := guard.Key{Scope: "s", ID: fmt.Sprint("token-", i)}
		res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			rec, err := g.Get(ctx, l.Key)
			if err != nil || rec.Token != l.Token {
				return nil, fmt.Errorf("record %+v, %v; want the lease's token %q", rec, err, l.Token)
			}
			return []byte("v"), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		tok := res.Lease.Token
		if len(tok) != 26 || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" || seen[tok] {
			t.Fatalf("token %q: want 26 base32 characters, new each call", tok)
		}
		seen[tok] = true
		leases = append(leases, res.Lease)
	}
	runtime.GC()
	for _, l := range leases {
		if !seen[l.Token] {
			t.Fatalf("a lease's token changed after Do returned: %q", l.Token)
		}
	}
}

// unavailableExtend is a real store whose extensions answer
// ErrUnavailable while down is set, as a store briefly out of reach does.
type unavailableExtend struct {
	*hooked
	down atomic.Bool
}

func (u *unavailableExtend) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	if u.down.Load() {
		u.hooked.extends.Add(1)
		return fmt.Errorf("%w: connection refused", guard.ErrUnavailable)
	}
	return u.hooked.Extend(ctx, l, d)
}

// A heartbeat that fails for less than the lease left rides it out: the
// extensions are tried again, sooner as the deadline nears, the effect's
// context stays live, and the result is stored; an outage that outlasts
// the lease ends the context at the deadline, with the last failure in
// the cause.
func TestHeartbeatRidesOutUnavailable(t *testing.T) {
	// Three failed extensions and a successful one must fit in a lease:
	// with 300ms a loaded machine can run past the deadline first.
	const lease = 1200 * time.Millisecond
	s := &unavailableExtend{hooked: &hooked{Store: realStore(t)}}
	g := guard.New(s, guard.Options{Lease: lease})
	s.down.Store(true)
	res, err := g.Do(bg, guard.Key{Scope: "s", ID: "blip"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		testenv.WaitFor(t, 10*time.Second, "three failed extensions", func() bool { return s.extends.Load() >= 3 })
		s.down.Store(false) // back before the deadline: the next try succeeds
		if time.Now().After(l.Deadline) {
			return nil, fmt.Errorf("the outage outlasted the lease (%s past its deadline): the test proves nothing", time.Since(l.Deadline))
		}
		n := s.extends.Load()
		testenv.WaitFor(t, 10*time.Second, "a successful extension", func() bool { return s.extends.Load() > n+1 })
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("the effect's context ended although an extension succeeded in time: %w", context.Cause(ctx))
		}
		return []byte("ok"), nil
	})
	if err != nil || string(res.Value) != "ok" {
		t.Fatalf("Do = %+v, %v", res, err)
	}

	s.down.Store(true)
	_, err = g.Do(bg, guard.Key{Scope: "s", ID: "outage"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		<-ctx.Done()
		if now := time.Now(); now.Before(l.Deadline) {
			t.Errorf("cancelled %s before the deadline", l.Deadline.Sub(now))
		}
		return nil, context.Cause(ctx)
	})
	if !errors.Is(err, guard.ErrLeaseLost) || !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Do through an outage = %v, want ErrLeaseLost with the last extension's ErrUnavailable", err)
	}
}

// The deadline an extension sets counts from when it was sent, not from
// when its answer came: the server ran it no sooner than it was sent, so
// the lease it set may end Lease after that. An extension answered 250ms
// late, followed by one that never answers, ends the effect's context at
// (sent + Lease − LeaseMargin), not 250ms later; so does DoBatch's
// heartbeat (through a store without WriteBatch: one Extend per key). The
// deadline is read from the next extension's context (the guard bounds it
// by the lease's deadline), not from when the effect saw its context end:
// a loaded machine wakes the effect late, and 150ms late looked like the
// bug.
func TestExtensionDeadlineFromSent(t *testing.T) {
	const lease = 600 * time.Millisecond
	validity := lease - guard.LeaseMargin(lease)
	for _, tc := range []struct {
		name string
		run  func(g *guard.Guard, key guard.Key, effect guard.Func) error
	}{
		{"Do", func(g *guard.Guard, key guard.Key, effect guard.Func) error {
			_, err := g.Do(bg, key, "fp", effect)
			return err
		}},
		{"DoBatch", func(g *guard.Guard, key guard.Key, effect guard.Func) error {
			res := g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) {
				return effect(ctx, l)
			}, guard.BatchOptions{})
			return res[0].Err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := 1; ; round++ {
				if extensionDeadlineFromSent(t, lease, validity, round, tc.run) {
					return
				}
				if round == 3 {
					t.Fatalf("in %d rounds the second extension was never sent before the lease's deadline: the machine is too slow to tell", round)
				}
			}
		})
	}
}

// extensionDeadlineFromSent runs one round of TestExtensionDeadlineFromSent
// with run, which runs the effect it is given; it
// reports false when the guard gave the lease up before sending the second
// extension (a stall of 300ms), which proves nothing either way.
func extensionDeadlineFromSent(t *testing.T, lease, validity time.Duration, round int, run func(*guard.Guard, guard.Key, guard.Func) error) bool {
	var (
		mu       sync.Mutex
		sent     time.Time
		deadline time.Time
		bounded  bool
	)
	// hooked is a plain Store (its embedded interface hides RedisStore's
	// WriteBatch).
	h := &hooked{Store: realStore(t), onWire: true}
	h.beforeExtend = func(ctx context.Context, n int32) {
		if n == 1 {
			mu.Lock()
			sent = time.Now()
			mu.Unlock()
			return
		}
		if n == 2 {
			mu.Lock()
			deadline, bounded = ctx.Deadline()
			mu.Unlock()
		}
		<-ctx.Done() // the next one hangs until given up
	}
	h.afterExtend = func(n int32, err error) {
		if n == 1 {
			time.Sleep(250 * time.Millisecond) // its answer is slow to come back
		}
	}
	g := guard.New(h, guard.Options{Lease: lease})
	var cancelledAt time.Duration // after the first extension was sent
	effect := func(ctx context.Context, _ guard.Lease) ([]byte, error) {
		<-ctx.Done()
		mu.Lock()
		defer mu.Unlock()
		cancelledAt = time.Since(sent)
		return nil, context.Cause(ctx)
	}
	if err := run(g, guard.Key{Scope: "s", ID: fmt.Sprintf("slow-answer-%s-%d", t.Name(), round)}, effect); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("run = %v, want ErrLeaseLost", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if h.extends.Load() < 2 {
		// The first extension was sent so late that its slow answer came
		// after the deadline (a loaded machine): the context ended at the
		// claim's deadline, which proves nothing either way.
		t.Logf("round %d: the lease's deadline passed before the second extension was sent; again", round)
		return false
	}
	// Never before the deadline counted from the send (sent is read a
	// moment after the guard's own reading of the clock); a loaded
	// machine can only make this later.
	if cancelledAt < validity-20*time.Millisecond {
		t.Errorf("cancelled %s after the extension was sent, want %s", cancelledAt, validity)
	}
	if !bounded {
		t.Fatal("the second extension's context has no deadline")
	}
	// The guard read the clock before the hook did: counted from the
	// send, the deadline is at most validity after the hook's reading;
	// counted from the answer, 250ms more.
	if d := deadline.Sub(sent); d > validity || d < validity-150*time.Millisecond {
		t.Errorf("the lease's deadline after the first extension: %s after it was sent, want %s (dated from the answer: %s)",
			d, validity, validity+250*time.Millisecond)
	}
	return true
}
