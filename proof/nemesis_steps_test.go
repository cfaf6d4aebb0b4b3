package proof

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// The nemesis runs' step keys: effects of two steps that fail, panic or
// lose their lease between them under the faults, so later attempts
// resume from what was stored. The porcupine model checks every store
// call on them (a step's result, once stored, never changes, and every
// acquiring claim reports the steps as stored); stepValues checks the
// same from the effects' side: every value Step returned for a key and
// step is the same, and the key's final result is built from them.

const stepFingerprint = "fp-steps"

func stepNemesisKeys(scope string) []guard.Key {
	keys := make([]guard.Key, 40)
	for i := range keys {
		keys[i] = guard.Key{Scope: scope + "-steps", ID: fmt.Sprintf("s%d", i)}
	}
	return keys
}

// stepValues is what Step returned, per key and step name.
type stepValues struct {
	mu      sync.Mutex
	seen    map[guard.Key]map[string]string
	returns int
}

func newStepValues() *stepValues { return &stepValues{seen: map[guard.Key]map[string]string{}} }

// saw records that Step returned v for key and name; a different value
// than before is an error.
func (s *stepValues) saw(t *testing.T, key guard.Key, name, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.returns++
	m := s.seen[key]
	if m == nil {
		m = map[string]string{}
		s.seen[key] = m
	}
	if old, ok := m[name]; ok && old != v {
		t.Errorf("%s step %s returned %q, earlier %q: a stored step changed", key, name, v, old)
	}
	m[name] = v
}

// want is the result key must have: its steps' values joined.
func (s *stepValues) want(key guard.Key) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok1 := s.seen[key]["a"]
	b, ok2 := s.seen[key]["b"]
	return a + "|" + b, ok1 && ok2
}

// stepEffect is the step keys' effect. mode < 30 makes it fail or panic
// between or after its steps.
func stepEffect(t *testing.T, vals *stepValues, st *stats, mode int, think time.Duration) guard.Func {
	return func(ctx context.Context, l guard.Lease) ([]byte, error) {
		if l.Recovered {
			st.recovered.Add(1)
		}
		stamp := func(name string) func(context.Context) (string, error) {
			return func(context.Context) (string, error) {
				return fmt.Sprintf("%s/%s/%d", name, short(l.Token), l.Fence), nil
			}
		}
		a, err := guard.Step(ctx, l, "a", stamp("a"))
		if err != nil {
			return nil, err
		}
		vals.saw(t, l.Key, "a", a)
		switch {
		case mode < 12:
			return nil, errTransient
		case mode < 18:
			panic(errTransient)
		}
		if !wait.For(ctx, think) {
			return nil, context.Cause(ctx)
		}
		b, err := guard.Step(ctx, l, "b", stamp("b"))
		if err != nil {
			return nil, err
		}
		vals.saw(t, l.Key, "b", b)
		if mode < 30 {
			return nil, errTransient
		}
		return []byte(a + "|" + b), nil
	}
}

// stepsOnce runs Do on a step key.
func stepsOnce(ctx context.Context, t *testing.T, g *guard.Guard, vals *stepValues, k guard.Key, r *rand.Rand, st *stats) {
	fn := stepEffect(t, vals, st, r.IntN(100), time.Duration(r.IntN(6))*time.Millisecond)
	defer func() {
		if p := recover(); p != nil {
			if p != errTransient {
				panic(p)
			}
			st.panics.Add(1)
		}
	}()
	res, err := g.Do(ctx, k, stepFingerprint, fn)
	countErr(st, err)
	switch {
	case err == nil:
		if want, ok := vals.want(k); !ok || string(res.Value) != want {
			t.Errorf("%s answered %q (replayed %t), its steps returned %q", k, res.Value, res.Replayed, want)
		}
	case errors.Is(err, errTransient):
		st.fnErrors.Add(1)
	case errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrUnavailable), errors.Is(err, guard.ErrLeaseLost):
	default:
		t.Errorf("Do %s with steps: unexpected error %v", k, err)
	}
}

// settleStepKeys runs every step key to completion without faults and
// checks that its result is made of the values its steps returned.
func settleStepKeys(t *testing.T, ctx context.Context, g *guard.Guard, rec *Recorder, keys []guard.Key, vals *stepValues, st *stats, limit time.Duration, fail func(string, ...any)) {
	var calls, unknown, lost, order int
	for _, op := range rec.History() {
		if op.Input.(Input).Op != OpStep {
			continue
		}
		calls++
		switch out := op.Output.(Output); {
		case out.Unknown:
			unknown++
		case out.Order:
			order++
		case !out.OK:
			lost++
		}
	}
	for _, k := range keys {
		res, err := settleSteps(ctx, g, k, stepEffect(t, vals, st, 100, 0), limit)
		if err != nil {
			fail("%s did not settle: %v", k, err)
			continue
		}
		want, ok := vals.want(k)
		if !ok || string(res.Value) != want {
			fail("%s settled to %q, its steps returned %q", k, res.Value, want)
		}
		rec, err := g.Get(ctx, k)
		if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != want || rec.Steps != nil {
			fail("%s: %+v, %v after settling; want completed with %q, no steps", k, rec, err, want)
		}
		if !strings.HasPrefix(want, "a/") {
			fail("%s: result %q", k, want)
		}
	}
	vals.mu.Lock()
	t.Logf("step keys: %d step writes under faults (%d unknown, %d lost, %d out of order), %d values returned by Step, all consistent",
		calls, unknown, lost, order, vals.returns)
	vals.mu.Unlock()
}

// settleSteps is settle for a step key: it waits out other holders' leases
// and retries what faults leave behind, but gives up at once on an error
// no retry can mend (steps out of order, a corrupt record).
func settleSteps(ctx context.Context, g *guard.Guard, key guard.Key, fn guard.Func, limit time.Duration) (guard.Result, error) {
	deadline := time.Now().Add(limit)
	for {
		res, err := g.Do(ctx, key, stepFingerprint, fn)
		if err == nil {
			return res, nil
		}
		if errors.Is(err, guard.ErrStepOrder) || errors.Is(err, guard.ErrCorrupt) || time.Now().After(deadline) {
			return res, err
		}
		wait := 5 * time.Millisecond
		var ip *guard.InProgressError
		if errors.As(err, &ip) {
			wait = ip.RetryAfter + time.Millisecond // waiting for another holder's lease to pass
		}
		time.Sleep(wait)
	}
}
