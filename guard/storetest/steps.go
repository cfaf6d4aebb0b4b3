package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// steps is the contract of guard.StepStore (recovery points), run on
// every store: a store that keeps no steps (guard.KeepsSteps: not a
// StepStore, or one whose KeepsSteps answers false) must make guard.Step
// fail with guard.ErrStepsUnsupported before the step runs.
func (c contract) steps(t *testing.T) {
	if !guard.KeepsSteps(c.h.New(t)) {
		t.Run("Unsupported", c.stepsUnsupported)
		return
	}
	c.run(t, []testCase{
		{"RecordedInOrder", c.stepsInOrder},
		{"BadInput", c.stepsBadInput},
		{"SameClaimAgain", c.stepsSameClaim},
		{"KeptThroughFailure", c.stepsThroughFailure},
		{"KeptThroughRecovery", c.stepsThroughRecovery},
		{"KeptThroughRecoveryShortTTL", c.stepsThroughRecoveryShortTTL},
		{"StaleHolderStoresNothing", c.stepsStaleHolder},
		{"CompletionDropsThem", c.stepsCompletion},
		{"ReleaseKeepsThem", c.stepsRelease},
		{"NothingRevealed", c.stepsNothingRevealed},
		{"ExhaustedKeepsThem", c.stepsExhausted},
		{"Retention", c.stepsRetention},
		{"LargeResult", c.stepsLarge},
		{"GuardResumes", c.stepsGuardResumes},
		{"GuardOrder", c.stepsGuardOrder},
	})
	t.Run("RaceManyKeys", c.stepsRace)
}

func stepStore(t *testing.T, c contract) guard.StepStore {
	return c.h.New(t).(guard.StepStore)
}

func step(name, result string) guard.StepResult {
	return guard.StepResult{Name: name, Result: []byte(result)}
}

func save(t *testing.T, s guard.StepStore, l guard.Lease, i int, st guard.StepResult) {
	t.Helper()
	if err := s.SaveStep(ctx, l, i, st); err != nil {
		t.Fatalf("SaveStep(%s, %d, %q) by %s: %v", l.Key, i, st.Name, l.Token, err)
	}
}

func sameSteps(a, b []guard.StepResult) bool {
	return slices.EqualFunc(a, b, func(x, y guard.StepResult) bool {
		return x.Name == y.Name && bytes.Equal(x.Result, y.Result)
	})
}

func wantSteps(t *testing.T, what string, got []guard.StepResult, want ...guard.StepResult) {
	t.Helper()
	if !sameSteps(got, want) {
		t.Fatalf("%s: steps %s, want %s", what, describeSteps(got), describeSteps(want))
	}
}

func describeSteps(steps []guard.StepResult) string {
	var b strings.Builder
	b.WriteString("[")
	for i, s := range steps {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%q", s.Name, short(string(s.Result)))
	}
	return b.String() + "]"
}

func mustOrder(t *testing.T, what string, err error, recorded string) {
	t.Helper()
	var oe *guard.StepOrderError
	if !errors.Is(err, guard.ErrStepOrder) || !errors.As(err, &oe) || oe.Recorded != recorded {
		t.Fatalf("%s = %v, want a *StepOrderError naming %q", what, err, recorded)
	}
}

// stepsUnsupported: a store without steps refuses Step before it runs.
func (c contract) stepsUnsupported(t *testing.T) {
	g := guard.New(c.h.New(t), guard.Options{Lease: 10 * time.Second})
	ran := 0
	_, err := g.Do(ctx, newKey(t), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		_, err := guard.Step(ctx, l, "charge", func(context.Context) ([]byte, error) {
			ran++
			return []byte("x"), nil
		})
		return nil, err
	})
	if !errors.Is(err, guard.ErrStepsUnsupported) || ran != 0 {
		t.Fatalf("Step on a store without steps: %v after %d runs, want ErrStepsUnsupported without running", err, ran)
	}
}

