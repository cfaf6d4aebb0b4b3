// Package otelx traces idemguard with OpenTelemetry. It is a module of its
// own (github.com/idemguard/idemguard/otelx), so the core module does not
// bring the OpenTelemetry API to services that do not use it.
//
// One Tracer gives three things, used together or apart:
//
//   - Tracer.Store wraps a guard.Store: a span for each claim, complete,
//     fail, release, extend and step (SaveStep), a child of the span in
//     the call's context, with the outcome, attempt and fence;
//   - Tracer.Func wraps a guard.Func: a span around the guarded effect,
//     with its attempt and fence, and an error status when it fails or
//     loses its lease;
//   - the Tracer is a guard.Observer: each guard.Event becomes an event on
//     the caller's span (the request's, as otelhttp or otelgrpc started
//     it), which also gets idemguard.outcome and idemguard.replayed, so a
//     replayed request is told apart in any trace view; a batch's span
//     (DoBatch's caller's) gets counts of its keys' outcomes instead, and
//     events only for keys that did not go the common way, at most
//     MaxKeyEvents (see Tracer.Observe).
//
// Wire it once:
//
//	tr := otelx.New(otelx.Options{}) // the global TracerProvider
//	g := guard.New(tr.Store(store), guard.Options{Observer: tr})
//	res, err := g.Do(ctx, key, fingerprint, tr.Func(charge))
//
// Under httpx and grpcx the effect is the handler, whose span the HTTP or
// gRPC instrumentation starts; Store and the Observer add the guard's part
// to it.
//
// Spans never carry an idempotency key: a key and its scope are what fetch
// a stored response, and traces are read by many. A span names the key by
// idemguard.key.digest, the 12 hex digits of SHA-256 that logs and
// metrics.KeyDigest use, so a trace, a log line and a record found with
// `idemguard inspect` correlate; error texts recorded on spans have the
// key ("scope/id") replaced by that digest. Options.RecordScope adds the
// scope (a tenant and a route or method), as an attribute and before the
// digest in error texts, for services where it is not sensitive.
package otelx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

// ScopeName is the instrumentation scope of the spans: the tracer's name.
const ScopeName = "github.com/idemguard/idemguard/otelx"

// Span names.
const (
	SpanClaim    = "idemguard.claim"
	SpanComplete = "idemguard.complete"
	SpanFail     = "idemguard.fail"
	SpanRelease  = "idemguard.release"
	SpanExtend   = "idemguard.extend"
	SpanStep     = "idemguard.step"
	SpanEffect   = "idemguard.effect"
)

// Attribute keys.
const (
	// KeyDigest names the key: 12 hex digits of SHA-256 over its scope, a
	// zero byte and its ID (metrics.KeyDigest).
	KeyDigest = attribute.Key("idemguard.key.digest")
	// Scope is the key's scope, only with Options.RecordScope.
	Scope = attribute.Key("idemguard.scope")
	// Outcome is what happened: for a claim the guard.Status
	// ("acquired", "replay", "in_progress", "mismatch", "exhausted"); for
	// a write "ok"; for the effect "ok", "error", "rejected" or "panic"; on any
	// span "lease_lost", "unavailable" or "error" when the call failed;
	// on the caller's span the last guard.Event's kind, or, once it heard
	// of more than one key (a batch), the kind every key ended with, or
	// "mixed" (see Tracer.Observe).
	Outcome = attribute.Key("idemguard.outcome")
	// Attempt is the lease's attempt (1 for the first acquisition), or the
	// attempts made for an exhausted key.
	Attempt = attribute.Key("idemguard.attempt")
	// Fence is the lease's fence number.
	Fence = attribute.Key("idemguard.fence")
	// Recovered is true when a claim took the key over from a holder whose
	// lease ran out.
	Recovered = attribute.Key("idemguard.recovered")
	// Replayed is true when a claim found a stored result: the effect did
	// not run (on a span that heard of more than one key: for every key).
	Replayed = attribute.Key("idemguard.replayed")
	// LeaseLeft is, for a claim answered in_progress, the milliseconds
	// left of the holder's lease.
	LeaseLeft = attribute.Key("idemguard.lease_left_ms")
	// ResultSize is the bytes of a stored result (complete) or step.
	ResultSize = attribute.Key("idemguard.result.size")
	// StepName and StepIndex name a step (SaveStep).
	StepName  = attribute.Key("idemguard.step.name")
	StepIndex = attribute.Key("idemguard.step.index")
	// LeaseLost is true on the effect's span when its context ended
	// because the lease was lost (or MaxRun passed).
	LeaseLost = attribute.Key("idemguard.lease_lost")
	// Keys is, on a span the Observer heard of more than one key about
	// (DoBatch's caller's span, or one over several Do calls), how many
	// keys it heard of: a batch's size.
	Keys = attribute.Key("idemguard.keys")
	// EventsOmitted is, on such a span, how many events the Observer left
	// out past MaxKeyEvents.
	EventsOmitted = attribute.Key("idemguard.events_omitted")
)

