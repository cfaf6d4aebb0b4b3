package otelx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/metrics"
	"github.com/idemguard/idemguard/otelx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.ClientGoroutines) }

// secretID is the key every test uses: no span may carry it.
const secretID = "sk-0190f5c4-SECRET-KEY"

// traced is a tracer over the SDK's in-memory span recorder.
type traced struct {
	rec *tracetest.SpanRecorder
	tr  *otelx.Tracer
	tp  *sdktrace.TracerProvider
}

func newTraced(t testing.TB, opts otelx.Options, procs ...sdktrace.SpanProcessor) *traced {
	rec := tracetest.NewSpanRecorder()
	popts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
	for _, p := range procs {
		popts = append(popts, sdktrace.WithSpanProcessor(p))
	}
	tp := sdktrace.NewTracerProvider(popts...)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts.TracerProvider = tp
	return &traced{rec: rec, tr: otelx.New(opts), tp: tp}
}

// redisStore is a RedisStore on the shared real Redis under the test's
// own prefix.
func redisStore(t testing.TB) *guard.RedisStore {
	t.Helper()
	s := guardenv.Store(t, guard.RedisOptions{})
	return s
}

// spans returns the ended spans named name.
func (tt *traced) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tt.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (tt *traced) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := tt.spans(name)
	if len(s) != 1 {
		t.Fatalf("%d %s spans, want 1 (all: %v)", len(s), name, tt.names())
	}
	return s[0]
}

func (tt *traced) names() []string {
	var n []string
	for _, s := range tt.rec.Ended() {
		n = append(n, s.Name())
	}
	return n
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// want checks that span has each of the attributes.
func want(t *testing.T, span sdktrace.ReadOnlySpan, kvs ...attribute.KeyValue) {
	t.Helper()
	got := attrs(span.Attributes())
	for _, kv := range kvs {
		if v, ok := got[kv.Key]; !ok || v != kv.Value {
			t.Errorf("%s: %s = %v (present %v), want %v", span.Name(), kv.Key, v.String(), ok, kv.Value.String())
		}
	}
}

// childOf checks that span is a child of parent, in its trace.
func childOf(t *testing.T, span sdktrace.ReadOnlySpan, parent trace.SpanContext) {
	t.Helper()
	if span.Parent().SpanID() != parent.SpanID() || span.SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("%s: parent %s in trace %s, want %s in %s", span.Name(), span.Parent().SpanID(), span.SpanContext().TraceID(), parent.SpanID(), parent.TraceID())
	}
}

// noRawKey checks every span, attribute, event and status for the key.
func (tt *traced) noRawKey(t *testing.T) {
	t.Helper()
	check := func(where, s string) {
		if strings.Contains(s, secretID) {
			t.Errorf("%s carries the raw key: %q", where, s)
		}
	}
	for _, s := range tt.rec.Ended() {
		check(s.Name()+" status", s.Status().Description)
		for _, kv := range s.Attributes() {
			check(s.Name()+" "+string(kv.Key), kv.Value.String())
		}
		for _, e := range s.Events() {
			for _, kv := range e.Attributes {
				check(s.Name()+" event "+e.Name+" "+string(kv.Key), kv.Value.String())
			}
		}
	}
}