func (c contract) stepsInOrder(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	out := claim(t, s, c.req(key, "A"))
	if out.Status != guard.Acquired || out.Steps != nil {
		t.Fatalf("fresh claim = %+v, want acquired without steps", out)
	}
	l := out.Lease
	a, b := step("reserve", "r-1"), step("charge", "\x00ch_1\xff")
	save(t, s, l, 0, a)
	save(t, s, l, 0, a) // the same call again
	save(t, s, l, 1, b)
	rec := get(t, s, key)
	if rec.State != guard.StatePending || rec.Token != "A" {
		t.Fatalf("record = %+v", rec)
	}
	wantSteps(t, "Get", rec.Steps, a, b)
	mustOrder(t, "another step at index 1", s.SaveStep(ctx, l, 1, step("refund", "x")), "charge")
	mustOrder(t, "the same name with another result at index 1", s.SaveStep(ctx, l, 1, step("charge", "ch_2")), "charge")
	mustOrder(t, "a step after a gap", s.SaveStep(ctx, l, 3, step("ship", "x")), "")
	save(t, s, l, 2, step("order", ""))
	wantSteps(t, "Get after a third, empty step", get(t, s, key).Steps, a, b, step("order", ""))
}

func (c contract) stepsBadInput(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	l := acquire(t, s, c.req(key, "A"))
	for name, call := range map[string]func() error{
		"negative index":    func() error { return s.SaveStep(ctx, l, -1, step("a", "x")) },
		"index too large":   func() error { return s.SaveStep(ctx, l, guard.MaxSteps, step("a", "x")) },
		"empty name":        func() error { return s.SaveStep(ctx, l, 0, step("", "x")) },
		"name too long":     func() error { return s.SaveStep(ctx, l, 0, step(strings.Repeat("n", guard.MaxStepNameLen+1), "x")) },
		"control character": func() error { return s.SaveStep(ctx, l, 0, step("a\nb", "x")) },
	} {
		if err := call(); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
	if rec := get(t, s, key); rec.Steps != nil {
		t.Fatalf("bad steps were stored: %s", describeSteps(rec.Steps))
	}
	long := step(strings.Repeat("n", guard.MaxStepNameLen), "x")
	save(t, s, l, 0, long)
	save(t, s, l, 1, step("ключ", "y"))
	wantSteps(t, "Get", get(t, s, key).Steps, long, step("ключ", "y"))
}

func (c contract) stepsSameClaim(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	first := claim(t, s, c.req(key, "A"))
	save(t, s, first.Lease, 0, step("a", "1"))
	again := claim(t, s, c.req(key, "A"))
	// The same lease, but for what a store may cache of the record in it
	// (the Redis store keeps the pending record its claim left).
	a, f := again.Lease, first.Lease
	if again.Status != guard.Acquired || a.Key != f.Key || a.Token != f.Token || a.Fence != f.Fence ||
		a.Attempt != f.Attempt || a.Recovered != f.Recovered {
		t.Fatalf("repeated claim = %+v, want the first lease %+v", again, first.Lease)
	}
	wantSteps(t, "repeated claim", again.Steps, step("a", "1"))
}

func (c contract) stepsThroughFailure(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "1"))
	save(t, s, a, 1, step("b", "2"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
	rec := get(t, s, key)
	if rec.State != guard.StateFailed {
		t.Fatalf("record = %+v", rec)
	}
	wantSteps(t, "failed record", rec.Steps, step("a", "1"), step("b", "2"))
	out := claim(t, s, c.req(key, "B"))
	if out.Status != guard.Acquired || out.Lease.Attempt != 2 {
		t.Fatalf("retry = %+v", out)
	}
	wantSteps(t, "retry's claim", out.Steps, step("a", "1"), step("b", "2"))
	mustLost(t, "the failed holder's next step", s.SaveStep(ctx, a, 2, step("c", "A")))
	mustLost(t, "the failed holder's step sent again", s.SaveStep(ctx, a, 1, step("b", "2")))
	save(t, s, out.Lease, 2, step("c", "B"))
	mustOK(t, "fail again", s.Fail(ctx, out.Lease, "boom", time.Hour))
	wantSteps(t, "third claim", claim(t, s, c.req(key, "C")).Steps, step("a", "1"), step("b", "2"), step("c", "B"))
}

func (c contract) stepsThroughRecovery(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "1"))
	c.h.Advance(t, c.h.Lease) // A dies
	out := claim(t, s, c.req(key, "B"))
	if out.Status != guard.Acquired || !out.Lease.Recovered {
		t.Fatalf("recovery = %+v", out)
	}
	wantSteps(t, "recovering claim", out.Steps, step("a", "1"))
	save(t, s, out.Lease, 1, step("b", "B"))
	wantSteps(t, "Get", get(t, s, key).Steps, step("a", "1"), step("b", "B"))
}