// KeysWith is the attribute, on a span the Observer heard of more than
// one key about, that counts the keys whose last event was of kind k
// ("idemguard.keys.completed", "idemguard.keys.failed", ...).
func KeysWith(k guard.EventKind) attribute.Key {
	return attribute.Key("idemguard.keys." + k.String())
}

// MaxKeyEvents bounds the events the Observer adds to a span once it has
// heard of more than one key, past the first key's: well below the SDK's
// default of 128 events a span, so other instrumentation's events and
// an exception keep their place.
const MaxKeyEvents = 32

// Options configure a Tracer. The zero value is ready to use.
type Options struct {
	// TracerProvider makes the tracer. Default otel.GetTracerProvider(),
	// the global one, as OpenTelemetry's instrumentation libraries do.
	TracerProvider trace.TracerProvider
	// RecordScope adds the key's scope (Scope) to every span and event,
	// and keeps it in error texts that name the key ("scope/<key digest>";
	// without it they say "<key digest>"). It holds the caller's name and
	// the route or method; leave it off where tenant names must stay out
	// of traces.
	RecordScope bool
}

// Tracer traces a guard: Store, Func, and Observe (a guard.Observer). It
// is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	opts   Options
	shards [spanShards]spanShard // the spans Observe heard of (keysOf)
}

var _ guard.Observer = (*Tracer)(nil)

// New returns a Tracer with opts.
func New(opts Options) *Tracer {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Tracer{tracer: tp.Tracer(ScopeName), opts: opts}
}

// keyAttrs are the attributes that name key.
func (t *Tracer) keyAttrs(key guard.Key, more ...attribute.KeyValue) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 2+len(more))
	attrs = append(attrs, KeyDigest.String(metrics.KeyDigest(key)))
	if t.opts.RecordScope {
		attrs = append(attrs, Scope.String(key.Scope))
	}
	return append(attrs, more...)
}

