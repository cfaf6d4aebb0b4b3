package otelx_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/otelx"
)

// TestLongBatchSpanMemoryBounded: a span that hears of 100,000 keys (a
// consumer's span over a long batch), each claimed and completed, 2,000
// running at a time, does not keep an entry per key while it lives: the
// heap grows by under 2 MB (0.8 MB: an entry per key running, up to a few
// thousand), and the span's counts are still right. (It kept
// every key and its last kind until the span ended: 7.7 MB for 100,000
// keys, growing with every key.)
func TestLongBatchSpanMemoryBounded(t *testing.T) {
	const n, limit = 100_000, 2 << 20
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := otelx.New(otelx.Options{TracerProvider: tp})
	ctx, span := tp.Tracer("test").Start(context.Background(), "consume")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	// 2,000 keys running at a time: each is completed once 2,000 more
	// were claimed, so running keys keep their entries through sweeps.
	const running = 2000
	key := func(i int) guard.Key { return guard.Key{Scope: "orders", ID: fmt.Sprintf("order-%07d", i)} }
	for i := range n + running {
		if i < n {
			tr.Observe(ctx, guard.Event{Kind: guard.EventAcquired, Key: key(i), Attempt: 1})
		}
		if i >= running {
			tr.Observe(ctx, guard.Event{Kind: guard.EventCompleted, Key: key(i - running), Attempt: 1})
		}
	}
	grown := int64(heap()) - int64(before)
	runtime.KeepAlive(tr)
	span.End()
	t.Logf("the heap grew %d KB over %d keys of a live span", grown>>10, n)
	if grown > limit {
		t.Errorf("the heap grew %d KB over %d keys of a live span; want under %d KB", grown>>10, n, limit>>10)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	got := attrs(spans[0].Attributes)
	for _, kv := range []attribute.KeyValue{otelx.Keys.Int(n), otelx.KeysWith(guard.EventCompleted).Int(n), otelx.KeysWith(guard.EventAcquired).Int(0)} {
		if v, ok := got[kv.Key]; !ok || v != kv.Value {
			t.Errorf("%s = %s (present %v), want %s", kv.Key, v.String(), ok, kv.Value.String())
		}
	}
	if v := got[otelx.Outcome]; v.AsString() != "completed" {
		t.Errorf("%s = %q, want completed", otelx.Outcome, v.AsString())
	}
}