// TestDoSpans: Guard.Do over the traced store, with the traced Func and
// the Tracer as observer, inside a request span: a claim, an effect and a
// complete span, children of the request's; the request span gets the
// guard's events and outcome; a replay has a claim span saying so and no
// effect span.
func TestDoSpans(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	g := guard.New(tt.tr.Store(redisStore(t)), guard.Options{Observer: tt.tr})
	key := guard.Key{Scope: "POST /charges", ID: secretID}
	dig := metrics.KeyDigest(key)
	fn := tt.tr.Func(func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
			return nil, errors.New("the effect's context has no span")
		}
		return []byte(`{"charge":"ch_1"}`), nil
	})

	ctx, req := tt.tp.Tracer("test").Start(context.Background(), "POST /charges")
	if _, err := g.Do(ctx, key, "fp", fn); err != nil {
		t.Fatal(err)
	}
	req.End()
	claim, effect, complete := tt.one(t, otelx.SpanClaim), tt.one(t, otelx.SpanEffect), tt.one(t, otelx.SpanComplete)
	for _, s := range []sdktrace.ReadOnlySpan{claim, effect, complete} {
		childOf(t, s, req.SpanContext())
		want(t, s, otelx.KeyDigest.String(dig))
	}
	want(t, claim, otelx.Outcome.String("acquired"), otelx.Replayed.Bool(false), otelx.Attempt.Int(1), otelx.Fence.Int64(1), otelx.Recovered.Bool(false))
	want(t, effect, otelx.Outcome.String("ok"), otelx.Attempt.Int(1), otelx.Fence.Int64(1), otelx.ResultSize.Int(17))
	want(t, complete, otelx.Outcome.String("ok"), otelx.Attempt.Int(1), otelx.Fence.Int64(1), otelx.ResultSize.Int(17))
	if claim.SpanKind() != trace.SpanKindClient || effect.SpanKind() != trace.SpanKindInternal {
		t.Errorf("kinds: claim %v, effect %v", claim.SpanKind(), effect.SpanKind())
	}
	if !(claim.EndTime().Before(effect.StartTime()) || claim.EndTime().Equal(effect.StartTime())) || effect.EndTime().After(complete.StartTime()) {
		t.Errorf("claim, effect and complete overlap")
	}
	request := tt.one(t, "POST /charges")
	want(t, request, otelx.Outcome.String("completed"), otelx.Replayed.Bool(false))
	var events []string
	for _, e := range request.Events() {
		events = append(events, e.Name)
	}
	if strings.Join(events, ",") != "idemguard.acquired,idemguard.completed" {
		t.Errorf("request span events %v", events)
	}

	// A replay.
	ctx, req2 := tt.tp.Tracer("test").Start(context.Background(), "POST /charges again")
	res, err := g.Do(ctx, key, "fp", fn)
	req2.End()
	if err != nil || !res.Replayed {
		t.Fatalf("replay: %v %v", res, err)
	}
	claims := tt.spans(otelx.SpanClaim)
	if len(claims) != 2 || len(tt.spans(otelx.SpanEffect)) != 1 {
		t.Fatalf("spans after the replay: %v", tt.names())
	}
	want(t, claims[1], otelx.Outcome.String("replay"), otelx.Replayed.Bool(true), otelx.ResultSize.Int(17))
	childOf(t, claims[1], req2.SpanContext())
	want(t, tt.one(t, "POST /charges again"), otelx.Outcome.String("replayed"), otelx.Replayed.Bool(true))
	tt.noRawKey(t)
}

// TestFailReleaseSpans: an effect that fails gets an error status and a
// fail span; one that refuses (ErrRejected) a release span; a panicking one
// an error status and a release span, and the panic goes on.
func TestFailReleaseSpans(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	g := guard.New(tt.tr.Store(redisStore(t)), guard.Options{Observer: tt.tr})
	ctx := context.Background()
	key := func(s string) guard.Key { return guard.Key{Scope: "jobs", ID: secretID + s} }

	_, err := g.Do(ctx, key("f"), "fp", tt.tr.Func(func(context.Context, guard.Lease) ([]byte, error) {
		return nil, fmt.Errorf("card declined for %s", secretID+"f")
	}))
	if err == nil {
		t.Fatal("no error")
	}
	effect := tt.one(t, otelx.SpanEffect)
	want(t, effect, otelx.Outcome.String("error"))
	if effect.Status().Code != codes.Error || !strings.Contains(effect.Status().Description, "card declined for <key ") {
		t.Errorf("effect status %+v", effect.Status())
	}
	want(t, tt.one(t, otelx.SpanFail), otelx.Outcome.String("ok"), otelx.Attempt.Int(1))

	_, err = g.Do(ctx, key("r"), "fp", tt.tr.Func(func(context.Context, guard.Lease) ([]byte, error) {
		return nil, fmt.Errorf("lock taken: %w", guard.ErrRejected)
	}))
	if !errors.Is(err, guard.ErrRejected) {
		t.Fatal(err)
	}
	want(t, tt.spans(otelx.SpanEffect)[1], otelx.Outcome.String("rejected"))
	want(t, tt.one(t, otelx.SpanRelease), otelx.Outcome.String("ok"))

	func() {
		defer func() {
			if recover() != "boom" {
				t.Error("the panic did not go on")
			}
		}()
		_, _ = g.Do(ctx, key("p"), "fp", tt.tr.Func(func(context.Context, guard.Lease) ([]byte, error) { panic("boom") }))
	}()
	panicked := tt.spans(otelx.SpanEffect)[2]
	want(t, panicked, otelx.Outcome.String("panic"))
	if panicked.Status().Code != codes.Error || len(tt.spans(otelx.SpanRelease)) != 2 {
		t.Errorf("panic: status %+v, release spans %d", panicked.Status(), len(tt.spans(otelx.SpanRelease)))
	}
	tt.noRawKey(t)
}

