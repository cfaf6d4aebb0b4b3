package httpx_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestNestedGuard: a Guard inside a Guard of the same guard.Guard (a
// router-wide guard and a route's own, or the middleware applied twice)
// runs the handler once under the outer claim and the retry replays its
// answer. The inner one used to meet the outer's claim as a request in
// flight: its 409 became the key's stored answer, for the whole TTL, and
// the handler never ran. An inner guard that keys the request otherwise
// (here by a body field) still claims its own key.
func TestNestedGuard(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	idem := httpx.Guard(e.g, opts)
	srv, c := serve(t, idem(idem(h)))
	for i := range 2 {
		r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-1"}`, key("nest-1")...)
		if r.status != http.StatusCreated || string(r.body) != "placed" || r.replayed() != (i == 1) {
			t.Fatalf("request %d through two guards: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}

	// Keyed otherwise inside: two claims, two keys, one run.
	byBody := opts
	byBody.Key = httpx.KeyFromBody("/order")
	srv2, c2 := serve(t, idem(httpx.Guard(e.g, byBody)(h)))
	for i := range 2 {
		r := do(t, c2, "POST", srv2.URL+"/orders", `{"order":"o-2"}`, key("nest-2")...)
		if r.status != http.StatusCreated || r.replayed() != (i == 1) {
			t.Fatalf("request %d through a header guard and a body-key guard: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times in all, want 2", n)
	}
}

// TestNestedGuardsOneStore: a router-wide Guard and a route's own, of two
// guard.Guard values over one store (a route that needs its own TTL needs
// a Guard of its own), key a plain route alike ("POST /charges": the
// escaped path outside the mux, the pattern inside). The inner one met the
// outer's claim as a request in flight: its 409 became the key's stored
// answer, replayed for the whole TTL, and the handler never ran. It now
// runs once under the outer claim, as under one guard.Guard; so it does
// when each Guard's store is wrapped on its own (guard.New(tracer.Store(s))
// written twice), which it took for two stores.
func TestNestedGuardsOneStore(t *testing.T) {
	e := newEnv(t, guard.Options{})
	for name, stores := range map[string][2]guard.Store{
		"one store value":         {e.store, e.store},
		"each wrapped on its own": {&traced{&traced{e.store}}, &traced{e.store}},
	} {
		t.Run(name, func(t *testing.T) {
			outer := guard.New(stores[0], guard.Options{})
			route := guard.New(stores[1], guard.Options{TTL: time.Hour})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte("charged"))
			})
			opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
			mux := http.NewServeMux()
			mux.Handle("POST /charges", httpx.Guard(route, opts)(h))
			srv, c := serve(t, httpx.Guard(outer, opts)(mux))
			for i := range 2 {
				r := do(t, c, "POST", srv.URL+"/charges", `{"amount":5}`, key("nest-3/"+strings.ReplaceAll(name, " ", "-"))...)
				if r.status != http.StatusCreated || string(r.body) != "charged" || r.replayed() != (i == 1) {
					t.Fatalf("request %d through a router's and a route's Guard over one store: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
		})
	}
}

// traced wraps a store as a tracing or metrics wrapper does (otelx's):
// every call goes to the store it wraps, which it names with Unwrap.
type traced struct{ guard.Store }

func (t *traced) Unwrap() guard.Store { return t.Store }

// heldRuns counts a handler's runs and holds its first one (entered
// closed) until release is closed.
type heldRuns struct {
	atomic.Int64
	entered chan struct{}
}

// nestedOrders serves POST /orders behind an outer Guard keyed by the
// Idempotency-Key header around an inner one keyed by the body's "order"
// (with wait as its Options.Wait), both on e.g; the handler answers 201
// "placed", its first run held until release is closed.
func nestedOrders(t *testing.T, e *env, wait time.Duration) (*httptest.Server, *http.Client, *heldRuns, chan struct{}) {
	runs, release := &heldRuns{entered: make(chan struct{})}, make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(runs.entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	byBody := opts
	byBody.Key = httpx.KeyFromBody("/order")
	byBody.Wait = wait
	srv, c := serve(t, httpx.Guard(e.g, opts)(httpx.Guard(e.g, byBody)(h)))
	return srv, c, runs, release
}

// TestNestedGuardInFlightNotStored: an inner Guard keyed otherwise (by a
// body field) that finds its key in flight answers 409, a "retry later";
// the outer Guard must not keep that as its own key's answer. It did: the
// second client's retries with its header key got the 409 replayed for the
// whole TTL, and its order never ran. Now the outer releases its key, and
// the retry runs (here a replay of the order, by its body key).
func TestNestedGuardInFlightNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	srv, c, runs, release := nestedOrders(t, e, 0)
	first := make(chan reply, 1)
	go func() { first <- do(t, c, "POST", srv.URL+"/orders", `{"order":"o-3"}`, key("client-a")...) }()
	<-runs.entered
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-3"}`, key("client-b")...)
	if r.status != http.StatusConflict {
		t.Fatalf("a second client's copy while the order runs: %d %q, want 409", r.status, r.body)
	}
	close(release)
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("first: %d %q", a.status, a.body)
	}
	r = do(t, c, "POST", srv.URL+"/orders", `{"order":"o-3"}`, key("client-b")...)
	if r.status != http.StatusCreated || string(r.body) != "placed" {
		t.Fatalf("the second client's retry once the order ran: %d replayed %v %q, want the order's 201", r.status, r.replayed(), r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestNestedGuardsThreeInFlightNotStored: three Guards over one store (a
// router's by Idempotency-Key, a route group's by another header, a
// route's by a body field). When the innermost answers 409 (its key in
// flight), the middle one releases its key, and so must the outermost: it
// stored the 409 as its key's answer for the TTL, and the client's retries
// with that key got it replayed though the handler never ran for them.
func TestNestedGuardsThreeInFlightNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	base := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	group, route := base, base
	group.Header = "X-Group-Key"
	route.Key = httpx.KeyFromBody("/order")
	srv, c := serve(t, httpx.Guard(e.g, base)(httpx.Guard(e.g, group)(httpx.Guard(e.g, route)(h))))

	first := make(chan reply, 1)
	go func() {
		first <- do(t, c, "POST", srv.URL+"/orders", `{"order":"o-1"}`, with(key("k1"), []string{"X-Group-Key", "g1"})...)
	}()
	<-entered
	// New router and group keys, the order the first request holds: the
	// route's Guard answers 409.
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-1"}`, with(key("k2"), []string{"X-Group-Key", "g2"})...)
	close(release)
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("first: %d %q", a.status, a.body)
	}
	if r.status != http.StatusConflict {
		t.Fatalf("a copy while the order runs: %d %q, want the route's 409", r.status, r.body)
	}
	r = do(t, c, "POST", srv.URL+"/orders", `{"order":"o-1"}`, with(key("k2"), []string{"X-Group-Key", "g2"})...)
	if r.status != http.StatusCreated || string(r.body) != "placed" {
		t.Fatalf("the copy's retry once the order ran: %d replayed %v %q, want the order's 201", r.status, r.replayed(), r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestNestedGuardClientLeftNotStored: an inner Guard (keyed by a body
// field, with Wait) whose client leaves while it waits for its key's first
// request answers nothing; the outer Guard stored that as a 200 without a
// body, its key's final answer though nothing ran. Now it releases its key,
// and the client's retry gets the order's answer.
func TestNestedGuardClientLeftNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	srv, c, runs, release := nestedOrders(t, e, time.Minute)
	first := make(chan reply, 1)
	go func() { first <- do(t, c, "POST", srv.URL+"/orders", `{"order":"o-4"}`, key("client-c")...) }()
	<-runs.entered

	// A second client's copy waits in the inner Guard (its polls reach
	// Redis), then its client leaves.
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	before := e.commands.n.Load()
	go func() {
		_, err := send(ctx, c, "POST", srv.URL+"/orders", `{"order":"o-4"}`, key("client-d")...)
		left <- err
	}()
	testenv.WaitFor(t, 10*time.Second, "the copy to wait, polling the order's record", func() bool { return e.commands.n.Load() >= before+4 })
	cancel()
	<-left
	testenv.WaitFor(t, 10*time.Second, "the outer Guard to end the copy's claim", func() bool {
		rec, err := e.store.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "client-d"})
		return errors.Is(err, guard.ErrNotFound) || (err == nil && rec.State != guard.StatePending)
	})
	close(release)
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("first: %d %q", a.status, a.body)
	}
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-4"}`, key("client-d")...)
	if r.status != http.StatusCreated || string(r.body) != "placed" {
		t.Fatalf("the retry of the copy whose client left: %d replayed %v %q, want the order's 201", r.status, r.replayed(), r.body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// heldClaims is a store whose claims wait, once sent, until release is
// closed: the window between a claim and its answer, held open.
type heldClaims struct {
	guard.Store
	sent    chan struct{}
	release chan struct{}
}

func (s heldClaims) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.sent <- struct{}{}
	<-s.release
	return s.Store.Claim(ctx, req)
}

// TestNestedGuardClientLeftDuringClaim: the client of a request leaves
// while an inner Guard's claim is under way; the inner Guard then releases
// the key it got and answers nothing. The outer Guard stored that as a 200
// without a body, its key's final answer though nothing ran. Now it
// releases its key, and the client's retry runs the handler.
func TestNestedGuardClientLeftDuringClaim(t *testing.T) {
	e := newEnv(t, guard.Options{})
	inner := heldClaims{Store: e.store, sent: make(chan struct{}, 1), release: make(chan struct{})}
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	byBody := opts
	byBody.Key = httpx.KeyFromBody("/order")
	var reqCtx atomic.Value // the request's context, as the inner Guard sees it
	mid := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reqCtx.Store(r.Context())
			next.ServeHTTP(w, r)
		})
	}
	srv, c := serve(t, httpx.Guard(e.g, opts)(mid(httpx.Guard(guard.New(inner, guard.Options{}), byBody)(h))))
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := send(ctx, c, "POST", srv.URL+"/orders", `{"order":"o-5"}`, key("client-e")...)
		left <- err
	}()
	<-inner.sent
	cancel()
	<-left
	<-reqCtx.Load().(context.Context).Done() // the server saw the client go
	close(inner.release)
	testenv.WaitFor(t, 10*time.Second, "the outer Guard to end the request's claim", func() bool {
		rec, err := e.store.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "client-e"})
		return errors.Is(err, guard.ErrNotFound) || (err == nil && rec.State != guard.StatePending)
	})
	go func() {
		for range inner.sent { // the retry's claims go through
		}
	}()
	defer close(inner.sent)
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-5"}`, key("client-e")...)
	if r.status != http.StatusCreated || string(r.body) != "placed" || runs.Load() != 1 {
		t.Fatalf("the retry of a request whose client left during the inner claim: %d replayed %v %q, runs %d; want the handler's 201, run once",
			r.status, r.replayed(), r.body, runs.Load())
	}
}

// TestNestedGuardUnavailableNotStored: an inner Guard whose store cannot
// be reached answers 503, "retry later"; an outer Guard that keeps 5xx
// answers (Store5xx) stored it as its key's final answer. Now it releases
// its key.
func TestNestedGuardUnavailableNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	innerGuard := guard.New(guard.NewRedisStore(down, guard.RedisOptions{}), guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	opts := httpx.Options{SingleCaller: true, Store5xx: true, Logger: testenv.Logger(t)}
	byBody := httpx.Options{SingleCaller: true, Key: httpx.KeyFromBody("/order"), Logger: testenv.Logger(t)}
	srv, c := serve(t, httpx.Guard(e.g, opts)(httpx.Guard(innerGuard, byBody)(h)))
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-6"}`, key("client-f")...)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("inner store down: %d %q, want 503", r.status, r.body)
	}
	rec, err := e.store.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "client-f"})
	if err == nil && rec.State == guard.StateCompleted {
		t.Fatalf("the inner Guard's 503 was stored as the outer key's answer")
	}
}

