package otelx

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemguard/idemguard/guard"
)

// liveSpan is a recording span until ended is set, with the span context
// given: a request stuck, or a span some instrumentation forgot to end.
type liveSpan struct {
	noop.Span
	sc    trace.SpanContext
	ended *atomic.Bool
}

func (s liveSpan) SpanContext() trace.SpanContext { return s.sc }
func (s liveSpan) IsRecording() bool              { return !s.ended.Load() }

// shard0Span returns span number i of a trace whose span IDs all fall in
// shard 0.
func shard0Span(i int, ended *atomic.Bool) liveSpan {
	var sid trace.SpanID
	binary.BigEndian.PutUint32(sid[:4], uint32(i+1)) // sid[7] == 0
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return liveSpan{sc: sc, ended: ended}
}

// TestLiveSpansBoundedByMaxSpans: spans that never end are tracked at most
// maxSpans at once per shard (the bound once held only at the sweep that
// first reached it: the shard then grew to twice, four times maxSpans...),
// and a shard full of them takes new spans again once they end.
func TestLiveSpansBoundedByMaxSpans(t *testing.T) {
	tr := New(Options{})
	var ended atomic.Bool
	const n = 4 * maxSpans
	for i := range n {
		ctx := trace.ContextWithSpan(context.Background(), shard0Span(i, &ended))
		tr.Observe(ctx, guard.Event{Kind: guard.EventAcquired, Key: guard.Key{Scope: "s", ID: "k"}})
	}
	if got := len(tr.shards[0].spans); got > maxSpans {
		t.Fatalf("shard 0 tracks %d live spans after %d were observed, want at most maxSpans = %d", got, n, maxSpans)
	}

	ended.Store(true)
	var still atomic.Bool
	tracked := false
	for i := n; i < n+maxSpans/4+1 && !tracked; i++ {
		tracked = tr.keysOf(shard0Span(i, &still)) != nil
	}
	if !tracked {
		t.Errorf("shard 0 still refuses new spans after its %d spans ended", maxSpans)
	}
}

// TestEndedSpansSweptBeforeRefusing: a shard of maxSpans/2 live spans and
// as many ended ones is swept when it reaches maxSpans, and takes a new
// span: a first version of the bound refused it (found by review).
func TestEndedSpansSweptBeforeRefusing(t *testing.T) {
	tr := New(Options{})
	var live, ended atomic.Bool
	for i := range maxSpans / 2 {
		tr.keysOf(shard0Span(i, &live))
	}
	for i := maxSpans / 2; i < maxSpans; i++ {
		tr.keysOf(shard0Span(i, &ended))
	}
	ended.Store(true) // half of the shard's spans ended
	if tr.keysOf(shard0Span(maxSpans, &live)) == nil {
		t.Fatalf("a new span refused with %d of shard 0's %d spans ended", maxSpans/2, len(tr.shards[0].spans))
	}
}