// signal is a span processor that reports each span named name as it ends.
type signal struct {
	name string
	ch   chan struct{}
}

func (s *signal) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s *signal) OnEnd(span sdktrace.ReadOnlySpan) {
	if span.Name() == s.name {
		select {
		case s.ch <- struct{}{}:
		default:
		}
	}
}
func (s *signal) Shutdown(context.Context) error   { return nil }
func (s *signal) ForceFlush(context.Context) error { return nil }

// TestExtendSpans: while a long effect runs, the guard extends its lease
// every Lease/3; each extension is a span, a child of the caller's span.
func TestExtendSpans(t *testing.T) {
	extended := &signal{name: otelx.SpanExtend, ch: make(chan struct{}, 1)}
	tt := newTraced(t, otelx.Options{}, extended)
	g := guard.New(tt.tr.Store(redisStore(t)), guard.Options{Lease: 600 * time.Millisecond})
	ctx, req := tt.tp.Tracer("test").Start(context.Background(), "job")
	_, err := g.Do(ctx, guard.Key{Scope: "jobs", ID: secretID}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		select {
		case <-extended.ch: // the lease was extended while the effect ran
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(30 * time.Second): // 150 leases: the heartbeat is not traced
			return nil, errors.New("no extend span while the effect ran for 30 s")
		}
		return []byte("done"), nil
	})
	req.End()
	if err != nil {
		t.Fatal(err)
	}
	ext := tt.spans(otelx.SpanExtend)
	if len(ext) == 0 {
		t.Fatal("no extend span")
	}
	childOf(t, ext[0], req.SpanContext())
	want(t, ext[0], otelx.Outcome.String("ok"), otelx.Attempt.Int(1), otelx.Fence.Int64(1))
	tt.noRawKey(t)
}

// TestClaimOutcomes: in progress (with the lease left), mismatch, and a
// write by a holder that lost the key (lease_lost, an error status).
func TestClaimOutcomes(t *testing.T) {
	tt := newTraced(t, otelx.Options{RecordScope: true})
	g := guard.New(tt.tr.Store(redisStore(t)), guard.Options{Observer: tt.tr})
	ctx := context.Background()
	key := guard.Key{Scope: "tenant-1 POST /charges", ID: secretID}
	out, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, key, "fp"); !errors.Is(err, guard.ErrInProgress) {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, key, "other"); !errors.Is(err, guard.ErrMismatch) {
		t.Fatal(err)
	}
	claims := tt.spans(otelx.SpanClaim)
	if len(claims) != 3 {
		t.Fatalf("claims: %v", tt.names())
	}
	want(t, claims[0], otelx.Scope.String(key.Scope))
	want(t, claims[1], otelx.Outcome.String("in_progress"))
	if ms := attrs(claims[1].Attributes())[otelx.LeaseLeft].AsInt64(); ms <= 0 || ms > 30000 {
		t.Errorf("lease left %d ms", ms)
	}
	want(t, claims[2], otelx.Outcome.String("mismatch"))
	stale := out.Lease
	stale.Token = "not-the-holder"
	if err := g.Complete(ctx, stale, []byte("x")); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatal(err)
	}
	c := tt.one(t, otelx.SpanComplete)
	want(t, c, otelx.Outcome.String("lease_lost"))
	if c.Status().Code != codes.Error || len(c.Events()) != 1 || c.Events()[0].Name != "exception" {
		t.Errorf("lease lost: status %+v events %v", c.Status(), c.Events())
	}
	tt.noRawKey(t)
}

