package guard_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/memstore"
)

// downstream is a service that takes its own idempotency key, as Stripe
// does: a request with a key it has seen gets the first answer again and
// makes no new charge. It counts requests and charges by key.
type downstream struct {
	mu       sync.Mutex
	answers  map[string]string
	requests map[string]int
	charges  int
}

func newDownstream() *downstream {
	return &downstream{answers: map[string]string{}, requests: map[string]int{}}
}

func (d *downstream) charge(key, what string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests[key]++
	if a, ok := d.answers[key]; ok {
		return a
	}
	d.charges++
	a := fmt.Sprintf("ch_%d(%s)", d.charges, what)
	d.answers[key] = a
	return a
}

// TestStepLeaseLost: holder A is paused inside its charge step (it made
// the charge, the result is not stored yet) past its lease; B recovers
// the key, finds A's first step, runs the charge step once with the same
// downstream key and completes. A's step then stores nothing and fails
// with ErrLeaseLost, and its next step does not run. One charge in all.
// On miniredis (time moved by the test) and on Redis (a real lease).
func TestStepLeaseLost(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		s, mr := miniStore(t)
		if stepLeaseLost(t, s, 10*time.Second, func(d time.Duration) { mr.FastForward(d) }) {
			t.Fatal("late on miniredis, whose time the test moves")
		}
	})
	t.Run("redis", func(t *testing.T) {
		// A's claim, and B's claim and heartbeats, must be answered within
		// a lease: a round a loaded machine held back past it proves
		// nothing and runs again with a lease twice as long.
		s := realStore(t)
		testenv.OnTime(t, "a lease", 500*time.Millisecond, 4, func(lease time.Duration) bool {
			return stepLeaseLost(t, s, lease, func(d time.Duration) {
				time.Sleep(d + 50*time.Millisecond) // waiting for the server's lease to run out
			})
		})
	})
}

// stepLeaseLost runs the case with lease; late reports that a claim or
// B's run failed after a lease's first deadline, which proves nothing.
func stepLeaseLost(t *testing.T, s guard.Store, lease time.Duration, advance func(time.Duration)) (late bool) {
	g := guard.New(s, guard.Options{Lease: lease})
	key := guard.Key{Scope: "shop/POST /checkout", ID: "cart-lease-lost/" + lease.String()}
	validity := lease - guard.LeaseMargin(lease)
	pay := newDownstream()
	var runs sync.Map // "holder/step" → *atomic.Int64
	ran := func(holder, step string) int64 {
		n, _ := runs.LoadOrStore(holder+"/"+step, new(atomic.Int64))
		return n.(*atomic.Int64).Add(1)
	}
	get := func(holder, step string) int64 {
		n, _ := runs.LoadOrStore(holder+"/"+step, new(atomic.Int64))
		return n.(*atomic.Int64).Load()
	}
	checkout := func(holder string, pause func()) guard.Func {
		return func(ctx context.Context, l guard.Lease) ([]byte, error) {
			r, err := guard.Step(ctx, l, "reserve", func(context.Context) (string, error) {
				ran(holder, "reserve")
				return "reserved by " + holder, nil
			})
			if err != nil {
				return nil, err
			}
			ch, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) {
				ran(holder, "charge")
				c := pay.charge(l.KeyFor("charge"), holder)
				pause()
				return c, nil
			})
			if err != nil {
				return nil, err
			}
			o, err := guard.Step(ctx, l, "order", func(context.Context) (string, error) {
				ran(holder, "order")
				return "order by " + holder, nil
			})
			if err != nil {
				return nil, err
			}
			return []byte(r + "; " + ch + "; " + o), nil
		}
	}

	// A claims without a heartbeat, as a process that stops being
	// scheduled would hold it, and runs its effect.
	began := time.Now()
	out, err := g.Claim(bg, key, "fp")
	if errors.Is(err, guard.ErrUnavailable) && time.Since(began) >= validity {
		return true
	}
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	var bResult guard.Result
	var bErr error
	_, aErr := checkout("A", func() {
		// A made the charge and is paused before its result is stored:
		// its lease runs out and B takes the key over.
		advance(lease)
		bBegan := time.Now()
		bResult, bErr = g.Do(bg, key, "fp", checkout("B", func() {}))
		late = bErr != nil && time.Since(bBegan) >= validity
	})(bg, out.Lease)

	if late {
		return true
	}
	if bErr != nil || bResult.Replayed || !bResult.Lease.Recovered {
		t.Fatalf("B = %+v, %v; want a recovered run", bResult, bErr)
	}
	if want := "reserved by A; ch_1(A); order by B"; string(bResult.Value) != want {
		t.Fatalf("B's result %q, want %q: A's stored step, the downstream's first answer to the charge's key, B's order", bResult.Value, want)
	}
	if !errors.Is(aErr, guard.ErrLeaseLost) {
		t.Fatalf("A's charge step = %v, want ErrLeaseLost", aErr)
	}
	for _, c := range []struct {
		holder, step string
		want         int64
	}{{"A", "reserve", 1}, {"A", "charge", 1}, {"A", "order", 0}, {"B", "reserve", 0}, {"B", "charge", 1}, {"B", "order", 1}} {
		if n := get(c.holder, c.step); n != c.want {
			t.Errorf("%s ran %s %d times, want %d", c.holder, c.step, n, c.want)
		}
	}
	if pay.charges != 1 || len(pay.requests) != 1 || pay.requests[out.Lease.KeyFor("charge")] != 2 {
		t.Fatalf("downstream: %d charges, requests by key %v; want 1 charge, 2 requests with one key", pay.charges, pay.requests)
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != string(bResult.Value) || rec.Steps != nil {
		t.Fatalf("record = %+v, %v; want completed with B's result and no steps", rec, err)
	}
	// A goes on as a paused process would: it stores nothing, and its
	// later steps do not run.
	if err := g.Complete(bg, out.Lease, []byte("A's result")); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("A's complete = %v, want ErrLeaseLost", err)
	}
	_, err = guard.Step(bg, out.Lease, "order", func(context.Context) (string, error) {
		ran("A", "order")
		return "", nil
	})
	if err == nil || get("A", "order") != 0 {
		t.Fatalf("A's step after its lease was lost: %v (order ran %d times), want an error without running", err, get("A", "order"))
	}
	return false
}