// TestNestedGuardPanicNotStored: a handler that panicked inside an inner
// Guard under an outer one that keeps 5xx answers (Store5xx). The inner
// Guard released its key and answered 500, "retry with the same key"; the
// outer Guard stored that 500 as its key's final answer, so every retry
// got it replayed and the handler never ran again.
func TestNestedGuardPanicNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	outer := httpx.Options{SingleCaller: true, Store5xx: true, Logger: testenv.Logger(t)}
	inner := httpx.Options{SingleCaller: true, Key: httpx.KeyFromBody("/order"), Logger: testenv.Logger(t)}
	srv, c := serve(t, httpx.Guard(e.g, outer)(httpx.Guard(e.g, inner)(h)))
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-p"}`, key("client-p")...)
	if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemHandlerPanic {
		t.Fatalf("first request: %d %q, want 500 handler-panic", r.status, r.body)
	}
	r = do(t, c, "POST", srv.URL+"/orders", `{"order":"o-p"}`, key("client-p")...)
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry with the same key after the inner handler's panic: %d replayed %v %q, handler ran %d time(s); want it run again, 201",
			r.status, r.replayed(), r.body, runs.Load())
	}
}

// TestNestedGuardStoreErrorNotStored: an inner Guard whose claim met a
// store error answers 500, "the request was not run"; an outer Guard that
// keeps 5xx answers stored it as its key's final answer, so the request
// never ran, even once the inner key was readable again.
func TestNestedGuardStoreErrorNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	outer := httpx.Options{SingleCaller: true, Store5xx: true, Logger: testenv.Logger(t)}
	inner := httpx.Options{SingleCaller: true, Key: httpx.KeyFromBody("/order"), Logger: testenv.Logger(t)}
	srv, c := serve(t, httpx.Guard(e.g, outer)(httpx.Guard(e.g, inner)(h)))
	// The inner key's record is not one: its claim fails (ErrCorrupt).
	name := e.store.Name(guard.Key{Scope: "POST /orders", ID: "o-s"})
	if err := e.rdb.HSet(context.Background(), name, "not", "a record").Err(); err != nil {
		t.Fatal(err)
	}
	r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-s"}`, key("client-s")...)
	if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemStoreError {
		t.Fatalf("inner key unreadable: %d %q, want 500 store-error", r.status, r.body)
	}
	if err := e.rdb.Del(context.Background(), name).Err(); err != nil { // an operator repaired it
		t.Fatal(err)
	}
	r = do(t, c, "POST", srv.URL+"/orders", `{"order":"o-s"}`, key("client-s")...)
	if r.status != http.StatusCreated || r.replayed() || runs.Load() != 1 {
		t.Fatalf("retry with the same key once the inner key was readable: %d replayed %v %q, handler ran %d time(s); want it run once, 201",
			r.status, r.replayed(), r.body, runs.Load())
	}
}