// clientSpan are the options of a store call's span, made once.
var clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// start starts the span of a store call for key, with the attributes
// that name key, lease's (when not nil) and more. Only a recording span
// gets them: a span not recorded costs no digest and no attributes (a
// sampler, and a span processor's OnStart, see the span's name and kind,
// not its attributes).
func (t *Tracer) start(ctx context.Context, name string, key guard.Key, lease *guard.Lease, more ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, name, clientSpan...)
	if span.IsRecording() {
		attrs := t.keyAttrs(key, more...)
		if lease != nil {
			attrs = append(attrs, Attempt.Int(lease.Attempt), Fence.Int64(lease.Fence))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// startCall is start, and returns the context to pass the store: ctx with
// the span, and ctx's AfterFunc (keepAfterFunc).
func (t *Tracer) startCall(ctx context.Context, name string, key guard.Key, lease *guard.Lease, more ...attribute.KeyValue) (context.Context, trace.Span) {
	sctx, span := t.start(ctx, name, key, lease, more...)
	return keepAfterFunc(ctx, sctx), span
}

// redact returns s with key hidden behind its digest (metrics.Redact):
// without Options.RecordScope the key's "scope/id" form becomes the digest
// alone, so the scope stays out of error texts as it stays out of
// attributes.
func (t *Tracer) redact(s string, key guard.Key) string {
	if !t.opts.RecordScope && key.ID != "" {
		s = strings.ReplaceAll(s, key.String(), "<key "+metrics.KeyDigest(key)+">")
	}
	return metrics.Redact(s, key)
}

// failed marks span as failed with err: its outcome, an exception event
// and an error status, the key replaced by its digest in the text (redact).
// A span not recorded gets nothing.
func (t *Tracer) failed(span trace.Span, key guard.Key, err error) {
	if !span.IsRecording() {
		return
	}
	outcome := "error"
	switch {
	case errors.Is(err, guard.ErrLeaseLost):
		outcome = "lease_lost"
	case errors.Is(err, guard.ErrUnavailable):
		outcome = "unavailable"
	}
	msg := t.redact(err.Error(), key)
	span.SetAttributes(Outcome.String(outcome))
	// span.RecordError would record err.Error() as it is, key included.
	span.AddEvent("exception", trace.WithAttributes(
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", msg)))
	span.SetStatus(codes.Error, msg)
}

// write runs a store write in a span.
func (t *Tracer) write(ctx context.Context, name string, lease guard.Lease, fn func(context.Context) error, more ...attribute.KeyValue) error {
	ctx, span := t.startCall(ctx, name, lease.Key, &lease, more...)
	defer span.End()
	err := fn(ctx)
	t.wrote(span, lease.Key, err)
	return err
}

// wrote records a write's answer on its span.
func (t *Tracer) wrote(span trace.Span, key guard.Key, err error) {
	switch {
	case !span.IsRecording():
	case err != nil:
		t.failed(span, key, err)
	default:
		span.SetAttributes(Outcome.String("ok"))
	}
}

// Store returns s with a span around each Claim, Complete, Fail, Release,
// Extend and (for a guard.StepStore) SaveStep, a child of the span in the
// call's context; Get is passed through untraced (Options.Wait polls it).
// s gets the call's context with the span added: its deadline,
// cancellation and values are the caller's, and a context s derives from
// it costs no goroutine more than one derived from the caller's. Answers
// and errors are s's, unchanged.
// The returned store is a guard.StepStore exactly when s is one, so steps
// keep working, and guard.KeepsSteps answers for it as for s.
//
// It is a guard.BatchStore exactly when s is one, so DoBatch and the
// consumers keep claiming and completing a batch in one round trip: each
// key of a batch gets its own span, as its own call would, all of them
// as long as the batch's call.
//
// The returned store is also a guard.DeadlineStore that answers as s does
// (false when s is not one), so a fallback.Store over it keeps running
// its calls on the caller's goroutine.
//
// Other interfaces s may have are not forwarded: RedisStore's Check,
// LoadScripts and GetByName, and any optional store interface guard adds
// later (the guard then sees a store without it and takes its general
// path). Call those on s itself; Unwrap returns it.
func (t *Tracer) Store(s guard.Store) guard.Store {
	if s == nil {
		panic("otelx: nil guard.Store")
	}
	w := &store{t: t, s: s}
	ss, steps := s.(guard.StepStore)
	bs, batches := s.(guard.BatchStore)
	switch {
	case steps && batches:
		return &stepBatchStore{w, stepsOf{w, ss}, batchesOf{w, bs}}
	case steps:
		return &stepStore{w, stepsOf{w, ss}}
	case batches:
		return &batchStore{w, batchesOf{w, bs}}
	}
	return w
}

type store struct {
	t *Tracer
	s guard.Store
}

// Unwrap returns the store being traced.
func (w *store) Unwrap() guard.Store { return w.s }

// HonoursDeadline implements guard.DeadlineStore by asking the store being
// traced: a span adds no wait.
func (w *store) HonoursDeadline() bool {
	ds, ok := w.s.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}

func (w *store) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	ctx, span := w.t.startCall(ctx, SpanClaim, req.Key, nil)
	defer span.End()
	out, err := w.s.Claim(ctx, req)
	w.t.claimed(span, req.Key, out, err)
	return out, err
}

// claimed records a claim's answer on its span.
func (t *Tracer) claimed(span trace.Span, key guard.Key, out guard.Outcome, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		t.failed(span, key, err)
		return
	}
	attrs := []attribute.KeyValue{Outcome.String(out.Status.String()), Replayed.Bool(out.Status == guard.Replay)}
	switch out.Status {
	case guard.Acquired:
		attrs = append(attrs, Attempt.Int(out.Lease.Attempt), Fence.Int64(out.Lease.Fence), Recovered.Bool(out.Lease.Recovered))
	case guard.InProgress:
		attrs = append(attrs, LeaseLeft.Int64(out.LeaseLeft.Milliseconds()))
	case guard.Exhausted:
		attrs = append(attrs, Attempt.Int(out.Attempts))
	case guard.Replay:
		attrs = append(attrs, ResultSize.Int(len(out.Result)))
	}
	span.SetAttributes(attrs...)
}

func (w *store) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	return w.t.write(ctx, SpanComplete, lease, func(ctx context.Context) error {
		return w.s.Complete(ctx, lease, result, ttl)
	}, ResultSize.Int(len(result)))
}

func (w *store) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	return w.t.write(ctx, SpanFail, lease, func(ctx context.Context) error {
		return w.s.Fail(ctx, lease, reason, ttl)
	})
}

