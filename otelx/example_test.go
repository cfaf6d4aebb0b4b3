package otelx_test

import (
	"context"
	"errors"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/otelx"
)

// One Tracer traces the store's calls (Store), the effect (Func) and marks
// the request's span with the guard's events (it is a guard.Observer).
// Here the spans go to the SDK's in-memory recorder; a service passes its
// TracerProvider, or none for the global one.
func ExampleNew() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	tr := otelx.New(otelx.Options{TracerProvider: tp})
	g := guard.New(tr.Store(memstore.New(memstore.Options{})), guard.Options{Observer: tr})
	charge := tr.Func(func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		return []byte(`{"charge":"ch_1"}`), nil
	})

	key := guard.Key{Scope: "acct_42 POST /charges", ID: "order-7"}
	for range 2 { // the second call is a replay
		ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
		if _, err := g.Do(ctx, key, "fingerprint", charge); err != nil {
			fmt.Println(err)
		}
		span.End()
	}
	for _, s := range rec.Ended() {
		line := s.Name()
		for _, kv := range s.Attributes() {
			if kv.Key == otelx.Outcome || kv.Key == otelx.Replayed {
				line += fmt.Sprintf(" %s=%s", kv.Key, kv.Value.String())
			}
		}
		fmt.Println(line)
	}
	// Output:
	// idemguard.claim idemguard.outcome=acquired idemguard.replayed=false
	// idemguard.effect idemguard.outcome=ok
	// idemguard.complete idemguard.outcome=ok
	// POST /charges idemguard.outcome=completed idemguard.replayed=false
	// idemguard.claim idemguard.outcome=replay idemguard.replayed=true
	// POST /charges idemguard.outcome=replayed idemguard.replayed=true
}

// Store alone, under a guard the service already has: spans for the
// guard's store calls, children of the caller's span.
func ExampleTracer_Store() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	store := otelx.New(otelx.Options{TracerProvider: tp}).Store(memstore.New(memstore.Options{}))
	_, isStepStore := store.(guard.StepStore)
	g := guard.New(store, guard.Options{})
	out, _ := g.Claim(context.Background(), guard.Key{Scope: "jobs", ID: "job-1"}, "fp")
	_ = g.Release(context.Background(), out.Lease)
	for _, s := range rec.Ended() {
		fmt.Println(s.Name())
	}
	fmt.Println("steps still work:", isStepStore)
	// Output:
	// idemguard.claim
	// idemguard.release
	// steps still work: true
}

// Func alone: a span around each run of the effect, with its attempt and
// fence, and an error status when it fails.
func ExampleTracer_Func() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	tr := otelx.New(otelx.Options{TracerProvider: tp})
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	_, err := g.Do(context.Background(), guard.Key{Scope: "jobs", ID: "job-1"}, "fp",
		tr.Func(func(ctx context.Context, lease guard.Lease) ([]byte, error) {
			return nil, errors.New("bank declined")
		}))
	fmt.Println(err)
	s := rec.Ended()[0]
	fmt.Println(s.Name(), s.Status().Code, s.Status().Description)
	// Output:
	// bank declined
	// idemguard.effect Error bank declined
}

// The Tracer as a guard.Observer: the guard's events on the caller's span.
func ExampleTracer_Observe() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	tr := otelx.New(otelx.Options{TracerProvider: tp})
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{Observer: tr})
	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /charges")
	_, _ = g.Do(ctx, guard.Key{Scope: "charges", ID: "order-7"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("ok"), nil
	})
	span.End()
	for _, e := range rec.Ended()[0].Events() {
		fmt.Println(e.Name)
	}
	// Output:
	// idemguard.acquired
	// idemguard.completed
}