// stepsThroughRecoveryShortTTL: with a retention shorter than the lease,
// a holder that died after a step leaves it to the claim that recovers
// its key: the step's effect (a charge) is not made again.
func (c contract) stepsThroughRecoveryShortTTL(t *testing.T) {
	// The recovering claim must reach the store before the record's
	// retention (0.9 × lease) after the lease ends: onTime runs again with
	// a longer lease when a loaded machine missed that.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := stepStore(t, c), newKey(t)
		r := c.req(key, "A")
		r.Lease, r.TTL = lease, lease*9/10
		began := time.Now()
		a := acquire(t, s, r)
		save(t, s, a, 0, step("charge", "ch_1"))
		c.h.Advance(t, lease) // A dies
		r.Token = "B"
		out := claim(t, s, r)
		if out.Status != guard.Acquired || !out.Lease.Recovered || out.Lease.Attempt != 2 {
			if late(began, lease+r.TTL) {
				return true
			}
			t.Fatalf("recovery = %+v, want acquired, recovered, attempt 2", out)
		}
		wantSteps(t, "recovering claim", out.Steps, step("charge", "ch_1"))
		return false
	})
}

// stepsStaleHolder: a holder whose lease another took over stores
// nothing and is told so, whatever step it sends: its own earlier step
// sent again, and a step byte for byte the one the new holder recorded
// (a gate step holding a value any holder would store: answered OK, the
// stale holder would go on to the effect the step gates).
func (c contract) stepsStaleHolder(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "A"))
	c.h.Advance(t, c.h.Lease)
	b := acquire(t, s, c.req(key, "B"))
	for i, st := range []guard.StepResult{step("b", "A"), step("a", "other")} {
		mustLost(t, fmt.Sprintf("stale holder's step %d", i+1), s.SaveStep(ctx, a, i+1, st))
	}
	mustLost(t, "stale holder's other step at 0", s.SaveStep(ctx, a, 0, step("a", "A2")))
	mustLost(t, "stale holder's own step sent again", s.SaveStep(ctx, a, 0, step("a", "A")))
	wantSteps(t, "after the stale holder's writes", get(t, s, key).Steps, step("a", "A"))
	save(t, s, b, 1, step("b", "B"))
	mustLost(t, "stale holder's step byte for byte the new holder's", s.SaveStep(ctx, a, 1, step("b", "B")))
	mustLost(t, "stale holder's step after the new one's", s.SaveStep(ctx, a, 2, step("c", "A")))
	wantSteps(t, "Get", get(t, s, key).Steps, step("a", "A"), step("b", "B"))
}

func (c contract) stepsCompletion(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", strings.Repeat("s", 200)))
	mustOK(t, "complete", s.Complete(ctx, a, []byte("done"), time.Hour))
	rec := get(t, s, key)
	if rec.State != guard.StateCompleted || rec.Steps != nil {
		t.Fatalf("completed record = %+v, want completed without steps", rec)
	}
	mustLost(t, "a step after completion", s.SaveStep(ctx, a, 1, step("b", "x")))
	out := claim(t, s, c.req(key, "B"))
	if out.Status != guard.Replay || string(out.Result) != "done" || out.Steps != nil {
		t.Fatalf("claim after completion = %+v, want a replay without steps", out)
	}
	mustOK(t, "complete again", s.Complete(ctx, a, []byte("done"), time.Hour))
}