func (w *store) Release(ctx context.Context, lease guard.Lease) error {
	return w.t.write(ctx, SpanRelease, lease, func(ctx context.Context) error {
		return w.s.Release(ctx, lease)
	})
}

func (w *store) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	return w.t.write(ctx, SpanExtend, lease, func(ctx context.Context) error {
		return w.s.Extend(ctx, lease, d)
	})
}

func (w *store) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	return w.s.Get(ctx, key)
}

// The traced stores of a guard.StepStore, a guard.BatchStore, and a store
// that is both: each is exactly what the store is.
type (
	stepStore struct {
		*store
		stepsOf
	}
	batchStore struct {
		*store
		batchesOf
	}
	stepBatchStore struct {
		*store
		stepsOf
		batchesOf
	}
)

var (
	_ guard.StepStore  = (*stepStore)(nil)
	_ guard.BatchStore = (*batchStore)(nil)
	_ guard.StepStore  = (*stepBatchStore)(nil)
	_ guard.BatchStore = (*stepBatchStore)(nil)
)

// stepsOf traces a StepStore's steps.
type stepsOf struct {
	w  *store
	ss guard.StepStore
}

// SaveStep implements guard.StepStore in a span.
func (s stepsOf) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return s.w.t.write(ctx, SpanStep, lease, func(ctx context.Context) error {
		return s.ss.SaveStep(ctx, lease, index, step)
	}, StepName.String(step.Name), StepIndex.Int(index), ResultSize.Int(len(step.Result)))
}

// KeepsSteps answers as the StepStore traced does (see guard.StepStore): a
// fallback.Store over a store keeping no steps keeps none through the
// traced store either, and guard.Step refuses before the step runs.
func (s stepsOf) KeepsSteps() bool { return guard.KeepsSteps(s.ss) }

// batchesOf traces a BatchStore's batches: a span per key.
type batchesOf struct {
	w  *store
	bs guard.BatchStore
}

// ClaimBatch implements guard.BatchStore: a SpanClaim per request.
func (b batchesOf) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	spans := make([]trace.Span, len(reqs))
	for i := range reqs {
		_, spans[i] = b.w.t.start(ctx, SpanClaim, reqs[i].Key, nil)
	}
	defer endSpans(spans)
	out, errs := b.bs.ClaimBatch(ctx, reqs)
	for i, span := range spans {
		b.w.t.claimed(span, reqs[i].Key, out[i], errs[i])
	}
	return out, errs
}

// writeSpans names the span of each kind of write.
var writeSpans = map[guard.WriteKind]string{
	guard.WriteComplete: SpanComplete, guard.WriteFail: SpanFail, guard.WriteRelease: SpanRelease, guard.WriteExtend: SpanExtend,
}

