// Package promx exports what a guard does to Prometheus.
//
// A Metrics is a guard.Observer that counts outcomes by kind, and wraps a
// guard.Store to time every store operation:
//
//	m, err := promx.New(prometheus.DefaultRegisterer, promx.Options{})
//	g := guard.New(m.Store(store), guard.Options{Observer: m})
//
// It is a module of its own (github.com/idemguard/idemguard/promx), so a
// service that does not use Prometheus does not get its client in its
// build. metrics.Tee hands each event to a Metrics and a metrics.Logger.
package promx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemguard/idemguard/guard"
)

// DefaultNamespace prefixes every metric name.
const DefaultNamespace = "idemguard"

// DefaultBuckets are the store latency buckets, in seconds: 100µs to about
// 0.8s by doubling, which spans a loopback Redis call to a struggling one.
var DefaultBuckets = prometheus.ExponentialBuckets(0.0001, 2, 14)

// Options configure a Metrics. The zero value is ready to use.
type Options struct {
	// Namespace prefixes the metric names. Default DefaultNamespace.
	Namespace string
	// ConstLabels are added to every metric (e.g. the service name).
	ConstLabels prometheus.Labels
	// Buckets are the store latency histogram buckets, in seconds, each
	// greater than the one before (New refuses others).
	// Default DefaultBuckets.
	Buckets []float64
}

// Kinds lists every outcome label value Metrics exports, in guard order.
// Each is exported from the start with a count of zero, so dashboards and
// alerts see the series before the first event.
var Kinds = []guard.EventKind{
	guard.EventAcquired, guard.EventRecovered, guard.EventReplayed, guard.EventInProgress,
	guard.EventMismatch, guard.EventExhausted, guard.EventCompleted, guard.EventFailed,
	guard.EventReleased, guard.EventLeaseLost, guard.EventUnavailable, guard.EventCorrupt,
}

// Store operations, the values of the "op" label.
var ops = []string{"claim", "complete", "fail", "release", "extend", "get"}

// Store results, the values of the "result" label.
var results = []string{"ok", "lease_lost", "not_found", "unavailable", "canceled", "error"}

// Metrics counts a guard's outcomes and times its store. It is safe for
// concurrent use.
//
// Exported series (with the default namespace):
//   - idemguard_outcomes_total{kind}: one per guard.Event, kind as
//     guard.EventKind.String names it (acquired, replayed, in_progress,
//     mismatch, recovered, lease_lost, exhausted, unavailable, corrupt, ...);
//   - idemguard_store_duration_seconds{op,result}: latency of each store
//     call (op: claim, complete, fail, release, extend, get; result: ok,
//     lease_lost, not_found, unavailable, canceled, error).
type Metrics struct {
	outcomes *prometheus.CounterVec
	byKind   []prometheus.Counter // indexed by guard.EventKind
	latency  *prometheus.HistogramVec
}

var _ guard.Observer = (*Metrics)(nil)

