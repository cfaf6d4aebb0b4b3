package promx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/promx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gathered reads every series of reg into name{labels} → value (counters)
// or sample count (histograms).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			name := f.GetName() + labels(m)
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func labels(m *dto.Metric) string {
	var b strings.Builder
	b.WriteString("{")
	for i, l := range m.GetLabel() {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(l.GetName() + "=" + l.GetValue())
	}
	b.WriteString("}")
	return b.String()
}

func redisGuard(t *testing.T, reg prometheus.Registerer, opts guard.Options) (*guard.Guard, *promx.Metrics) {
	t.Helper()
	store := guardenv.Store(t, guard.RedisOptions{})
	m, err := promx.New(reg, promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Observer = m
	return guard.New(m.Store(store), opts), m
}

func ok(_ context.Context, _ guard.Lease) ([]byte, error) { return []byte("done"), nil }

// Every outcome kind is counted once per event, and every store call is
// timed under its operation and result.
func TestOutcomesCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The lease bounds the time between b's two claims below (the second
	// must find the first's lease alive): 1s, not 300ms, which a loaded
	// machine can stall for.
	g, _ := redisGuard(t, reg, guard.Options{MaxAttempts: 1, Lease: time.Second})
	ctx := context.Background()
	k := func(id string) guard.Key { return guard.Key{Scope: "metrics", ID: id} }

	// acquired + completed, then two replays, then a mismatch.
	if _, err := g.Do(ctx, k("a"), "fp", ok); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r, err := g.Do(ctx, k("a"), "fp", ok); err != nil || !r.Replayed {
			t.Fatalf("replay: %v %v", r, err)
		}
	}
	if _, err := g.Do(ctx, k("a"), "other", ok); !errors.Is(err, guard.ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	// in_progress: a held claim meets a second claim.
	held, err := g.Claim(ctx, k("b"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, k("b"), "fp"); !errors.Is(err, guard.ErrInProgress) {
		t.Fatalf("in progress: %v", err)
	}
	// The holder dies; after the lease the claim meets MaxAttempts = 1:
	// exhausted (no recovery allowed).
	testenv.WaitFor(t, 5*time.Second, "the lease to end (a Redis TTL)", func() bool {
		_, err := g.Claim(ctx, k("b"), "fp")
		if !errors.Is(err, guard.ErrExhausted) && !errors.Is(err, guard.ErrInProgress) {
			t.Fatalf("waiting for the lease to end: %v", err)
		}
		return errors.Is(err, guard.ErrExhausted)
	})
	// The dead holder's late completion: lease lost.
	if err := g.Complete(ctx, held.Lease, []byte("late")); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("late complete: %v", err)
	}
	// failed, then released.
	if _, err := g.Do(ctx, k("c"), "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, errors.New("boom")
	}); err == nil {
		t.Fatal("fn error not returned")
	}
	rel, err := g.Claim(ctx, k("d"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx, rel.Lease); err != nil {
		t.Fatal(err)
	}

	got := gathered(t, reg)
	want := map[string]float64{
		"idemguard_outcomes_total{kind=acquired}":    4, // a, b, c, d
		"idemguard_outcomes_total{kind=completed}":   1,
		"idemguard_outcomes_total{kind=replayed}":    2,
		"idemguard_outcomes_total{kind=mismatch}":    1,
		"idemguard_outcomes_total{kind=exhausted}":   1,
		"idemguard_outcomes_total{kind=lease_lost}":  1,
		"idemguard_outcomes_total{kind=failed}":      1,
		"idemguard_outcomes_total{kind=released}":    1,
		"idemguard_outcomes_total{kind=recovered}":   0,
		"idemguard_outcomes_total{kind=unavailable}": 0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	inProgress := got["idemguard_outcomes_total{kind=in_progress}"]
	if inProgress < 1 {
		t.Errorf("in_progress = %v, want at least 1", inProgress)
	}
	// Claims: a×4, b×(2 + in-progress polls + 1 exhausted), c, d.
	claims := 4 + 1 + inProgress + 1 + 1 + 1
	if c := got["idemguard_store_duration_seconds{op=claim,result=ok}"]; c != claims {
		t.Errorf("claim latency samples %v, want %v", c, claims)
	}
	if c := got["idemguard_store_duration_seconds{op=complete,result=ok}"]; c != 1 {
		t.Errorf("complete ok samples %v, want 1", c)
	}
	if c := got["idemguard_store_duration_seconds{op=complete,result=lease_lost}"]; c != 1 {
		t.Errorf("complete lease_lost samples %v, want 1", c)
	}
	for _, op := range []string{"fail", "release"} {
		if c := got["idemguard_store_duration_seconds{op="+op+",result=ok}"]; c != 1 {
			t.Errorf("%s samples %v, want 1", op, c)
		}
	}
}

// Under a race of many duplicates on one key, the counters add up: one
// acquisition, every other caller a replay or an in-progress conflict.
func TestOutcomesUnderRace(t *testing.T) {
	reg := prometheus.NewRegistry()
	g, _ := redisGuard(t, reg, guard.Options{})
	const callers = 64
	var effects atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := g.Do(context.Background(), guard.Key{Scope: "race", ID: "one"}, "fp",
				func(context.Context, guard.Lease) ([]byte, error) {
					effects.Add(1)
					return []byte("x"), nil
				})
			if err != nil && !errors.Is(err, guard.ErrInProgress) {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	got := gathered(t, reg)
	if effects.Load() != 1 || got["idemguard_outcomes_total{kind=acquired}"] != 1 {
		t.Fatalf("effects %d, acquired %v; want 1 and 1", effects.Load(), got["idemguard_outcomes_total{kind=acquired}"])
	}
	if sum := got["idemguard_outcomes_total{kind=replayed}"] + got["idemguard_outcomes_total{kind=in_progress}"]; sum != callers-1 {
		t.Fatalf("replayed + in_progress = %v, want %d", sum, callers-1)
	}
	if c := got["idemguard_store_duration_seconds{op=claim,result=ok}"]; c != callers {
		t.Fatalf("claim samples %v, want %d", c, callers)
	}
}

// A store that cannot be reached is counted as unavailable, and its calls
// are timed under result=unavailable.
func TestUnavailableCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	port := testenv.FreePort(t) // nothing listens there
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	m, err := promx.New(reg, promx.Options{Namespace: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(m.Store(guard.NewRedisStore(c, guard.RedisOptions{})), guard.Options{Observer: m})
	_, err = g.Do(context.Background(), guard.Key{Scope: "s", ID: "i"}, "fp", ok)
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
	got := gathered(t, reg)
	if v := got["svc_outcomes_total{kind=unavailable}"]; v != 1 {
		t.Errorf("unavailable = %v, want 1", v)
	}
	if v := got["svc_store_duration_seconds{op=claim,result=unavailable}"]; v != 1 {
		t.Errorf("claim unavailable samples = %v, want 1", v)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := promx.New(nil, promx.Options{}); err == nil {
		t.Error("nil registerer accepted")
	}
	reg := prometheus.NewRegistry()
	if _, err := promx.New(reg, promx.Options{}); err != nil {
		t.Fatal(err)
	}
	_, err := promx.New(reg, promx.Options{})
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("second New on one registry: %v, want AlreadyRegisteredError", err)
	}
	// Every kind is exported from the start at zero.
	fams, _ := reg.Gather()
	n := 0
	for _, f := range fams {
		if f.GetName() == "idemguard_outcomes_total" {
			n = len(f.GetMetric())
		}
	}
	if n != len(promx.Kinds) {
		t.Errorf("%d outcome series before any event, want %d", n, len(promx.Kinds))
	}
}

// TestNewBadBuckets: buckets the histogram refuses are New's error, not a
// panic (the histogram panicked when New made its first series), and
// nothing is registered.
func TestNewBadBuckets(t *testing.T) {
	for _, b := range [][]float64{{2, 1}, {1, 1}, {0.1, 0.2, 0.2}} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("New with buckets %v panicked: %v", b, p)
				}
			}()
			reg := prometheus.NewRegistry()
			if _, err := promx.New(reg, promx.Options{Buckets: b}); err == nil {
				t.Errorf("buckets %v accepted", b)
			}
			if _, err := promx.New(reg, promx.Options{}); err != nil {
				t.Errorf("New after a refused one: %v", err)
			}
		}()
	}
}