// stepsRelease: a claim whose steps happened cannot be undone: Release
// leaves the record failed with its steps, and the next claim resumes.
func (c contract) stepsRelease(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "1"))
	mustOK(t, "release", s.Release(ctx, a))
	mustOK(t, "release again", s.Release(ctx, a))
	rec := get(t, s, key)
	if rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Fatalf("released first attempt with a step = %+v, want failed at attempt 1", rec)
	}
	wantSteps(t, "released first attempt", rec.Steps, step("a", "1"))
	b := claim(t, s, c.req(key, "B"))
	if b.Status != guard.Acquired || b.Lease.Attempt != 2 {
		t.Fatalf("claim after the release = %+v, want attempt 2", b)
	}
	wantSteps(t, "claim after the release", b.Steps, step("a", "1"))
	save(t, s, b.Lease, 1, step("b", "2"))
	mustOK(t, "release of a later attempt", s.Release(ctx, b.Lease))
	rec = get(t, s, key)
	if rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Fatalf("released attempt 2 = %+v, want failed, the attempt uncounted", rec)
	}
	wantSteps(t, "released attempt 2", rec.Steps, step("a", "1"), step("b", "2"))
	// Without steps, Release still frees the key.
	k2 := newKey(t)
	l := acquire(t, s, c.req(k2, "A"))
	mustOK(t, "release without steps", s.Release(ctx, l))
	if _, err := s.Get(ctx, k2); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("released first attempt without steps: %v, want ErrNotFound", err)
	}
}

// stepsNothingRevealed: answers other than acquired carry no steps.
func (c contract) stepsNothingRevealed(t *testing.T) {
	// The claims "while held" must reach the store before A's lease ends:
	// onTime runs again with a longer lease when one did not.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := stepStore(t, c), newKey(t)
		r := c.req(key, "A")
		r.Lease = lease
		began := time.Now()
		a := acquire(t, s, r)
		save(t, s, a, 0, step("a", "secret"))
		same, other := r, r
		same.Token, other.Token, other.Fingerprint = "B", "B", "other"
		for _, r := range []guard.ClaimRequest{same, other} {
			if out := claim(t, s, r); out.Steps != nil || out.Status == guard.Acquired {
				if out.Status == guard.Acquired && late(began, lease) {
					return true
				}
				t.Fatalf("claim by %s (fingerprint %q) while held = %+v, want no steps", r.Token, r.Fingerprint, out)
			}
		}
		mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
		if out := claim(t, s, other); out.Status != guard.Mismatch || out.Steps != nil {
			t.Fatalf("claim with another fingerprint = %+v, want a mismatch without steps", out)
		}
		return false
	})
}

func (c contract) stepsExhausted(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	r := c.req(key, "A")
	r.MaxAttempts = 1
	a := acquire(t, s, r)
	save(t, s, a, 0, step("a", "1"))
	c.h.Advance(t, c.h.Lease)
	r.Token = "B"
	if out := claim(t, s, r); out.Status != guard.Exhausted || out.Steps != nil {
		t.Fatalf("claim after the only attempt died = %+v, want exhausted", out)
	}
	wantSteps(t, "exhausted record", get(t, s, key).Steps, step("a", "1"))
}

func (c contract) stepsRetention(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "1"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", c.h.TTL))
	c.h.Advance(t, c.h.TTL)
	out := claim(t, s, c.req(key, "B"))
	if out.Status != guard.Acquired || out.Lease.Attempt != 1 || out.Steps != nil {
		t.Fatalf("claim after retention = %+v, want a first attempt without steps", out)
	}
}