// New creates the metrics and registers them on reg. It fails if reg
// already holds metrics of the same names, or if opts are refused (Buckets
// not increasing, a constant label named kind, op, result or le). When it
// fails it leaves nothing registered on reg.
//
// Several guards can share one Metrics (Observer: m, and m.Store for each
// store). To tell them apart instead, give each its own Namespace, or
// register every one of them, the first too, under a
// prometheus.WrapRegistererWith with the same label names: a registry
// refuses a metric name registered once with a label and once without
// (ConstLabels likewise).
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil Registerer")
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if len(opts.Buckets) == 0 {
		opts.Buckets = DefaultBuckets
	}
	// The histogram panics on these when its first series is made.
	for i := 1; i < len(opts.Buckets); i++ {
		if opts.Buckets[i-1] >= opts.Buckets[i] {
			return nil, fmt.Errorf("metrics: Buckets must increase: %g then %g", opts.Buckets[i-1], opts.Buckets[i])
		}
	}
	// Refused before anything is registered: the outcomes counter would
	// register with such a label and the histogram not (le: the histogram
	// panics when its first series is made), and a registry keeps the
	// label names a metric name was registered with for its life, even
	// unregistered.
	for _, l := range []string{"kind", "op", "result", "le"} {
		if _, ok := opts.ConstLabels[l]; ok {
			return nil, fmt.Errorf("metrics: ConstLabels: %q is a label of the metrics", l)
		}
	}
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace:   opts.Namespace,
			Name:        "outcomes_total",
			Help:        "Guard outcomes by kind: acquired, replayed, in_progress, mismatch, recovered, lease_lost, exhausted, unavailable, ...",
			ConstLabels: opts.ConstLabels,
		}, []string{"kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   opts.Namespace,
			Name:        "store_duration_seconds",
			Help:        "Latency of idempotency store operations by operation and result.",
			ConstLabels: opts.ConstLabels,
			Buckets:     opts.Buckets,
		}, []string{"op", "result"}),
	}
	// All or nothing: a metric registered before one refused is
	// unregistered, so a corrected New on the same reg succeeds.
	var registered []prometheus.Collector
	for _, c := range []prometheus.Collector{m.outcomes, m.latency} {
		if err := reg.Register(c); err != nil {
			for _, r := range registered {
				reg.Unregister(r)
			}
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
		registered = append(registered, c)
	}
	m.byKind = make([]prometheus.Counter, int(slices.Max(Kinds))+1)
	for _, k := range Kinds {
		m.byKind[k] = m.outcomes.WithLabelValues(k.String())
	}
	for _, op := range ops {
		m.latency.WithLabelValues(op, "ok")
	}
	return m, nil
}

// Observe implements guard.Observer: it counts e under its kind.
func (m *Metrics) Observe(_ context.Context, e guard.Event) {
	if int(e.Kind) < len(m.byKind) && m.byKind[e.Kind] != nil {
		m.byKind[e.Kind].Inc()
		return
	}
	m.outcomes.WithLabelValues(e.Kind.String()).Inc()
}

// Count returns how many events of kind k m has observed.
func (m *Metrics) Count(k guard.EventKind) uint64 {
	c := m.outcomes.WithLabelValues(k.String())
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		return 0
	}
	return uint64(pb.GetCounter().GetValue())
}

// Store returns a guard.Store that behaves exactly as s and records the
// latency of every call in the store_duration_seconds histogram.
//
// It forwards the optional interfaces fallback and guard look for: the
// returned store is a guard.StepStore exactly when s is one (SaveStep is
// passed through, untimed, and guard.KeepsSteps answers as for s), a
// guard.BatchStore exactly when s is one (so
// DoBatch and the consumers keep claiming and completing a batch in one
// round trip; each key's call is timed with the batch's latency), and a
// guard.DeadlineStore whose HonoursDeadline answers as s does (false when
// s is not one), so a fallback.Store over it keeps its inline path. It
// names s as the store it wraps (Unwrap() guard.Store), so the adapters
// see through it as through otelx's traced store: a fallback.Store's open
// breaker still sets the Retry-After of a 503, and a Guard nested inside
// another over a timed view of the same store knows the outer claim.
func (m *Metrics) Store(s guard.Store) guard.Store {
	if s == nil {
		panic("promx: Metrics.Store: nil Store")
	}
	t := &timedStore{next: s}
	for i, op := range ops {
		for j, r := range results {
			t.obs[i][j] = m.latency.WithLabelValues(op, r)
		}
	}
	ss, steps := s.(guard.StepStore)
	bs, batches := s.(guard.BatchStore)
	switch {
	case steps && batches:
		return &timedStepBatchStore{t, stepsOf{ss}, batchesOf{t, bs}}
	case steps:
		return &timedStepStore{t, stepsOf{ss}}
	case batches:
		return &timedBatchStore{t, batchesOf{t, bs}}
	}
	return t
}

const (
	opClaim = iota
	opComplete
	opFail
	opRelease
	opExtend
	opGet
)

// timedStore is the decorator Metrics.Store returns.
type timedStore struct {
	next guard.Store
	obs  [6][6]prometheus.Observer // [op][result]
}

