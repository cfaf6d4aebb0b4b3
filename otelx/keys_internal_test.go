package otelx

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemguard/idemguard/guard"
)

// TestObservedSpansLetGoOnceEnded: what the Observer keeps of a span's
// keys is let go once the span has ended (a service's requests would
// otherwise each leave it behind), and kept while the span lives, however
// many spans end meanwhile: a batch's span that hears of its second key
// after 5000 requests' spans ended still counts two keys.
func TestObservedSpansLetGoOnceEnded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := New(Options{TracerProvider: tp})
	ctx := context.Background()
	bctx, batch := tp.Tracer("test").Start(ctx, "batch")
	tr.Observe(bctx, guard.Event{Kind: guard.EventAcquired, Key: guard.Key{Scope: "s", ID: "b-1"}})
	const requests = 5000
	for i := range requests {
		rctx, req := tp.Tracer("test").Start(ctx, "request")
		tr.Observe(rctx, guard.Event{Kind: guard.EventAcquired, Key: guard.Key{Scope: "s", ID: fmt.Sprint("r-", i)}})
		req.End()
	}
	tr.Observe(bctx, guard.Event{Kind: guard.EventAcquired, Key: guard.Key{Scope: "s", ID: "b-2"}})
	batch.End()
	kept := 0
	for i := range tr.shards {
		kept += len(tr.shards[i].spans)
	}
	if kept > spanShards*minSweep {
		t.Errorf("%d spans kept after %d ended, want at most %d", kept, requests, spanShards*minSweep)
	}
	for _, s := range rec.Ended() {
		if s.Name() != "batch" {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == Keys && kv.Value.AsInt64() == 2 {
				return
			}
		}
		t.Errorf("the batch's span: %v; want %s = 2", s.Attributes(), Keys)
	}
}