// failingSteps is a memstore whose SaveStep answers err.
type failingSteps struct {
	*memstore.Store
	err error
}

func (f failingSteps) SaveStep(context.Context, guard.Lease, int, guard.StepResult) error {
	return f.err
}

// TestStepStopsAfterUnknownOutcome: when a step's result may or may not
// have been stored, or its lease was lost, no further step of the attempt
// runs; the effect returns the error and the next attempt resumes from
// what its claim reports.
func TestStepStopsAfterUnknownOutcome(t *testing.T) {
	for _, cause := range []error{guard.ErrUnavailable, guard.ErrLeaseLost} {
		t.Run(cause.Error(), func(t *testing.T) {
			g := guard.New(failingSteps{memstore.New(memstore.Options{}), fmt.Errorf("%w: test", cause)}, guard.Options{})
			var first, second, retried int
			_, err := g.Do(bg, guard.Key{Scope: "s", ID: "unknown"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				_, err := guard.Step(ctx, l, "a", func(context.Context) ([]byte, error) { first++; return nil, nil })
				if !errors.Is(err, cause) {
					t.Errorf("step a = %v, want %v", err, cause)
				}
				_, err2 := guard.Step(ctx, l, "a", func(context.Context) ([]byte, error) { retried++; return nil, nil })
				_, err3 := guard.Step(ctx, l, "b", func(context.Context) ([]byte, error) { second++; return nil, nil })
				if !errors.Is(err2, cause) || !errors.Is(err3, cause) {
					t.Errorf("steps after it = %v, %v; want %v", err2, err3, cause)
				}
				return nil, err
			})
			if !errors.Is(err, cause) || first != 1 || retried != 0 || second != 0 {
				t.Fatalf("Do = %v; steps ran %d, %d, %d times; want %v and 1, 0, 0", err, first, retried, second, cause)
			}
		})
	}
}