// TestNewAllOrNothing: a New that fails on its second metric leaves
// nothing registered, so a corrected New on the same registry succeeds.
// Its second metric fails when reg already holds one of its name (here an
// identical histogram, as a Metrics half registered would leave: a
// Prometheus registry keeps a name's label names for its life, even
// unregistered), or with a constant label its histogram's labels refuse
// (op, result, le): refused before anything is registered, for the
// outcomes counter registered with it would keep that label's name in reg
// for ever.
func TestNewAllOrNothing(t *testing.T) {
	t.Run("second name taken", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		blocker := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: promx.DefaultNamespace, Name: "store_duration_seconds",
			Help: "Latency of idempotency store operations by operation and result.",
		}, []string{"op", "result"})
		reg.MustRegister(blocker)
		_, err := promx.New(reg, promx.Options{})
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			t.Fatalf("New with its histogram registered: %v, want AlreadyRegisteredError", err)
		}
		reg.Unregister(blocker)
		if _, err := promx.New(reg, promx.Options{}); err != nil {
			t.Fatalf("New after the histogram was unregistered: %v", err)
		}
	})
	for _, l := range []string{"kind", "op", "result", "le"} {
		t.Run("constant label "+l, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("New with a constant label %s panicked: %v", l, p)
				}
			}()
			reg := prometheus.NewRegistry()
			if _, err := promx.New(reg, promx.Options{ConstLabels: prometheus.Labels{l: "x"}}); err == nil {
				t.Fatalf("a constant label named %s accepted", l)
			}
			if _, err := promx.New(reg, promx.Options{ConstLabels: prometheus.Labels{"service": "x"}}); err != nil {
				t.Fatalf("New after a refused one: %v", err)
			}
		})
	}
}