func (c contract) stepsLarge(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 13)
	}
	save(t, s, a, 0, guard.StepResult{Name: "big", Result: big})
	save(t, s, a, 1, step("small", "x"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
	wantSteps(t, "claim after a 1 MiB step", claim(t, s, c.req(key, "B")).Steps, guard.StepResult{Name: "big", Result: big}, step("small", "x"))
}

// stepsGuardResumes: through Guard.Do, a step that succeeded runs once
// however often its key is attempted; a failed attempt resumes.
func (c contract) stepsGuardResumes(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	var runs [3]int
	type charge struct{ ID string }
	attempt := 0
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		attempt++
		r, err := guard.Step(ctx, l, "reserve", func(context.Context) ([]byte, error) {
			runs[0]++
			return []byte(fmt.Sprintf("r%d", attempt)), nil
		})
		if err != nil {
			return nil, err
		}
		ch, err := guard.Step(ctx, l, "charge", func(context.Context) (charge, error) {
			runs[1]++
			if attempt == 1 {
				return charge{}, errors.New("card network down")
			}
			return charge{ID: fmt.Sprintf("ch%d", attempt)}, nil
		})
		if err != nil {
			return nil, err
		}
		o, err := guard.Step(ctx, l, "order", func(context.Context) (string, error) {
			runs[2]++
			if attempt == 2 {
				panic("crash after the charge")
			}
			return fmt.Sprintf("o%d", attempt), nil
		})
		if err != nil {
			return nil, err
		}
		return []byte(fmt.Sprintf("%s/%s/%s", r, ch.ID, o)), nil
	}
	if _, err := g.Do(ctx, key, "fp", fn); err == nil || !strings.Contains(err.Error(), "card network down") {
		t.Fatalf("first attempt: %v, want the charge's error", err)
	}
	func() {
		defer func() {
			if p := recover(); p != "crash after the charge" {
				t.Fatalf("second attempt: recovered %v, want its panic", p)
			}
		}()
		_, _ = g.Do(ctx, key, "fp", fn)
	}()
	res, err := g.Do(ctx, key, "fp", fn)
	if err != nil || string(res.Value) != "r1/ch2/o3" {
		t.Fatalf("third attempt = %q, %v; want r1/ch2/o3 (each step's result from the attempt that stored it)", res.Value, err)
	}
	if runs != [3]int{1, 2, 2} {
		t.Fatalf("step runs = %v, want [1 2 2]: a stored step never runs again", runs)
	}
	res, err = g.Do(ctx, key, "fp", fn)
	if err != nil || !res.Replayed || string(res.Value) != "r1/ch2/o3" || attempt != 3 {
		t.Fatalf("after completion = %+v, %v (attempts %d), want a replay", res, err, attempt)
	}
}

// stepsGuardOrder: an attempt that asks for its steps in another order
// than recorded, twice, or nested, gets ErrStepOrder without running the
// step.
func (c contract) stepsGuardOrder(t *testing.T) {
	s, key := stepStore(t, c), newKey(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	ran := map[string]int{}
	run := func(name string) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { ran[name]++; return []byte(name), nil }
	}
	boom := errors.New("boom")
	_, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		for _, n := range []string{"a", "b"} {
			if _, err := guard.Step(ctx, l, n, run(n)); err != nil {
				return nil, err
			}
		}
		if _, err := guard.Step(ctx, l, "a", run("a")); !errors.Is(err, guard.ErrStepOrder) {
			t.Errorf("a name asked twice: %v, want ErrStepOrder", err)
		}
		_, err := guard.Step(ctx, l, "outer", func(ctx context.Context) ([]byte, error) {
			_, err := guard.Step(ctx, l, "inner", run("inner"))
			return nil, err
		})
		if !errors.Is(err, guard.ErrStepOrder) {
			t.Errorf("a nested step: %v, want ErrStepOrder", err)
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("first attempt: %v", err)
	}
	_, err = g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		_, err := guard.Step(ctx, l, "b", run("b"))
		return nil, err
	})
	mustOrder(t, "asking b first", err, "a")
	if ran["a"] != 1 || ran["b"] != 1 || ran["inner"] != 0 {
		t.Fatalf("step runs = %v, want a and b once, inner never", ran)
	}
	// Asking fewer steps than recorded is allowed: the effect took another path.
	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return guard.Step(ctx, l, "a", run("a"))
	})
	if err != nil || string(res.Value) != "a" || ran["a"] != 1 {
		t.Fatalf("resuming with a only = %q, %v (a ran %d times)", res.Value, err, ran["a"])
	}
}