// TestUnavailable: a store that cannot be reached gives a claim span with
// outcome unavailable and an error status naming no key.
func TestUnavailable(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	g := guard.New(tt.tr.Store(guard.NewRedisStore(rdb, guard.RedisOptions{})), guard.Options{Observer: tt.tr, Lease: time.Second})
	ctx, req := tt.tp.Tracer("test").Start(context.Background(), "req")
	_, err := g.Do(ctx, guard.Key{Scope: "s", ID: secretID}, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil })
	req.End()
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatal(err)
	}
	claim := tt.one(t, otelx.SpanClaim)
	want(t, claim, otelx.Outcome.String("unavailable"))
	if claim.Status().Code != codes.Error {
		t.Errorf("status %+v", claim.Status())
	}
	want(t, tt.one(t, "req"), otelx.Outcome.String("unavailable"))
	tt.noRawKey(t)
}

// TestSteps: the traced store of a StepStore is a StepStore, so guard.Step
// works through it, each step with its span; the traced store of a store
// without steps is not one.
func TestSteps(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	for name, s := range map[string]guard.Store{"redis": redisStore(t), "memstore": memstore.New(memstore.Options{})} {
		wrapped := tt.tr.Store(s)
		if _, ok := wrapped.(guard.StepStore); !ok {
			t.Fatalf("%s: the traced store is not a StepStore", name)
		}
		g := guard.New(wrapped, guard.Options{})
		_, err := g.Do(context.Background(), guard.Key{Scope: name, ID: secretID}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			id, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) { return "ch_1", nil })
			return []byte(id), err
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	steps := tt.spans(otelx.SpanStep)
	if len(steps) != 2 {
		t.Fatalf("step spans: %v", tt.names())
	}
	want(t, steps[0], otelx.StepName.String("charge"), otelx.StepIndex.Int(0), otelx.Outcome.String("ok"))
	if _, ok := tt.tr.Store(onlyStore{memstore.New(memstore.Options{})}).(guard.StepStore); ok {
		t.Fatal("the traced store of a store without steps claims steps")
	}
	if u, ok := tt.tr.Store(onlyStore{}).(interface{ Unwrap() guard.Store }); !ok || u.Unwrap() != (onlyStore{}) {
		t.Fatal("Unwrap")
	}
	tt.noRawKey(t)
}

// onlyStore hides every interface of a store but guard.Store.
type onlyStore struct{ guard.Store }

// keepsNoSteps is a StepStore whose KeepsSteps answers false, as a
// fallback.Store over a store keeping no steps does.
type keepsNoSteps struct{ guard.StepStore }

func (keepsNoSteps) KeepsSteps() bool { return false }

// TestKeepsStepsForwarded: the traced store of a StepStore answers
// guard.KeepsSteps as that store does, so over one keeping no steps
// guard.Step answers guard.ErrStepsUnsupported before the step runs, in
// every attempt (it ran the step each time, its result kept nowhere).
func TestKeepsStepsForwarded(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	for _, tc := range []struct {
		name  string
		s     guard.Store
		keeps bool
	}{
		{"memstore", memstore.New(memstore.Options{}), true},
		{"keeps no steps", keepsNoSteps{memstore.New(memstore.Options{})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			traced := tt.tr.Store(tc.s)
			storetest.StepRunsWhereKept(t, traced, guard.Key{Scope: "steps", ID: tc.name}, tc.keeps)
		})
	}
}

