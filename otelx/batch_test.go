package otelx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/otelx"
)

// TestBatchOnCallerSpan: a DoBatch of 300 keys under a consumer's span,
// with the Tracer as the guard's Observer. The span says what became of
// the batch: its size (Keys), how many keys ended each way (KeysWith),
// Outcome "mixed" (not the last item's) and Replayed false (some ran);
// it carries at most MaxKeyEvents events past the first key's, only of
// keys that did not go the common way (acquired, replayed, completed),
// the others counted in EventsOmitted, and the SDK drops none. (Every
// item's events went to the span: past 128 the SDK dropped them, and
// Outcome was the last item's.) Run one at a time and eight at once.
func TestBatchOnCallerSpan(t *testing.T) {
	const n, replays = 300, 20
	for _, tc := range []struct {
		name        string
		concurrency int
		fails       func(i int) bool
	}{
		{"few failures", 1, func(i int) bool { return i%10 == 9 }},
		{"many failures", 1, func(i int) bool { return i%3 == 0 }},
		{"many failures, concurrent", 8, func(i int) bool { return i%3 == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			tr := otelx.New(otelx.Options{TracerProvider: tp})
			g := guard.New(tr.Store(memstore.New(memstore.Options{})), guard.Options{Observer: tr})
			items := make([]guard.BatchItem, n)
			for i := range items {
				items[i] = guard.BatchItem{Key: guard.Key{Scope: "orders", ID: fmt.Sprintf("%s-%d", secretID, i)}, Fingerprint: "fp"}
			}
			ctx := context.Background()
			for i := range replays { // delivered before: replayed
				if _, err := g.Do(ctx, items[i].Key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }); err != nil {
					t.Fatal(err)
				}
			}
			want := map[guard.EventKind]int{guard.EventReplayed: replays}
			for i := replays; i < n; i++ {
				if tc.fails(i) {
					want[guard.EventFailed]++
				} else {
					want[guard.EventCompleted]++
				}
			}
			sctx, span := tp.Tracer("test").Start(ctx, "consume")
			g.DoBatch(sctx, items, func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
				if tc.fails(i) {
					return nil, errors.New("declined")
				}
				return []byte("done"), nil
			}, guard.BatchOptions{Concurrency: tc.concurrency})
			span.End()

			var consume *tracetest.SpanStub
			for _, s := range exp.GetSpans() {
				if s.Name == "consume" {
					consume = &s
				}
			}
			if consume == nil {
				t.Fatal("no consume span")
			}
			got := attrs(consume.Attributes)
			check := func(kv attribute.KeyValue) {
				t.Helper()
				if v, ok := got[kv.Key]; !ok || v != kv.Value {
					t.Errorf("%s = %s (present %v), want %s", kv.Key, v.String(), ok, kv.Value.String())
				}
			}
			check(otelx.Keys.Int(n))
			for k, c := range want {
				check(otelx.KeysWith(k).Int(c))
			}
			check(otelx.Outcome.String("mixed"))
			check(otelx.Replayed.Bool(false))
			if consume.DroppedEvents != 0 {
				t.Errorf("the SDK dropped %d events of the span", consume.DroppedEvents)
			}
			// Past the first key's events, only those of keys that went
			// otherwise, at most MaxKeyEvents.
			names := map[string]int{}
			for _, e := range consume.Events[min(len(consume.Events), 1):] { // item 0's claim: replayed
				names[e.Name]++
			}
			if names["idemguard.acquired"]+names["idemguard.completed"]+names["idemguard.replayed"] > 0 {
				t.Errorf("events of keys that went the common way: %v", names)
			}
			failed := want[guard.EventFailed]
			kept := min(failed, otelx.MaxKeyEvents)
			if names["idemguard.failed"] != kept || len(consume.Events) > 1+otelx.MaxKeyEvents {
				t.Errorf("%d events %v; want item 0's and %d of the %d failures", len(consume.Events), names, kept, failed)
			}
			if failed > kept {
				check(otelx.EventsOmitted.Int(failed - kept))
			}
			for _, s := range exp.GetSpans() {
				for _, kv := range s.Attributes {
					if strings.Contains(kv.Value.String(), secretID) {
						t.Errorf("%s %s carries the raw key", s.Name, kv.Key)
					}
				}
				for _, e := range s.Events {
					for _, kv := range e.Attributes {
						if strings.Contains(kv.Value.String(), secretID) {
							t.Errorf("%s event %s %s carries the raw key", s.Name, e.Name, kv.Key)
						}
					}
				}
			}
		})
	}
}