// stepsRace: Keys/5 keys (200 by default), Duplicates concurrent Do calls
// each, three steps per effect that fail now and then: every step runs
// once per key, and every key's result is built from those runs.
func (c contract) stepsRace(t *testing.T) {
	s := stepStore(t, c)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	keys, dups := max(c.h.Keys/5, 20), c.h.Duplicates
	prefix := rand.Text()[:8]
	runs := make([][3]atomic.Int64, keys)
	names := [3]string{"reserve", "charge", "order"}
	var wg sync.WaitGroup
	jobs := make(chan int)
	results := make([]atomic.Value, keys)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				key := guard.Key{Scope: "steps-race", ID: fmt.Sprintf("%s-%d", prefix, i)}
				res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
					var parts []string
					for j, n := range names {
						v, err := guard.Step(ctx, l, n, func(context.Context) (string, error) {
							k := runs[i][j].Add(1)
							if (i+j)%3 == 0 && l.Attempt == 1 {
								return "", errors.New("transient")
							}
							return fmt.Sprintf("%s#%d", n, k), nil
						})
						if err != nil {
							return nil, err
						}
						parts = append(parts, v)
					}
					return []byte(strings.Join(parts, "/")), nil
				})
				if err == nil {
					results[i].Store(string(res.Value))
				}
			}
		}()
	}
	for i := range keys {
		for range dups {
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	for i := range keys {
		key := guard.Key{Scope: "steps-race", ID: fmt.Sprintf("%s-%d", prefix, i)}
		res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			var parts []string
			for j, n := range names {
				v, err := guard.Step(ctx, l, n, func(context.Context) (string, error) {
					k := runs[i][j].Add(1)
					return fmt.Sprintf("%s#%d", n, k), nil
				})
				if err != nil {
					return nil, err
				}
				parts = append(parts, v)
			}
			return []byte(strings.Join(parts, "/")), nil
		})
		if err != nil {
			t.Fatalf("%s after the race: %v", key, err)
		}
		want := make([]string, 3)
		for j, n := range names {
			n0 := runs[i][j].Load()
			failed := int64(0)
			if (i+j)%3 == 0 {
				failed = 1 // the first attempt's run that returned an error
			}
			if n0 != 1+failed {
				t.Fatalf("%s step %s ran %d times, want %d", key, n, n0, 1+failed)
			}
			want[j] = fmt.Sprintf("%s#%d", n, n0)
		}
		if string(res.Value) != strings.Join(want, "/") {
			t.Fatalf("%s = %q, want %q", key, res.Value, strings.Join(want, "/"))
		}
		if v, ok := results[i].Load().(string); ok && v != string(res.Value) {
			t.Fatalf("%s answered %q during the race, %q after", key, v, res.Value)
		}
	}
}

// StepRunsWhereKept checks a store's steps from the guard's side, for a
// wrapper that forwards guard.KeepsSteps: guard.KeepsSteps(s) is keeps,
// and three attempts at key, each running one step and then failing, run
// the step once when s keeps steps, and never otherwise (each attempt
// then ends in guard.ErrStepsUnsupported before the step runs).
func StepRunsWhereKept(t *testing.T, s guard.Store, key guard.Key, keeps bool) {
	t.Helper()
	if got := guard.KeepsSteps(s); got != keeps {
		t.Errorf("KeepsSteps = %v, want %v", got, keeps)
	}
	g := guard.New(s, guard.Options{MaxAttempts: 10})
	ran := 0
	for attempt := range 3 {
		_, err := g.Do(context.Background(), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			if _, err := guard.Step(ctx, l, "charge", func(context.Context) ([]byte, error) { ran++; return []byte("ch_1"), nil }); err != nil {
				return nil, err
			}
			return nil, errors.New("crash after the step")
		})
		if !keeps && !errors.Is(err, guard.ErrStepsUnsupported) {
			t.Fatalf("attempt %d: %v, want ErrStepsUnsupported", attempt, err)
		}
	}
	want := 0
	if keeps {
		want = 1
	}
	if ran != want {
		t.Fatalf("the step ran %d times in 3 attempts, want %d", ran, want)
	}
}