// WriteBatch implements guard.BatchStore: a span per write, named for its
// kind.
func (b batchesOf) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	spans := make([]trace.Span, len(ws))
	for i := range ws {
		var attrs []attribute.KeyValue
		if ws[i].Kind == guard.WriteComplete {
			attrs = []attribute.KeyValue{ResultSize.Int(len(ws[i].Result))}
		}
		name, ok := writeSpans[ws[i].Kind]
		if !ok {
			name = "idemguard." + ws[i].Kind.String()
		}
		_, spans[i] = b.w.t.start(ctx, name, ws[i].Lease.Key, &ws[i].Lease, attrs...)
	}
	defer endSpans(spans)
	errs := b.bs.WriteBatch(ctx, ws)
	for i, span := range spans {
		b.w.t.wrote(span, ws[i].Lease.Key, errs[i])
	}
	return errs
}

// endSpans ends a batch's spans, also when the store panics.
func endSpans(spans []trace.Span) {
	for _, span := range spans {
		span.End()
	}
}

// Func returns fn with a span around each run (SpanEffect, an internal
// span), a child of the span in Do's context: the lease's attempt and
// fence, whether it was recovered, the result's size, and for an error
// the outcome "error" ("rejected" for guard.ErrRejected) with an error
// status. When the effect's context ended because the lease was lost (or
// MaxRun passed), LeaseLost is true. An effect that panics gets an error
// status, and the panic goes on.
func (t *Tracer) Func(fn guard.Func) guard.Func {
	if fn == nil {
		panic("otelx: nil guard.Func")
	}
	return func(ctx context.Context, lease guard.Lease) (value []byte, err error) {
		ctx, span := t.tracer.Start(ctx, SpanEffect)
		recording := span.IsRecording() // only then are the attributes made (see start)
		if recording {
			span.SetAttributes(t.keyAttrs(lease.Key, Attempt.Int(lease.Attempt), Fence.Int64(lease.Fence), Recovered.Bool(lease.Recovered))...)
		}
		returned := false
		defer func() {
			if !returned {
				span.SetAttributes(Outcome.String("panic"))
				span.SetStatus(codes.Error, "the effect did not return (panic or runtime.Goexit)")
			}
			span.End()
		}()
		value, err = fn(ctx, lease)
		returned = true
		if !recording {
			return value, err
		}
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
			span.SetAttributes(LeaseLost.Bool(true))
		}
		switch {
		case errors.Is(err, guard.ErrRejected):
			span.SetAttributes(Outcome.String("rejected"))
		case err != nil:
			t.failed(span, lease.Key, err)
		default:
			span.SetAttributes(Outcome.String("ok"), ResultSize.Int(len(value)))
		}
		return value, err
	}
}

// Observe makes t a guard.Observer: each event becomes a span event named
// "idemguard.<kind>" (guard.EventKind's name) on the span in ctx, with the
// key's digest, the attempt and, for failures, the error's text (the key
// replaced by its digest). The span also gets Outcome (the kind) and, on
// acquired and replayed, Replayed. A ctx without a recording span costs a
// lookup and nothing else.
//
// A span that hears of more than one key (the span of a DoBatch's
// caller, a consumer's batch; or one over several Do calls) is a batch's:
// from the second key on, Outcome and Replayed would be the last key's,
// and the events of a batch of a few hundred keys would pass the SDK's
// limit of 128 events a span, which then drops the oldest. Such a span
// gets instead Keys (how many keys it heard of), KeysWith(kind) for each
// kind some key ended with (the count of keys whose last event was of
// that kind: "idemguard.keys.completed" = 290, "idemguard.keys.failed" =
// 10), Outcome the kind every key ended with, or "mixed", and Replayed
// true only when every key replayed. Its events, past the first key's,
// are only those of keys that did not go the common way (acquired,
// replayed, completed): recovered, in_progress, mismatch, exhausted,
// failed, released, lease_lost, unavailable, corrupt; at most
// MaxKeyEvents of them, the rest counted in EventsOmitted. Every key's
// detail is in the spans of Tracer.Store, a claim and a write span per
// key, children of the same span: events on one span are for what stands
// out in it, and span counts are bounded by the SDK's span processors,
// not by a span's limit of events. The Observer keeps what a span heard
// (a key and its last kind, per key once it heard of two) until the span
// has ended; but once a span has heard of maxKeyEntries (4096) keys, the
// entry of a key whose outcome is known (its last kind is one other than
// acquired) is let go, its count kept, so a long batch's span holds an
// entry per key still running, not per key it heard of. Past that bound a
// key heard of again after its entry was let go (a call of Do again on a
// key of the batch) counts in Keys again.
func (t *Tracer) Observe(ctx context.Context, e guard.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if sk := t.keysOf(span); sk != nil {
		sk.mu.Lock()
		defer sk.mu.Unlock()
		if sk.heard(e) {
			t.observeBatch(span, sk, e)
			return
		}
	}
	t.addEvent(span, e)
	kind := e.Kind.String()
	switch e.Kind {
	case guard.EventAcquired:
		span.SetAttributes(Outcome.String(kind), Replayed.Bool(false))
	case guard.EventReplayed:
		span.SetAttributes(Outcome.String(kind), Replayed.Bool(true))
	case guard.EventRecovered:
		span.SetAttributes(Recovered.Bool(true))
	default:
		span.SetAttributes(Outcome.String(kind))
	}
}