// TestStepInputs: names, limits, leases and contexts Step refuses, and
// how it stores values.
func TestStepInputs(t *testing.T) {
	s := memstore.New(memstore.Options{})
	g := guard.New(s, guard.Options{})
	var n int
	inc := func(context.Context) ([]byte, error) { n++; return []byte("x"), nil }
	key := func(id string) guard.Key { return guard.Key{Scope: "inputs", ID: id} }

	// A hand-built lease has no step log.
	if _, err := guard.Step(bg, guard.Lease{Key: key("x"), Token: "A"}, "a", inc); err == nil || n != 0 {
		t.Fatalf("Step on a hand-built lease: %v after %d runs", err, n)
	}
	_, err := g.Do(bg, key("names"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		for _, bad := range []string{"", strings.Repeat("n", guard.MaxStepNameLen+1), "a\x00b", "\xff"} {
			if _, err := guard.Step(ctx, l, bad, inc); !errors.Is(err, guard.ErrInvalidKey) {
				t.Errorf("step name %q: %v, want ErrInvalidKey", bad, err)
			}
		}
		for i := range guard.MaxSteps {
			if _, err := guard.Step(ctx, l, fmt.Sprint("s", i), inc); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		if _, err := guard.Step(ctx, l, "one too many", inc); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("step %d: %v, want ErrInvalidKey", guard.MaxSteps+1, err)
		}
		return nil, nil
	})
	if err != nil || n != guard.MaxSteps {
		t.Fatalf("Do = %v, %d steps ran; want %d", err, n, guard.MaxSteps)
	}

	// A done context runs nothing.
	cctx, cancel := context.WithCancelCause(bg)
	_, err = g.Do(cctx, key("cancelled"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		cancel(fmt.Errorf("%w: test", guard.ErrLeaseLost))
		_, err := guard.Step(ctx, l, "a", inc)
		return nil, err
	})
	if !errors.Is(err, guard.ErrLeaseLost) || n != guard.MaxSteps {
		t.Fatalf("a step on a done context: %v, ran %d more", err, n-guard.MaxSteps)
	}

	// Values go through JSON, the first time too; an encoding error
	// stores nothing, and the step may run again.
	type charge struct {
		ID     string
		secret string // not encoded: the first run must not see it either
	}
	calls := 0
	res, err := g.Do(bg, key("json"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		_, err := guard.Step(ctx, l, "bad", func(context.Context) (chan int, error) { calls++; return make(chan int), nil })
		if err == nil {
			t.Error("a step whose result cannot be encoded succeeded")
		}
		if _, err := guard.Step(ctx, l, "bad", func(context.Context) (string, error) { calls++; return "ok", nil }); err != nil {
			t.Errorf("the step again after the encoding error: %v", err)
		}
		c, err := guard.Step(ctx, l, "charge", func(context.Context) (charge, error) {
			return charge{ID: "ch_1", secret: "s"}, nil
		})
		if err != nil || c != (charge{ID: "ch_1"}) {
			t.Errorf("first run of a struct step = %+v, %v; want what a resumed run sees", c, err)
		}
		b, err := guard.Step(ctx, l, "raw", func(context.Context) ([]byte, error) { return nil, nil })
		if err != nil || b == nil || len(b) != 0 {
			t.Errorf("a nil []byte result = %#v, %v; want empty, not nil", b, err)
		}
		return nil, errors.New("crash")
	})
	if err == nil || calls != 2 {
		t.Fatalf("json attempt: %+v, %v, calls %d", res, err, calls)
	}
	rec, err := s.Get(bg, key("json"))
	if err != nil || len(rec.Steps) != 3 || string(rec.Steps[1].Result) != `{"ID":"ch_1"}` || string(rec.Steps[0].Result) != `"ok"` {
		t.Fatalf("stored steps %+v, %v", rec.Steps, err)
	}
	res, err = g.Do(bg, key("json"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		if _, err := guard.Step(ctx, l, "bad", func(context.Context) (string, error) { calls++; return "", nil }); err != nil {
			return nil, err
		}
		c, err := guard.Step(ctx, l, "charge", func(context.Context) (charge, error) { calls++; return charge{}, nil })
		return []byte(c.ID), err
	})
	if err != nil || string(res.Value) != "ch_1" || calls != 2 {
		t.Fatalf("resumed = %q, %v (calls %d)", res.Value, err, calls)
	}
	// A stored result that does not decode into the type asked is corrupt.
	_, err = g.Do(bg, key("types"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		if _, err := guard.Step(ctx, l, "n", func(context.Context) (string, error) { return "text", nil }); err != nil {
			return nil, err
		}
		return nil, errors.New("again")
	})
	if err == nil {
		t.Fatal("want the first attempt to fail")
	}
	_, err = g.Do(bg, key("types"), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		_, err := guard.Step(ctx, l, "n", func(context.Context) (int, error) { return 0, nil })
		return nil, err
	})
	if !errors.Is(err, guard.ErrCorrupt) {
		t.Fatalf("a stored string read as an int: %v, want ErrCorrupt", err)
	}
}