// No metric carries a key in a label: after events and store calls for
// keys with distinctive ids, no label value holds one.
func TestMetricLabelsCarryNoKeys(t *testing.T) {
	reg := prometheus.NewRegistry()
	g, _ := redisGuard(t, reg, guard.Options{})
	ctx := context.Background()
	for i := range 3 {
		k := guard.Key{Scope: "label-scope-zq", ID: fmt.Sprintf("label-key-zq-%d", i)}
		if _, err := g.Do(ctx, k, "fp", ok); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Do(ctx, k, "fp", ok); err != nil {
			t.Fatal(err)
		}
		_, _ = g.Do(ctx, k, "other", ok)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "zq") {
					t.Errorf("%s has label %s=%q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	if series == 0 {
		t.Fatal("no series gathered")
	}
}

// The timed store is a guard.BatchStore (and a StepStore) exactly when
// the store it times is, so DoBatch through it keeps its two round trips
// for a whole batch (it went key by key); each key's claim and completion
// is timed.
func TestBatchesPassThrough(t *testing.T) {
	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs := guardenv.Store(t, guard.RedisOptions{})
	for _, tc := range []struct {
		name         string
		s            guard.Store
		steps, batch bool
	}{
		{"redis", rs, true, true},
		{"steps only", struct{ guard.StepStore }{rs}, true, false},
		{"batches only", struct{ guard.BatchStore }{rs}, false, true},
		{"neither", struct{ guard.Store }{rs}, false, false},
	} {
		timed := m.Store(tc.s)
		_, steps := timed.(guard.StepStore)
		_, batch := timed.(guard.BatchStore)
		if steps != tc.steps || batch != tc.batch {
			t.Errorf("%s: timed store is a StepStore %v, a BatchStore %v; want %v, %v", tc.name, steps, batch, tc.steps, tc.batch)
		}
	}

	reg := prometheus.NewRegistry()
	m, err = promx.New(reg, promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	trips := testenv.CountTrips(rdb)
	g := guard.New(m.Store(guardenv.StoreOn(t, rdb, guard.RedisOptions{})), guard.Options{})
	items := make([]guard.BatchItem, 16)
	for i := range items {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: "metrics-batch", ID: strconv.Itoa(i)}, Fingerprint: "fp"}
	}
	before := trips.Load()
	for i, r := range g.DoBatch(context.Background(), items, func(context.Context, int, guard.Lease) ([]byte, error) {
		return []byte("done"), nil
	}, guard.BatchOptions{}) {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	if n := trips.Load() - before; n > 4 {
		t.Errorf("a batch of 16 through the timed store took %d round trips, want at most 4 (claims, completions, and a script load each)", n)
	}
	got := gathered(t, reg)
	for _, op := range []string{"claim", "complete"} {
		if c := got["idemguard_store_duration_seconds{op="+op+",result=ok}"]; c != 16 {
			t.Errorf("%s samples %v, want 16", op, c)
		}
	}
}

// A holder that loses its lease is one lease_lost, as one failed attempt is
// one failed: its heartbeat finding the record gone and the write that ends
// the run being refused are the same loss. Counted twice, an alert on the
// rate of lost leases fires at half the losses it was set for, and
// metrics.Logger warns twice. (The events come from guard: the heartbeat's
// EventLeaseLost, keepalive.go and batch_keepalive.go, then the refused
// Fail or Complete's, observeErr in guard.go and batch.go. Red until guard
// emits one: guard is the lead's.)
func TestLeaseLossCountedOnce(t *testing.T) {
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	ctx := context.Background()
	// The effect's record vanishes (Redis lost it) while it runs; it waits
	// for its context, which the heartbeat ends, and returns the cause.
	lose := func(key guard.Key) guard.Func {
		return func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
				return nil, err
			}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
	}
	for _, batch := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		m, err := promx.New(reg, promx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		g := guard.New(m.Store(rs), guard.Options{Observer: m, Lease: 300 * time.Millisecond})
		key := guard.Key{Scope: "metrics-lost", ID: strconv.FormatBool(batch)}
		if batch {
			res := g.DoBatch(ctx, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) {
				return lose(key)(ctx, l)
			}, guard.BatchOptions{})
			err = res[0].Err
		} else {
			_, err = g.Do(ctx, key, "fp", lose(key))
		}
		if !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("batch %v: %v, want ErrLeaseLost", batch, err)
		}
		if n := gathered(t, reg)["idemguard_outcomes_total{kind=lease_lost}"]; n != 1 {
			t.Errorf("batch %v: one holder lost its lease once, lease_lost = %v", batch, n)
		}
	}
}