// addEvent adds e to span as an event.
func (t *Tracer) addEvent(span trace.Span, e guard.Event) {
	attrs := t.keyAttrs(e.Key)
	if e.Attempt > 0 {
		attrs = append(attrs, Attempt.Int(e.Attempt))
	}
	if e.Err != nil {
		attrs = append(attrs, attribute.String("idemguard.error", t.redact(e.Err.Error(), e.Key)))
	}
	span.AddEvent("idemguard."+e.Kind.String(), trace.WithAttributes(attrs...))
}

// observeBatch records e on span, which has heard of more than one key
// (sk, which heard e, under its lock): see Observe.
func (t *Tracer) observeBatch(span trace.Span, sk *spanKeys, e guard.Event) {
	switch e.Kind {
	case guard.EventAcquired, guard.EventReplayed, guard.EventCompleted:
	case guard.EventRecovered:
		span.SetAttributes(Recovered.Bool(true))
		fallthrough
	default:
		if sk.events < MaxKeyEvents {
			sk.events++
			t.addEvent(span, e)
		} else {
			sk.omitted++
			span.SetAttributes(EventsOmitted.Int(sk.omitted))
		}
	}
	n := sk.keys
	attrs := make([]attribute.KeyValue, 0, len(sk.counts)+3)
	attrs = append(attrs, Keys.Int(n))
	outcome := "mixed"
	for k, c := range sk.counts {
		if sk.changed&(1<<k) != 0 {
			attrs = append(attrs, KeysWith(guard.EventKind(k)).Int(c))
		}
		if c == n {
			outcome = guard.EventKind(k).String()
		}
	}
	sk.changed = 0
	attrs = append(attrs, Outcome.String(outcome), Replayed.Bool(sk.counts[guard.EventReplayed] == n))
	span.SetAttributes(attrs...)
}

// spanKeys is what the Observer heard of the keys of one recording span.
type spanKeys struct {
	span trace.Span // to tell when it has ended
	mu   sync.Mutex
	// first is the first key heard of (seen: there is one), firstKind its
	// last outcome (an event's kind other than recovered), while no
	// other key was.
	seen      bool
	first     guard.Key
	firstKind guard.EventKind
	// last is each key's last outcome once a second key was heard of
	// (let go once known, past maxKeyEntries: sweep); keys counts the keys
	// heard of, counts[k] the keys whose last outcome is k, changed the
	// counts changed since the span last got them (a bit per kind).
	last            map[guard.Key]guard.EventKind
	keys            int
	sweepAt         int // last is swept when it holds that many, at least maxKeyEntries
	counts          [numKinds]int
	changed         uint32
	events, omitted int // the events added past the first key's, and left out
}