// TestStepClaimAndKeepAlive: steps work after Guard.Claim too, each
// Claim with a log of its own.
func TestStepClaimAndKeepAlive(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	key := guard.Key{Scope: "manual", ID: "1"}
	out, err := g.Claim(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := g.KeepAlive(bg, out.Lease)
	v, err := guard.Step(ctx, out.Lease, "a", func(context.Context) (int, error) { return 7, nil })
	stop()
	if err != nil || v != 7 {
		t.Fatal(v, err)
	}
	if err := g.Fail(bg, out.Lease, errors.New("later")); err != nil {
		t.Fatal(err)
	}
	out, err = g.Claim(bg, key, "fp")
	if err != nil || len(out.Steps) != 1 {
		t.Fatal(out, err)
	}
	v, err = guard.Step(bg, out.Lease, "a", func(context.Context) (int, error) { return 8, nil })
	if err != nil || v != 7 {
		t.Fatalf("resumed after Claim = %d, %v; want the stored 7", v, err)
	}
}

var uuidV8 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestDownstreamKey: a UUIDv8 that is a function of scope, ID and name
// alone, differs when any of them does (boundaries included), and fits
// every provider's limit.
func TestDownstreamKey(t *testing.T) {
	k := guard.Key{Scope: "tenant-42/POST /checkout", ID: "0b9e3c1e-5a7d-4b8e-9f51-2c1d5f6a7b80"}
	got := guard.DownstreamKey(k, "charge")
	// A fixed vector: a change of derivation would make every retry
	// after an upgrade a new request downstream.
	if want := "06a457d7-49f2-880c-9e73-410767903fde"; got != want {
		t.Errorf("DownstreamKey = %s, want %s", got, want)
	}
	if !uuidV8.MatchString(got) || len(got) != 36 {
		t.Fatalf("%q is not a lower-case UUIDv8", got)
	}
	if l := (guard.Lease{Key: k}); l.KeyFor("charge") != got {
		t.Fatal("Lease.KeyFor differs from DownstreamKey")
	}
	seen := map[string]string{}
	for _, c := range []struct {
		k    guard.Key
		name string
	}{
		{k, "charge"}, {k, "refund"}, {k, "charge "},
		{guard.Key{Scope: k.Scope, ID: k.ID + "x"}, "charge"},
		{guard.Key{Scope: k.Scope + "x", ID: k.ID}, "charge"},
		{guard.Key{Scope: "ab", ID: "c"}, "d"}, {guard.Key{Scope: "a", ID: "bc"}, "d"}, {guard.Key{Scope: "a", ID: "b"}, "cd"},
	} {
		d := guard.DownstreamKey(c.k, c.name)
		if !uuidV8.MatchString(d) {
			t.Fatalf("%q is not a UUIDv8", d)
		}
		desc := fmt.Sprintf("%q/%q/%q", c.k.Scope, c.k.ID, c.name)
		if prev, ok := seen[d]; ok {
			t.Fatalf("%s and %s share the key %s", prev, desc, d)
		}
		seen[d] = desc
		if again := guard.DownstreamKey(c.k, c.name); again != d {
			t.Fatalf("%s: %s then %s", desc, d, again)
		}
	}
}

// TestStepCompleteFastPath: a lease whose claim reported steps completes
// with the record the client builds from them (no new step since: the
// script's fast path), and that record is the one the script builds for a
// lease built by hand: version 1, steps dropped.
func TestStepCompleteFastPath(t *testing.T) {
	s, _ := miniStore(t)
	c := s.Client()
	value := func(id string) string { return c.Get(bg, s.Name(guard.Key{Scope: "s", ID: id})).Val() }
	var leases [2]guard.Lease
	for i, id := range []string{"known", "by-hand"} {
		key := guard.Key{Scope: "s", ID: id}
		req := guard.ClaimRequest{Key: key, Token: "OTHER", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
		out, err := s.Claim(bg, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "a", Result: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(bg, out.Lease, "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		req.Token = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
		if out, err = s.Claim(bg, req); err != nil || len(out.Steps) != 1 {
			t.Fatal(out, err)
		}
		leases[i] = out.Lease
		if v := value(id); v[0] != 2 {
			t.Fatalf("pending record with a step is version %d", v[0])
		}
	}
	for _, l := range []guard.Lease{leases[0], {Key: leases[1].Key, Token: leases[1].Token}} {
		if err := s.Complete(bg, l, []byte("done"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	a, b := value("known"), value("by-hand")
	if a != b || a == "" || a[0] != 1 {
		t.Fatalf("completed from the known pending record %q, by the script %q; want equal, version 1", a, b)
	}
	if rec, err := s.Get(bg, leases[0].Key); err != nil || rec.Steps != nil || string(rec.Result) != "done" || rec.Attempt != 2 {
		t.Fatalf("%+v, %v", rec, err)
	}
}

// stepsKept is a StepStore that says, by its KeepsSteps method, whether
// the steps it takes are kept: a wrapper over stores that may keep none.
type stepsKept struct {
	guard.StepStore
	keeps bool
}

func (s stepsKept) KeepsSteps() bool { return s.keeps }

// TestStepStoreKeepingNone: over a StepStore whose KeepsSteps answers
// false, Step answers ErrStepsUnsupported before the step runs, in every
// attempt, as over a store that is no StepStore; one that answers true
// keeps its steps.
func TestStepStoreKeepingNone(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	for _, c := range []struct {
		name  string
		store guard.Store
		keeps bool
	}{
		{"no StepStore", struct{ guard.Store }{mem}, false},
		{"KeepsSteps false", stepsKept{mem, false}, false},
		{"KeepsSteps true", stepsKept{mem, true}, true},
		{"no KeepsSteps", mem, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			storetest.StepRunsWhereKept(t, c.store, guard.Key{Scope: "keeps", ID: c.name}, c.keeps)
		})
	}
}
