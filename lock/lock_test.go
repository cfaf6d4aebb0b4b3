package lock_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// redlockNodes returns new clients of the shared Redlock nodes, closed when
// the test ends. Tests write only keys under testenv.Prefix(t).
func redlockNodes(t *testing.T) []redis.UniversalClient {
	t.Helper()
	return closing(t, lock.NewNodes(testenv.List(t, testenv.EnvRedlock)...))
}

// closing closes nodes when the test ends.
func closing(t *testing.T, nodes []redis.UniversalClient) []redis.UniversalClient {
	for _, c := range nodes {
		t.Cleanup(func() { _ = c.Close() })
	}
	return nodes
}

// ownNodes starts n Redis servers of the test's own, for tests that kill
// them, and returns them with a client of each.
func ownNodes(t *testing.T, n int) ([]*testenv.Server, []redis.UniversalClient) {
	t.Helper()
	servers := make([]*testenv.Server, n)
	addrs := make([]string, n)
	for i := range n {
		servers[i] = testenv.StartRedis(t)
		addrs[i] = servers[i].Addr()
	}
	return servers, closing(t, lock.NewNodes(addrs...))
}

func newLocker(t *testing.T, nodes []redis.UniversalClient, opts lock.Options) *lock.Locker {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testenv.Prefix(t)
	}
	if opts.TimeoutFactor == 0 {
		// The test machine is shared and often overloaded (load 20+ on 2
		// cores): the default 400ms bound per round is about production
		// latency, not about the property under test, so give rounds more.
		opts.TimeoutFactor = 0.2
	}
	l, err := lock.New(nodes, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// section is an overlap detector for critical sections. inside counts the
// holders in the section; it must never exceed 1. Its atomic operations
// also give the race detector the happens-before edge between one
// section's exit and the next one's entry when (and only when) they do not
// overlap, so a plain counter touched inside is reported by -race exactly
// when two sections overlap.
type section struct {
	inside atomic.Int32
	max    atomic.Int32
}

func (s *section) enter() {
	n := s.inside.Add(1)
	for {
		m := s.max.Load()
		if n <= m || s.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (s *section) exit() { s.inside.Add(-1) }

func (s *section) check(t *testing.T) {
	t.Helper()
	if m := s.max.Load(); m != 1 {
		t.Fatalf("at most %d holders were in the section at once, want 1", m)
	}
}

// TestDoMutualExclusion: 4 processes (Lockers with clients of their own) ×
// 8 goroutines increment a plain, non-atomic counter under Do on the 3
// Redlock nodes; no increment is lost and no two sections overlap.
func TestDoMutualExclusion(t *testing.T) {
	const procs, perProc, rounds = 4, 8, 6
	prefix := testenv.Prefix(t)
	lockers := make([]*lock.Locker, procs)
	for i := range lockers {
		lockers[i] = newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix, RetryDelay: 10 * time.Millisecond})
	}
	var (
		counter int // plain on purpose
		sec     section
		wg      sync.WaitGroup
		errs    = make(chan error, procs*perProc)
	)
	for p := range procs {
		for range perProc {
			wg.Go(func() {
				for range rounds {
					err := lockers[p].Do(bg, "counter", func(ctx context.Context) error {
						sec.enter()
						defer sec.exit()
						v := counter
						runtime.Gosched() // widen the window a lost update needs
						counter = v + 1
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sec.check(t)
	if want := procs * perProc * rounds; counter != want {
		t.Fatalf("counter = %d, want %d", counter, want)
	}
}

func TestTryDoTaken(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	held, err := l.Obtain(bg, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(bg)

	ran := false
	start := time.Now()
	err = l.TryDo(bg, "job", func(context.Context) error { ran = true; return nil })
	var taken *redsync.ErrTaken
	if !errors.Is(err, lock.ErrNotObtained) || errors.Is(err, lock.ErrUnavailable) || !errors.As(err, &taken) || ran {
		t.Fatalf("TryDo on a held lock = %v (ran %v), want ErrNotObtained wrapping *redsync.ErrTaken", err, ran)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("TryDo took %s", d)
	}

	// Waiting with a deadline: ErrNotObtained together with the ctx error.
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	err = l.Do(ctx, "job", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("Do with a deadline on a held lock = %v (ran %v)", err, ran)
	}

	// Waiting with a bound on tries.
	lt := newLocker(t, redlockNodes(t), lock.Options{Prefix: l.Options().Prefix, Tries: 3, RetryDelay: 5 * time.Millisecond})
	err = lt.Do(bg, "job", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, lock.ErrNotObtained) || ran {
		t.Fatalf("Do with Tries 3 on a held lock = %v (ran %v)", err, ran)
	}

	// Another name is free.
	if err := l.TryDo(bg, "other", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestDoWaitsForRelease: a waiting Do gets the lock once the holder
// releases it.
func TestDoWaitsForRelease(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{RetryDelay: 10 * time.Millisecond})
	held, err := l.Obtain(bg, "x")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var acquiredAt time.Time
	go func() {
		got <- l.Do(bg, "x", func(context.Context) error { acquiredAt = time.Now(); return nil })
	}()
	time.Sleep(100 * time.Millisecond) // hold the lock a while: the waiter must not get in meanwhile
	released := time.Now()
	if err := held.Release(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if acquiredAt.Before(released) {
		t.Fatalf("waiter got the lock at %s, before it was released at %s", acquiredAt, released)
	}
}

func TestObtainExtendRelease(t *testing.T) {
	nodes := redlockNodes(t)
	l := newLocker(t, nodes, lock.Options{Expiry: 2 * time.Second})
	k, err := l.Obtain(bg, "low-level")
	if err != nil {
		t.Fatal(err)
	}
	if k.Name() != "low-level" || !strings.HasSuffix(k.Key(), "low-level") {
		t.Fatalf("Name %q Key %q", k.Name(), k.Key())
	}
	first := k.Until()
	if left := time.Until(first); left <= 0 || left > 2*time.Second {
		t.Fatalf("Until is %s away", left)
	}
	for _, c := range nodes {
		if ttl := c.PTTL(bg, k.Key()).Val(); ttl <= 0 || ttl > 2*time.Second {
			t.Fatalf("key %s has PTTL %s on a node", k.Key(), ttl)
		}
	}
	if err := k.Extend(bg); err != nil {
		t.Fatal(err)
	}
	if !k.Until().After(first) {
		t.Fatalf("Until did not move: %s, then %s", first, k.Until())
	}
	if err := k.Release(bg); err != nil {
		t.Fatal(err)
	}
	for _, c := range nodes {
		if n := c.Exists(bg, k.Key()).Val(); n != 0 {
			t.Fatalf("key %s still on a node after Release", k.Key())
		}
	}
	if err := k.Release(bg); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("second Release = %v, want ErrLost", err)
	}
	if err := k.Extend(bg); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Extend after Release = %v, want ErrLost", err)
	}
}

// TestDoExtendsPastExpiry: fn runs for several expiries; the watchdog
// keeps the lock, and nobody else gets it meanwhile.
func TestDoExtendsPastExpiry(t *testing.T) {
	const expiry = time.Second
	l := newLocker(t, redlockNodes(t), lock.Options{Expiry: expiry})
	err := l.Do(bg, "long", func(ctx context.Context) error {
		deadline := time.Now().Add(3 * expiry)
		for time.Now().Before(deadline) {
			// ErrUnavailable: rounds timed out on an overloaded machine;
			// what must not happen is getting the lock.
			if err := l.TryDo(bg, "long", func(context.Context) error { return nil }); err == nil ||
				!(errors.Is(err, lock.ErrNotObtained) || errors.Is(err, lock.ErrUnavailable)) {
				t.Errorf("TryDo while held = %v, want ErrNotObtained", err)
				return nil
			}
			if ctx.Err() != nil {
				t.Errorf("fn's context ended while the lock was extended: %v", context.Cause(ctx))
				return nil
			}
			time.Sleep(expiry / 8) // waiting for time to pass: the lock must outlive its expiry
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// lossResult is what a stalled holder saw when its context ended.
type lossResult struct {
	after time.Duration // from the start signal to the cancellation
	cause error
}

// stalledHolder runs Do(name) in the background with an fn that signals
// started, waits for its context to end, reports the cause on lost, then
// stalls on until release is closed. Do's error arrives on done.
func stalledHolder(l *lock.Locker, name string) (started chan time.Time, lost chan lossResult, release chan struct{}, done chan error) {
	started = make(chan time.Time, 1)
	lost = make(chan lossResult, 1)
	release = make(chan struct{})
	done = make(chan error, 1)
	go func() {
		done <- l.Do(bg, name, func(ctx context.Context) error {
			t0 := time.Now()
			started <- t0
			<-ctx.Done()
			lost <- lossResult{after: time.Since(t0), cause: context.Cause(ctx)}
			<-release
			return nil // fn ignores the loss: Do must still report it
		})
	}()
	return started, lost, release, done
}

// waitStarted waits until a stalledHolder's fn runs, and returns when it
// started, or fails the test if its Do returned without running it.
func waitStarted(t *testing.T, started chan time.Time, done chan error) time.Time {
	t.Helper()
	select {
	case t0 := <-started:
		return t0
	case err := <-done:
		t.Fatalf("the first holder did not get the lock: %v", err)
	}
	return time.Time{}
}

// TestStalledHolderLosesLock: the holder's keys vanish behind its back (as
// when they expire during a stall); its watchdog finds the lock gone and
// cancels fn's context with ErrLost, and another holder gets the lock
// while the first one's fn is still stuck.
func TestStalledHolderLosesLock(t *testing.T) {
	const expiry = 600 * time.Millisecond
	nodes := redlockNodes(t)
	l := newLocker(t, nodes, lock.Options{Expiry: expiry, RetryDelay: 10 * time.Millisecond})
	started, lost, release, done := stalledHolder(l, "stall")
	t0 := waitStarted(t, started, done)
	key := l.Options().Prefix + "stall"
	for _, c := range nodes {
		if err := c.Del(bg, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	var loss lossResult
	select {
	case loss = <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("fn's context was not cancelled within 5s of its lock vanishing")
	}
	if !errors.Is(loss.cause, lock.ErrLost) {
		t.Fatalf("fn's context cause = %v, want ErrLost", loss.cause)
	}
	// Reckoned from the deletions, not from fn's start: on a loaded
	// machine the deletions themselves can take a good part of an expiry.
	if d := t0.Add(loss.after).Sub(deleted); d > expiry {
		t.Fatalf("fn heard of the loss %s after the lock vanished, more than the expiry %s", d, expiry)
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	// The first fn is still stuck inside its section: the second holder
	// gets the lock all the same.
	if err := l.Do(ctx, "stall", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("second holder: %v", err)
	}
	close(release)
	if err := <-done; !errors.Is(err, lock.ErrLost) {
		t.Fatalf("first Do = %v, want ErrLost", err)
	}
	t.Logf("loss heard %s after the start of fn", loss.after)
}

// TestValidityRunsOut: two of three nodes die while fn runs; extensions
// cannot reach a quorum, so fn's context is cancelled with ErrLost when
// the lock's validity ends (not later), and once the nodes are back
// another holder gets the lock while the first fn is still stuck.
func TestValidityRunsOut(t *testing.T) {
	const expiry = 600 * time.Millisecond
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Expiry: expiry, TimeoutFactor: 0.2, RetryDelay: 10 * time.Millisecond})
	started, lost, release, done := stalledHolder(l, "v")
	waitStarted(t, started, done)
	servers[1].Kill()
	servers[2].Kill()
	if _, err := l.TryObtain(bg, "v"); !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("TryObtain with two nodes down = %v, want ErrUnavailable", err)
	}
	var loss lossResult
	select {
	case loss = <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("fn's context was not cancelled within 5s of losing the quorum")
	}
	if !errors.Is(loss.cause, lock.ErrLost) || !strings.Contains(loss.cause.Error(), "validity") {
		t.Fatalf("fn's context cause = %v, want ErrLost (validity ran out)", loss.cause)
	}
	// The validity is at most one expiry after the last extension, which
	// came at most expiry/3 before the kill (+ a scheduling allowance).
	if loss.after > 2*expiry {
		t.Fatalf("fn heard of the loss %s after it started; validity is at most %s past an extension", loss.after, expiry)
	}
	servers[1].Restart()
	servers[2].Restart()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := l.Do(ctx, "v", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("second holder: %v", err)
	}
	close(release)
	if err := <-done; !errors.Is(err, lock.ErrLost) {
		t.Fatalf("first Do = %v, want ErrLost although fn returned nil", err)
	}
	t.Logf("loss heard %s after the start of fn", loss.after)
}

// TestQuorum: with one of three nodes dead, locks still work and still
// exclude; with two dead, Do fails quickly with ErrUnavailable (even with a
// context that never ends) and fn does not run; when they return, locks
// work again.
func TestQuorum(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{RetryDelay: 10 * time.Millisecond})
	servers[0].Kill()

	var (
		counter int
		sec     section
		wg      sync.WaitGroup
		failed  atomic.Int32
	)
	for range 8 {
		wg.Go(func() {
			for range 4 {
				err := l.Do(bg, "q", func(context.Context) error {
					sec.enter()
					defer sec.exit()
					v := counter
					runtime.Gosched()
					counter = v + 1
					return nil
				})
				if err != nil {
					t.Errorf("Do with one node down: %v", err)
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	sec.check(t)
	if counter != 32 {
		t.Fatalf("counter = %d, want 32", counter)
	}
	held, err := l.Obtain(bg, "q")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.TryDo(bg, "q", func(context.Context) error { return nil }); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryDo of a held lock with one node down = %v, want ErrNotObtained", err)
	}
	_ = held.Release(bg)

	servers[1].Kill()
	ran := false
	start := time.Now()
	err = l.Do(bg, "q", func(context.Context) error { ran = true; return nil })
	elapsed := time.Since(start)
	var rerr *redsync.RedisError
	if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrNotObtained) || !errors.As(err, &rerr) || ran {
		t.Fatalf("Do with two of three nodes down = %v (ran %v), want ErrUnavailable", err, ran)
	}
	// 3 attempts, each bounded by Expiry*TimeoutFactor, but a dead node
	// refuses the connection at once.
	if elapsed > 2*time.Second {
		t.Fatalf("Do with two nodes down took %s", elapsed)
	}
	t.Logf("Do with two of three nodes down failed after %s: %v", elapsed, err)
	if err := l.TryDo(bg, "q", func(context.Context) error { ran = true; return nil }); !errors.Is(err, lock.ErrUnavailable) || ran {
		t.Fatalf("TryDo with two nodes down = %v", err)
	}

	servers[0].Restart()
	servers[1].Restart()
	if err := l.Do(bg, "q", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do after the nodes came back = %v (ran %v)", err, ran)
	}
}

// TestUnavailableNodePaused: nodes that accept connections but do not
// answer (CLIENT PAUSE on servers of the test's own) cost an attempt at
// most Expiry*TimeoutFactor: Do gives up with ErrUnavailable long before
// the pause ends.
func TestUnavailableNodePaused(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Expiry: time.Second, TimeoutFactor: 0.1, UnavailableTries: 2, RetryDelay: 10 * time.Millisecond})
	for _, s := range servers[:2] {
		// The servers are killed when the test ends; no need to unpause.
		if err := s.Client().Do(bg, "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err := l.Do(bg, "p", func(context.Context) error { return nil })
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("Do with two paused nodes = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Do with two paused nodes took %s; 2 attempts of 100ms expected", d)
	}
}

func TestDoPanicReleases(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", r)
			}
		}()
		_ = l.Do(bg, "p", func(context.Context) error { panic("boom") })
	}()
	if err := l.TryDo(bg, "p", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("lock still held after fn panicked: %v", err)
	}
}

// TestDoErrors: fn's error comes back as is; a caller's cancellation is
// not reported as a lost lock.
func TestDoErrors(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	boom := errors.New("boom")
	if err := l.Do(bg, "e", func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	ctx, cancel := context.WithCancelCause(bg)
	hungUp := errors.New("client hung up")
	err := l.Do(ctx, "e", func(ctx context.Context) error {
		cancel(hungUp)
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if err != hungUp || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do after the caller cancelled = %v, want the caller's cause only", err)
	}
	// The lock was released although ctx was cancelled.
	if err := l.TryDo(bg, "e", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("lock not released after a cancelled Do: %v", err)
	}
	// A ctx that is already done: no attempt is made.
	if err := l.Do(ctx, "e", func(context.Context) error { return nil }); !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, hungUp) {
		t.Fatalf("Do with a done ctx = %v", err)
	}
}

func TestBadInput(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	nodes := []redis.UniversalClient{c}
	for _, tc := range []struct {
		name  string
		nodes []redis.UniversalClient
		opts  lock.Options
	}{
		{"no nodes", nil, lock.Options{}},
		{"nil node", []redis.UniversalClient{c, nil}, lock.Options{}},
		{"negative expiry", nodes, lock.Options{Expiry: -time.Second}},
		{"tiny expiry", nodes, lock.Options{Expiry: time.Millisecond}},
		{"negative tries", nodes, lock.Options{Tries: -1}},
		{"timeout factor too big", nodes, lock.Options{TimeoutFactor: 0.4}},
		{"drift + timeout too big", nodes, lock.Options{TimeoutFactor: 0.2, DriftFactor: 0.2}},
		{"NaN timeout factor", nodes, lock.Options{TimeoutFactor: math.NaN()}},
		{"NaN drift factor", nodes, lock.Options{DriftFactor: math.NaN()}},
	} {
		if l, err := lock.New(tc.nodes, tc.opts); err == nil || l != nil {
			t.Errorf("%s: New = %v, %v; want an error", tc.name, l, err)
		}
	}
	l, err := lock.New(nodes, lock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := l.Options()
	if o.Expiry != lock.DefaultExpiry || o.Prefix != lock.DefaultPrefix || o.TimeoutFactor != lock.DefaultTimeoutFactor ||
		o.DriftFactor != lock.DefaultDriftFactor || o.UnavailableTries != lock.DefaultUnavailableTries || l.Quorum() != 1 {
		t.Fatalf("defaults: %+v, quorum %d", o, l.Quorum())
	}
	for _, name := range []string{"", strings.Repeat("x", lock.MaxNameLen+1), "acct:fence"} {
		ran := false
		if err := l.TryDo(bg, name, func(context.Context) error { ran = true; return nil }); !errors.Is(err, lock.ErrInvalidName) || ran {
			t.Errorf("TryDo(%d-byte name) = %v (ran %v), want ErrInvalidName", len(name), err, ran)
		}
		if _, err := l.Obtain(bg, name); !errors.Is(err, lock.ErrInvalidName) {
			t.Errorf("Obtain(%d-byte name) = %v, want ErrInvalidName", len(name), err)
		}
	}
}

func testenvRedlock(tb testing.TB) []string { return testenv.List(tb, testenv.EnvRedlock) }

func benchPrefix(tb testing.TB) string { return testenv.Prefix(tb) }

// TestExtendAfterUntil pins what Lock.Extend's doc says of an Extend
// that comes after Until (the holder stalled): while the keys are still
// on the nodes it succeeds and gives a new validity; once they expired,
// it is ErrLost.
func TestExtendAfterUntil(t *testing.T) {
	// DriftFactor 0.25 puts Until a quarter of Expiry before the keys go.
	l := newLocker(t, redlockNodes(t), lock.Options{Expiry: 2 * time.Second, DriftFactor: 0.25, TimeoutFactor: 0.05})
	k, err := l.Obtain(bg, "late")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k.Release(bg) }()
	keysGo := k.Until().Add(500 * time.Millisecond)         // Until + Expiry*DriftFactor
	time.Sleep(time.Until(k.Until()) + 20*time.Millisecond) // a stall past the validity, short of the keys' expiry
	err = k.Extend(bg)
	// ErrUnavailable: the round (100ms) timed out on a loaded machine,
	// and said nothing of the keys; ask again while they are surely there.
	for errors.Is(err, lock.ErrUnavailable) && time.Until(keysGo) > 200*time.Millisecond {
		err = k.Extend(bg)
	}
	if err != nil {
		t.Fatalf("Extend after Until, keys still held: %v", err)
	}
	if !k.Until().After(time.Now()) {
		t.Fatalf("Until %s not renewed", k.Until())
	}
	time.Sleep(2*time.Second + 20*time.Millisecond) // past the keys' own expiry
	err = k.Extend(bg)
	for try := 0; errors.Is(err, lock.ErrUnavailable) && try < 5; try++ {
		err = k.Extend(bg) // the keys are gone for good: ask until the nodes answer
	}
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Extend after the keys expired = %v, want ErrLost", err)
	}
}

// TestReleaseEndedContext pins Lock.Release's documented limit: a ctx
// that has already ended reaches no node; the answer is ErrUnavailable
// (wrapping the ctx's error) and the lock stays taken until it expires
// or is released with a live ctx.
func TestReleaseEndedContext(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	k, err := l.Obtain(bg, "ended")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := k.Release(ctx); !errors.Is(err, lock.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with an ended ctx = %v, want ErrUnavailable wrapping context.Canceled", err)
	}
	if _, err := l.TryObtain(bg, "ended"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryObtain after a Release with an ended ctx = %v, want ErrNotObtained (still held)", err)
	}
	if err := k.Release(bg); err != nil {
		t.Fatalf("Release with a live ctx: %v", err)
	}
}

// TestNewRefusesRepeatedNode: a node given twice (the same client, or
// clients of one address, as a flag repeated on a command line) would
// count twice towards the quorum: with nodes a, a, b a lock held on a
// alone is "held on 2 of 3", and a's crash or restart frees it however
// many others there are. New refuses it.
func TestNewRefusesRepeatedNode(t *testing.T) {
	a := closing(t, lock.NewNodes("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:2"))
	if l, err := lock.New(a, lock.Options{}); err == nil {
		t.Fatalf("New with an address twice = %v, want an error (quorum %d of %d)", l, l.Quorum(), len(a))
	}
	if l, err := lock.New([]redis.UniversalClient{a[0], a[2], a[0]}, lock.Options{}); err == nil {
		t.Fatalf("New with a client twice = %v, want an error", l)
	}
	if _, err := lock.New([]redis.UniversalClient{a[0], a[2]}, lock.Options{}); err != nil {
		t.Fatalf("New with distinct nodes: %v", err)
	}
}

// TestNewRepeatedNodeKinds pins which clients New tells apart: a
// *redis.Client is its network and address as go-redis fills them in
// (NewUniversalClient with one address is a *redis.Client; an empty
// address is localhost:6379; another DB is the same server), a Unix
// socket its path; other clients (Ring, Cluster, Sentinel failover) are
// one node only when given as one client twice.
func TestNewRepeatedNodeKinds(t *testing.T) {
	closeAll := func(cs ...redis.UniversalClient) []redis.UniversalClient {
		for _, c := range cs {
			t.Cleanup(func() { _ = c.Close() })
		}
		return cs
	}
	ring := func() redis.UniversalClient {
		return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"s": "127.0.0.1:1"}})
	}
	cluster := func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	}
	r, cl := ring(), cluster()
	for _, c := range []struct {
		what  string
		nodes []redis.UniversalClient
		same  bool
	}{
		{"NewUniversalClient and NewClient of one address", closeAll(
			redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}}),
			redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})), true},
		{"one Unix socket", closeAll(
			redis.NewClient(&redis.Options{Addr: "/tmp/redis.sock"}),
			redis.NewClient(&redis.Options{Network: "unix", Addr: "/tmp/redis.sock"})), true},
		{"the default address", closeAll(
			redis.NewClient(&redis.Options{}),
			redis.NewClient(&redis.Options{Addr: "localhost:6379"})), true},
		{"two DBs of one server", closeAll(
			redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DB: 0}),
			redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DB: 1})), true},
		{"two Unix sockets", closeAll(
			redis.NewClient(&redis.Options{Addr: "/tmp/a.sock"}),
			redis.NewClient(&redis.Options{Addr: "/tmp/b.sock"})), false},
		{"one Ring twice", append(closeAll(r), r), true},
		{"one ClusterClient twice", append(closeAll(cl), cl), true},
		{"two Rings", closeAll(ring(), ring()), false},
		{"two ClusterClients", closeAll(cluster(), cluster()), false},
		{"a Client and a Ring of its address", closeAll(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), ring()), false},
	} {
		_, err := lock.New(c.nodes, lock.Options{})
		if (err != nil) != c.same {
			t.Errorf("%s: New = %v, want refused: %v", c.what, err, c.same)
		}
	}
}