// maxKeyEntries is how many keys a span's entries may hold before those
// whose outcome is known are let go (sweep).
const maxKeyEntries = 1 << 12

// sweep lets go of the entries of keys whose outcome is known (any kind
// but acquired: a key heard of with no outcome yet, or acquired and still
// running, keeps its entry) once last holds sweepAt, at least
// maxKeyEntries: they stay in counts and keys. The next sweep comes when
// last has doubled, so a span's entries are at most twice its keys still
// running, or maxKeyEntries, and the sweeps cost O(1) a key.
func (sk *spanKeys) sweep() {
	if len(sk.last) < max(sk.sweepAt, maxKeyEntries) {
		return
	}
	for k, kind := range sk.last {
		if kind != 0 && kind != guard.EventAcquired {
			delete(sk.last, k)
		}
	}
	sk.sweepAt = 2 * len(sk.last)
}

// numKinds bounds guard.EventKind's values.
const numKinds = 32

// heard records e of sk's span and reports whether the span has heard of
// more than one key.
func (sk *spanKeys) heard(e guard.Event) bool {
	outcome := e.Kind != guard.EventRecovered && int(e.Kind) < numKinds
	switch {
	case sk.last != nil:
	case !sk.seen:
		sk.seen, sk.first = true, e.Key
		fallthrough
	case sk.first == e.Key:
		if outcome {
			sk.firstKind = e.Kind
		}
		return false
	default:
		sk.last = map[guard.Key]guard.EventKind{sk.first: sk.firstKind}
		sk.keys = 1
		if sk.firstKind != 0 {
			sk.counts[sk.firstKind]++
			sk.changed |= 1 << sk.firstKind
		}
	}
	old, known := sk.last[e.Key]
	if !known {
		sk.keys++
	}
	switch {
	case !outcome && known:
		return true
	case !outcome:
		sk.last[e.Key] = 0 // a key heard of, no outcome yet
	default:
		if old != 0 {
			sk.counts[old]--
			sk.changed |= 1 << old
		}
		sk.last[e.Key] = e.Kind
		sk.counts[e.Kind]++
		sk.changed |= 1 << e.Kind
	}
	sk.sweep()
	return true
}

// spanShards spread the spans the Observer keeps track of, so that
// concurrent requests' events seldom wait for one another.
const spanShards = 16

// Bounds of a shard's spans: swept (the ended ones let go) when it holds
// twice as many as after the last sweep, at least minSweep, at most
// maxSpans; while a sweep leaves maxSpans live (spans never ended), a new
// span is not tracked and gets every event as a span of one key does, and
// the full shard is swept again once a quarter of maxSpans were refused
// so.
const (
	minSweep = 64
	maxSpans = 1 << 14
)

type spanID struct {
	trace trace.TraceID
	span  trace.SpanID
}

type spanShard struct {
	mu      sync.Mutex
	spans   map[spanID]*spanKeys
	sweepAt int
	full    bool // the last sweep left maxSpans live
	refused int  // spans not tracked since the last sweep
}

// keysOf returns what the Observer heard of span's keys, nil when span is
// not tracked (no valid span context, or too many spans live).
func (t *Tracer) keysOf(span trace.Span) *spanKeys {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return nil
	}
	id := spanID{sc.TraceID(), sc.SpanID()}
	sh := &t.shards[id.span[7]%spanShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sk, ok := sh.spans[id]; ok {
		return sk
	}
	if sh.spans == nil {
		sh.spans, sh.sweepAt = map[spanID]*spanKeys{}, minSweep
	}
	if len(sh.spans) >= sh.sweepAt && (!sh.full || sh.refused >= maxSpans/4) {
		for k, sk := range sh.spans {
			if !sk.span.IsRecording() { // ended
				delete(sh.spans, k)
			}
		}
		sh.sweepAt, sh.refused = min(maxSpans, max(minSweep, 2*len(sh.spans))), 0
		sh.full = len(sh.spans) >= maxSpans
	}
	if len(sh.spans) >= maxSpans {
		sh.refused++
		return nil
	}
	sk := &spanKeys{span: span}
	sh.spans[id] = sk
	return sk
}