// Unwrap returns the store being timed.
func (t *timedStore) Unwrap() guard.Store { return t.next }

func (t *timedStore) done(op int, start time.Time, err error) {
	t.obs[op][resultOf(err)].Observe(time.Since(start).Seconds())
}

func resultOf(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, guard.ErrLeaseLost):
		return 1
	case errors.Is(err, guard.ErrNotFound):
		return 2
	case errors.Is(err, guard.ErrUnavailable):
		return 3
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return 4
	default:
		return 5
	}
}

func (t *timedStore) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	start := time.Now()
	out, err := t.next.Claim(ctx, req)
	t.done(opClaim, start, err)
	return out, err
}

func (t *timedStore) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	start := time.Now()
	err := t.next.Complete(ctx, lease, result, ttl)
	t.done(opComplete, start, err)
	return err
}

func (t *timedStore) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	start := time.Now()
	err := t.next.Fail(ctx, lease, reason, ttl)
	t.done(opFail, start, err)
	return err
}

func (t *timedStore) Release(ctx context.Context, lease guard.Lease) error {
	start := time.Now()
	err := t.next.Release(ctx, lease)
	t.done(opRelease, start, err)
	return err
}

func (t *timedStore) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	start := time.Now()
	err := t.next.Extend(ctx, lease, d)
	t.done(opExtend, start, err)
	return err
}

func (t *timedStore) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	start := time.Now()
	rec, err := t.next.Get(ctx, key)
	t.done(opGet, start, err)
	return rec, err
}

// HonoursDeadline implements guard.DeadlineStore: it answers as the store
// it times does (timing adds no wait).
func (t *timedStore) HonoursDeadline() bool {
	ds, ok := t.next.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}

// The decorators of a guard.StepStore, a guard.BatchStore, and a store
// that is both: the decorator is each exactly when the store is.
type (
	timedStepStore struct {
		*timedStore
		stepsOf
	}
	timedBatchStore struct {
		*timedStore
		batchesOf
	}
	timedStepBatchStore struct {
		*timedStore
		stepsOf
		batchesOf
	}
)

var (
	_ guard.DeadlineStore = (*timedStore)(nil)
	_ guard.StepStore     = (*timedStepStore)(nil)
	_ guard.BatchStore    = (*timedBatchStore)(nil)
	_ guard.StepStore     = (*timedStepBatchStore)(nil)
	_ guard.BatchStore    = (*timedStepBatchStore)(nil)
)

// stepsOf passes a StepStore's SaveStep through, untimed.
type stepsOf struct{ steps guard.StepStore }

// batchesOf passes a BatchStore's batches through and times each key's
// call under its operation, with the batch's latency.
type batchesOf struct {
	t     *timedStore
	batch guard.BatchStore
}

// ClaimBatch implements guard.BatchStore: one claim observed per request.
func (b batchesOf) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	start := time.Now()
	out, errs := b.batch.ClaimBatch(ctx, reqs)
	for _, err := range errs {
		b.t.done(opClaim, start, err)
	}
	return out, errs
}

// WriteBatch implements guard.BatchStore: one write observed per write,
// under its kind's operation.
func (b batchesOf) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	start := time.Now()
	errs := b.batch.WriteBatch(ctx, ws)
	for i, err := range errs {
		if op, ok := writeOps[ws[i].Kind]; ok {
			b.t.done(op, start, err)
		}
	}
	return errs
}

var writeOps = map[guard.WriteKind]int{
	guard.WriteComplete: opComplete, guard.WriteFail: opFail, guard.WriteRelease: opRelease, guard.WriteExtend: opExtend,
}

// SaveStep implements guard.StepStore by passing the call through.
func (s stepsOf) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return s.steps.SaveStep(ctx, lease, index, step)
}

// KeepsSteps answers as the StepStore does (see guard.StepStore): a
// fallback.Store over a store keeping no steps keeps none through the
// timed store either, and guard.Step refuses before the step runs.
func (s stepsOf) KeepsSteps() bool { return guard.KeepsSteps(s.steps) }