// TestDeadlineForwarded: the traced store answers guard.DeadlineStore as
// the store it traces does (fallback runs its calls inline on it).
func TestDeadlineForwarded(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for name, tc := range map[string]struct {
		s    guard.Store
		want bool
	}{
		"deadline-bound redis": {guard.NewRedisStore(c, guard.RedisOptions{}), true},
		"plain redis":          {redisStore(t), false},
		"not a DeadlineStore":  {onlyStore{guard.NewRedisStore(c, guard.RedisOptions{})}, false},
	} {
		ds, ok := tt.tr.Store(tc.s).(guard.DeadlineStore)
		if !ok || ds.HonoursDeadline() != tc.want {
			t.Errorf("%s: DeadlineStore %t, HonoursDeadline want %t", name, ok, tc.want)
		}
	}
}

// TestNoRecordingSpan: without a recording span in the context, the
// observer does nothing, and the store's spans are roots.
func TestNoRecordingSpan(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	g := guard.New(tt.tr.Store(memstore.New(memstore.Options{})), guard.Options{Observer: tt.tr})
	if _, err := g.Do(context.Background(), guard.Key{Scope: "s", ID: secretID}, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	claim := tt.one(t, otelx.SpanClaim)
	if claim.Parent().IsValid() {
		t.Fatalf("claim span has a parent %v", claim.Parent())
	}
}

func TestDigestIsMetrics(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	key := guard.Key{Scope: `"acct" /a.B/C`, ID: secretID}
	g := guard.New(tt.tr.Store(memstore.New(memstore.Options{})), guard.Options{})
	if _, err := g.Claim(context.Background(), key, "fp"); err != nil {
		t.Fatal(err)
	}
	want(t, tt.one(t, otelx.SpanClaim), otelx.KeyDigest.String(metrics.KeyDigest(key)))
}

// TestBatchSpans: the traced store is a guard.BatchStore (and a
// StepStore) exactly when the store it traces is, so DoBatch through it
// keeps a batch's round trips; each key gets its claim and complete span,
// children of the caller's span, with the claim's outcome, and no span
// carries the raw key.
func TestBatchSpans(t *testing.T) {
	tt := newTraced(t, otelx.Options{})
	rs := redisStore(t)
	for name, tc := range map[string]struct {
		s            guard.Store
		steps, batch bool
	}{
		"redis":        {rs, true, true},
		"steps only":   {struct{ guard.StepStore }{rs}, true, false},
		"batches only": {struct{ guard.BatchStore }{rs}, false, true},
		"neither":      {onlyStore{rs}, false, false},
	} {
		traced := tt.tr.Store(tc.s)
		_, steps := traced.(guard.StepStore)
		_, batch := traced.(guard.BatchStore)
		if steps != tc.steps || batch != tc.batch {
			t.Errorf("%s: a StepStore %v, a BatchStore %v; want %v, %v", name, steps, batch, tc.steps, tc.batch)
		}
	}

	g := guard.New(tt.tr.Store(rs), guard.Options{})
	ctx, parent := tt.tp.Tracer("test").Start(context.Background(), "consume")
	items := []guard.BatchItem{
		{Key: guard.Key{Scope: "batch", ID: secretID}, Fingerprint: "fp"},
		{Key: guard.Key{Scope: "batch", ID: secretID + "-2"}, Fingerprint: "fp"},
	}
	for i, r := range g.DoBatch(ctx, items, func(context.Context, int, guard.Lease) ([]byte, error) {
		return []byte("done"), nil
	}, guard.BatchOptions{}) {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	parent.End()
	for _, name := range []string{otelx.SpanClaim, otelx.SpanComplete} {
		spans := tt.spans(name)
		if len(spans) != len(items) {
			t.Fatalf("%d %s spans, want %d (all: %v)", len(spans), name, len(items), tt.names())
		}
		for _, s := range spans {
			childOf(t, s, parent.SpanContext())
			want(t, s, otelx.Outcome.String(map[string]string{otelx.SpanClaim: "acquired", otelx.SpanComplete: "ok"}[name]))
		}
	}
	tt.noRawKey(t)
}
