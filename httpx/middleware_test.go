package httpx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// orders is a handler that counts its runs and answers each with a body no
// other run gives.
type orders struct{ runs atomic.Int64 }

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", strconv.FormatInt(n, 10))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"at":%q,"echo":%q}`, n, time.Now().Format(time.RFC3339Nano), body)
}

// guarded is h behind a Guard on e. Tests that are not about callers run
// as a single-caller service.
func guarded(e *env, h http.Handler, opts httpx.Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = testenv.Logger(e.t)
	}
	if opts.Tenant == nil {
		opts.SingleCaller = true
	}
	return httpx.Guard(e.g, opts)(h)
}

func TestReplayByteForByte(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{}))

	first := do(t, c, "POST", srv.URL+"/orders", `{"sku":"a"}`, with(key("k-1"), []string{"Content-Type", "application/json"})...)
	// The response left the server only after it was stored.
	if rec, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "k-1"}); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record when the client had the response: %+v, %v; want completed", rec, err)
	}
	start := time.Now()
	second := do(t, c, "POST", srv.URL+"/orders", `{"sku":"a"}`, with(key("k-1"), []string{"Content-Type", "application/json"})...)
	t.Logf("replay answered %s after the first response", time.Since(start))

	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: status %d replayed %v", first.status, first.replayed())
	}
	if second.status != first.status {
		t.Fatalf("replay status %d, want %d", second.status, first.status)
	}
	if !bytes.Equal(second.body, first.body) {
		t.Fatalf("replay body\n%q\nwant\n%q", second.body, first.body)
	}
	if !second.replayed() {
		t.Fatalf("replay lacks %s: true", httpx.ReplayedHeader)
	}
	for _, k := range []string{"X-Order", "Location", "Content-Type", "Content-Length"} {
		if got, want := second.header.Get(k), first.header.Get(k); got != want || want == "" {
			t.Errorf("replayed %s = %q, first had %q", k, got, want)
		}
	}
	if first.header.Get("Set-Cookie") == "" || second.header.Get("Set-Cookie") != "" {
		t.Errorf("Set-Cookie: first %q, replay %q; want it on the first only",
			first.header.Get("Set-Cookie"), second.header.Get("Set-Cookie"))
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// A key given as an RFC 8941 string is the same key.
	third := do(t, c, "POST", srv.URL+"/orders", `{"sku":"a"}`, with(key(`"k-1"`), []string{"Content-Type", "application/json"})...)
	if !third.replayed() || !bytes.Equal(third.body, first.body) {
		t.Fatalf("quoted key: replayed %v body %q", third.replayed(), third.body)
	}
}

func TestConcurrentOneKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	const n = 100
	var runs atomic.Int64
	enough := make(chan struct{}) // closed once enough requests were turned away
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-enough
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "the one body %d", time.Now().UnixNano())
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))

	replies := make(chan reply, n)
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-begin
			r, err := send(context.Background(), c, "POST", srv.URL+"/pay", "amount=10", key("same")...)
			if err != nil {
				t.Error(err)
			}
			replies <- r
		})
	}
	close(begin)
	var got []reply
	for r := range replies {
		got = append(got, r)
		if len(got) == 30 {
			close(enough) // 30 were answered while the first still ran
		}
		if len(got) == n {
			break
		}
	}
	wg.Wait()

	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	var original []byte
	for _, r := range got {
		if r.status == http.StatusCreated && !r.replayed() {
			if original != nil {
				t.Fatal("two original responses")
			}
			original = r.body
		}
	}
	if original == nil {
		t.Fatal("no original response")
	}
	var replays, busy int
	for _, r := range got {
		switch {
		case r.status == http.StatusCreated && r.replayed():
			replays++
			if !bytes.Equal(r.body, original) {
				t.Errorf("replay body %q, want %q", r.body, original)
			}
		case r.status == http.StatusConflict:
			busy++
			ra, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Errorf("409 with Retry-After %q", r.header.Get("Retry-After"))
			}
			if p := r.problem(t); p.Type != httpx.ProblemInFlight {
				t.Errorf("409 problem type %q", p.Type)
			}
		case r.status != http.StatusCreated:
			t.Errorf("unexpected response %d %q", r.status, r.body)
		}
	}
	t.Logf("1 original, %d replays, %d in flight", replays, busy)
	if busy < 30 {
		t.Fatalf("%d answered 409 while the handler ran, want at least 30", busy)
	}
}

func TestRejections(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	mw := guarded(e, h, httpx.Options{})
	srv, c := serve(t, mw)

	if r := do(t, c, "POST", srv.URL+"/o", "a", key("m-1")...); r.status != http.StatusCreated {
		t.Fatalf("first: %d", r.status)
	}
	cases := []struct {
		name   string
		body   string
		header []string
		status int
		typ    string
	}{
		{"other body", "b", key("m-1"), 422, httpx.ProblemKeyMismatch},
		{"other content type", "a", with(key("m-1"), []string{"Content-Type", "text/plain"}), 422, httpx.ProblemKeyMismatch},
		{"missing", "a", nil, 400, httpx.ProblemMissingKey},
		{"256 chars", "a", key(strings.Repeat("k", 256)), 400, httpx.ProblemMalformedKey},
		{"two headers", "a", with(key("m-2"), key("m-3")), 400, httpx.ProblemMalformedKey},
		{"two headers, same value", "a", with(key("m-2"), key("m-2")), 400, httpx.ProblemMalformedKey},
		{"folded list", "a", key("m-2, m-3"), 400, httpx.ProblemMalformedKey},
		{"space inside", "a", key("m 2"), 400, httpx.ProblemMalformedKey},
		{"non-ASCII", "a", key("m-\x80"), 400, httpx.ProblemMalformedKey},
		{"open quote", "a", key(`"m-2`), 400, httpx.ProblemMalformedKey},
		{"bad escape", "a", key(`"m\q"`), 400, httpx.ProblemMalformedKey},
		{"empty string", "a", key(`""`), 400, httpx.ProblemMalformedKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, "POST", srv.URL+"/o", tc.body, tc.header...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tc.status, r.body)
			}
			if p := r.problem(t); p.Type != tc.typ {
				t.Fatalf("type %q, want %q", p.Type, tc.typ)
			}
		})
	}
	// Control bytes never pass net/http's own header checks on the wire,
	// so they are sent to the middleware directly.
	for _, v := range []string{"m-\x01", "m\x7f", "\"m\x00\"", "m\tx"} {
		req := httptest.NewRequest("POST", "/o", strings.NewReader("a"))
		req.Header.Set("Idempotency-Key", v)
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), httpx.ProblemMalformedKey) {
			t.Errorf("key %q: %d %s", v, rec.Code, rec.Body)
		}
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := e.records(t); n != 1 {
		t.Fatalf("%d records stored, want 1", n)
	}
	// The longest key allowed works.
	if r := do(t, c, "POST", srv.URL+"/o", "a", key(strings.Repeat("k", 255))...); r.status != http.StatusCreated {
		t.Fatalf("255-char key: %d %s", r.status, r.body)
	}
}

func TestSafeMethodsUntouched(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	before := e.commands.n.Load()
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE"} {
		for range 2 {
			r := do(t, c, m, srv.URL+"/o", "", key("g-1")...)
			if r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("%s: %d replayed %v", m, r.status, r.replayed())
			}
		}
		if r := do(t, c, m, srv.URL+"/o", ""); r.status != http.StatusCreated {
			t.Fatalf("%s without key: %d", m, r.status)
		}
	}
	if n := h.runs.Load(); n != 15 {
		t.Fatalf("handler ran %d times, want 15", n)
	}
	if d := e.commands.n.Load() - before; d != 0 {
		t.Fatalf("%d Redis commands for unguarded methods, want 0", d)
	}
	// The counter does count: one POST sends commands.
	do(t, c, "POST", srv.URL+"/o", "", key("g-1")...)
	if e.commands.n.Load() == before {
		t.Fatal("command counter saw nothing for a POST")
	}
}

func TestOptionalKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Optional: true}))
	for range 2 {
		if r := do(t, c, "POST", srv.URL+"/o", "a"); r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("no key: %d replayed %v", r.status, r.replayed())
		}
	}
	if h.runs.Load() != 2 || e.records(t) != 0 {
		t.Fatalf("runs %d records %d, want 2 and 0", h.runs.Load(), e.records(t))
	}
}

func TestTenantsIsolated(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}))
	a := do(t, c, "POST", srv.URL+"/o", "same", with(key("shared"), []string{"X-Tenant", "a"})...)
	b := do(t, c, "POST", srv.URL+"/o", "same", with(key("shared"), []string{"X-Tenant", "b"})...)
	if a.replayed() || b.replayed() || bytes.Equal(a.body, b.body) {
		t.Fatalf("tenant b got tenant a's response: %q / %q", a.body, b.body)
	}
	a2 := do(t, c, "POST", srv.URL+"/o", "same", with(key("shared"), []string{"X-Tenant", "a"})...)
	if !a2.replayed() || !bytes.Equal(a2.body, a.body) {
		t.Fatalf("tenant a's repeat: replayed %v body %q", a2.replayed(), a2.body)
	}
	// A tenant name that looks like a prefix of another scope cannot meet it.
	c2 := do(t, c, "POST", srv.URL+"/o", "same", with(key("shared"), []string{"X-Tenant", `a" POST`})...)
	if c2.replayed() {
		t.Fatal("a crafted tenant name met another tenant's key")
	}
	if n := h.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{MaxBody: 1000}))

	big := strings.Repeat("x", 1001)
	r := do(t, c, "POST", srv.URL+"/o", big, key("big")...)
	if r.status != http.StatusRequestEntityTooLarge || r.problem(t).Type != httpx.ProblemBodyTooLarge {
		t.Fatalf("declared length: %d %s", r.status, r.body)
	}
	// Without a declared length (chunked), the limit holds while reading.
	req, _ := http.NewRequest("POST", srv.URL+"/o", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Idempotency-Key", "big-chunked")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: %d", resp.StatusCode)
	}
	if h.runs.Load() != 0 || e.records(t) != 0 {
		t.Fatalf("runs %d records %d after 413s, want 0 and 0", h.runs.Load(), e.records(t))
	}
	// The same key with a body that fits now runs: nothing was kept.
	if r := do(t, c, "POST", srv.URL+"/o", "small", key("big")...); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("after 413: %d replayed %v", r.status, r.replayed())
	}
}

// A request handed to the Guard directly (not by net/http's server, which
// holds a body to its Content-Length) may carry a body longer or shorter
// than it declares: the Guard reads what is there, as the handler would,
// up to MaxBody, and fingerprints all of it.
func TestBodyNotAsDeclared(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var seen []string
	h := guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		seen = append(seen, string(b))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", len(seen))
	}), httpx.Options{MaxBody: 10})
	send := func(id, body string, declared int64) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/o", strings.NewReader(body))
		req.ContentLength = declared
		req.Header.Set("Idempotency-Key", id)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	// Longer than declared, within MaxBody: all of it.
	if rec := send("longer", "abcdefgh", 3); rec.Code != http.StatusCreated || seen[len(seen)-1] != "abcdefgh" {
		t.Fatalf("longer than declared: %d, handler saw %q", rec.Code, seen)
	}
	// All of it was fingerprinted: the same key with the first 3 bytes
	// is another request, with all 8 the same one.
	if rec := send("longer", "abc", 3); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("the declared prefix only: %d %s, want 422", rec.Code, rec.Body)
	}
	if rec := send("longer", "abcdefgh", 8); rec.Code != http.StatusCreated || rec.Header().Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("the same body, declared right: %d %v, want a replay", rec.Code, rec.Header())
	}
	// Shorter than declared: what there is.
	if rec := send("shorter", "abc", 9); rec.Code != http.StatusCreated || seen[len(seen)-1] != "abc" {
		t.Fatalf("shorter than declared: %d, handler saw %q", rec.Code, seen)
	}
	// Past MaxBody although the declared length is within it: 413, and
	// nothing runs or is kept.
	runs := len(seen)
	if rec := send("over", "abcdefghijklmnop", 3); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("over MaxBody, declared within: %d %s", rec.Code, rec.Body)
	}
	if rec := send("over-exact", "abcdefghijk", 10); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("one byte over MaxBody, declared at it: %d %s", rec.Code, rec.Body)
	}
	if len(seen) != runs || e.records(t) != 2 {
		t.Fatalf("after the 413s: %d runs (want %d), %d records (want 2)", len(seen), runs, e.records(t))
	}
	// At MaxBody exactly: runs.
	if rec := send("at", "abcdefghij", 10); rec.Code != http.StatusCreated || seen[len(seen)-1] != "abcdefghij" {
		t.Fatalf("at MaxBody: %d, handler saw %q", rec.Code, seen)
	}
}

func TestPanicReleasesKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.Header().Set("X-Half", "done")
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	r := do(t, c, "POST", srv.URL+"/o", "a", key("p-1")...)
	if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemHandlerPanic {
		t.Fatalf("panic: %d %s", r.status, r.body)
	}
	if r.header.Get("X-Half") != "" {
		t.Fatal("the panicking handler's headers reached the client")
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "p-1"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after the panic the key is %v, want released (ErrNotFound)", err)
	}
	r = do(t, c, "POST", srv.URL+"/o", "a", key("p-1")...)
	if r.status != http.StatusCreated || r.replayed() || runs.Load() != 2 {
		t.Fatalf("retry: %d replayed %v runs %d", r.status, r.replayed(), runs.Load())
	}
}

func TestServerErrors(t *testing.T) {
	for _, store5xx := range []bool{false, true} {
		t.Run(fmt.Sprintf("Store5xx=%v", store5xx), func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprintf(w, "failure %d", runs.Add(1))
			})
			srv, c := serve(t, guarded(e, h, httpx.Options{Store5xx: store5xx}))
			first := do(t, c, "POST", srv.URL+"/o", "a", key("e-1")...)
			second := do(t, c, "POST", srv.URL+"/o", "a", key("e-1")...)
			if first.status != 500 || second.status != 500 {
				t.Fatalf("statuses %d, %d", first.status, second.status)
			}
			if store5xx {
				if runs.Load() != 1 || !second.replayed() || !bytes.Equal(first.body, second.body) {
					t.Fatalf("kept 5xx: runs %d replayed %v", runs.Load(), second.replayed())
				}
			} else {
				if runs.Load() != 2 || second.replayed() || e.records(t) != 0 {
					t.Fatalf("released 5xx: runs %d replayed %v records %d", runs.Load(), second.replayed(), e.records(t))
				}
			}
		})
	}
}

func TestClientHangsUp(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	entered, done := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		runs.Add(1)
		close(entered)
		select {
		case <-r.Context().Done(): // the hang-up reached the server
		case <-time.After(10 * time.Second):
			t.Error("the hang-up never reached the handler")
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "charged once")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := send(ctx, c, "POST", srv.URL+"/o", "a", key("h-1")...)
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want cancelled", err)
	}
	<-done
	testenv.WaitFor(t, 5*time.Second, "the abandoned call's record to be completed", func() bool {
		rec, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "h-1"})
		return err == nil && rec.State == guard.StateCompleted
	})
	r := do(t, c, "POST", srv.URL+"/o", "a", key("h-1")...)
	if r.status != http.StatusAccepted || !r.replayed() || string(r.body) != "charged once" || runs.Load() != 1 {
		t.Fatalf("retry: %d replayed %v body %q runs %d", r.status, r.replayed(), r.body, runs.Load())
	}
}

func TestRetentionExpires(t *testing.T) {
	// miniredis: the test must move time past the retention.
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{TTL: time.Hour})
	h := &orders{}
	srv, c := serve(t, httpx.Guard(g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(h))

	first := do(t, c, "POST", srv.URL+"/o", "a", key("ttl")...)
	mr.FastForward(59 * time.Minute)
	if r := do(t, c, "POST", srv.URL+"/o", "a", key("ttl")...); !r.replayed() || !bytes.Equal(r.body, first.body) {
		t.Fatalf("within the retention: replayed %v", r.replayed())
	}
	mr.FastForward(2 * time.Minute)
	r := do(t, c, "POST", srv.URL+"/o", "a", key("ttl")...)
	if r.replayed() || r.status != http.StatusCreated || h.runs.Load() != 2 {
		t.Fatalf("after the retention: %d replayed %v runs %d", r.status, r.replayed(), h.runs.Load())
	}
}

func TestLeaseKeptWhileHandlerRuns(t *testing.T) {
	// The handler runs for three leases, kept by heartbeats (one a third
	// of a lease), each of which must be answered within the lease the
	// one before gave: at 300ms, a stall of a loaded machine lost it
	// ("an extension succeeded only after the lease's deadline").
	const lease = 1500 * time.Millisecond
	e := newEnv(t, guard.Options{Lease: lease})
	var runs atomic.Int64
	proceed := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case <-proceed:
		case <-r.Context().Done():
			t.Errorf("handler context ended: %v", context.Cause(r.Context()))
		}
		io.WriteString(w, "slow")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{InFlightStatus: http.StatusTooManyRequests}))
	errc := make(chan error, 1)
	go func() {
		r, err := send(context.Background(), c, "POST", srv.URL+"/o", "a", key("slow")...)
		if err == nil && (r.status != 200 || string(r.body) != "slow") {
			err = fmt.Errorf("first: %d %q", r.status, r.body)
		}
		errc <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the first call's handler to run", func() bool { return runs.Load() == 1 })
	time.Sleep(3 * lease) // waiting for three leases to pass on the real server
	r := do(t, c, "POST", srv.URL+"/o", "a", key("slow")...)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.problem(t).Type != httpx.ProblemInFlight {
		t.Fatalf("while running: %d Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	close(proceed)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

func TestStoreUnavailable(t *testing.T) {
	// A real client of a port nothing listens on.
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	h := &orders{}
	srv, c := serve(t, httpx.Guard(g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true, UnavailableRetryAfter: 2500 * time.Millisecond})(h))
	r := do(t, c, "POST", srv.URL+"/o", "a", key("u-1")...)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "3" || r.problem(t).Type != httpx.ProblemStoreUnavailable {
		t.Fatalf("%d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if h.runs.Load() != 0 {
		t.Fatal("handler ran without the store")
	}
}

func TestLargeResponseNotKept(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	big := strings.Repeat("0123456789", 500)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		for i := 0; i < len(big); i += 700 {
			io.WriteString(w, big[i:min(i+700, len(big))])
		}
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{MaxStoredResponse: 1024}))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("l-1")...)
	if first.status != http.StatusCreated || string(first.body) != big {
		t.Fatalf("first: %d, %d bytes (want %d)", first.status, len(first.body), len(big))
	}
	second := do(t, c, "POST", srv.URL+"/o", "a", key("l-1")...)
	if second.status != http.StatusCreated || !second.replayed() || second.problem(t).Type != httpx.ProblemResponseNotKept {
		t.Fatalf("replay: %d replayed %v %s", second.status, second.replayed(), second.body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

func TestHijackedNotReplayedHalf(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 3\r\nConnection: close\r\n\r\nraw")
		buf.Flush()
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("j-1")...)
	if first.status != http.StatusAccepted || string(first.body) != "raw" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	// The handler answered on the raw connection before it returned, so the
	// client may be faster than the completion: wait for it.
	testenv.WaitFor(t, 5*time.Second, "the hijacked call's record to be completed", func() bool {
		rec, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "j-1"})
		return err == nil && rec.State == guard.StateCompleted
	})
	second := do(t, c, "POST", srv.URL+"/o", "a", key("j-1")...)
	if !second.replayed() || second.problem(t).Type != httpx.ProblemResponseNotKept {
		t.Fatalf("replay: %d %s", second.status, second.body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

func TestFlushStreams(t *testing.T) {
	e := newEnv(t, guard.Options{})
	seen := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			t.Error("the guarded handler's writer is not an http.Flusher")
		}
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline through the capture: %v", err)
		}
		io.WriteString(w, "part one;")
		if err := rc.Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		<-seen // the client read part one before the handler ends
		io.WriteString(w, "part two")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	req, _ := http.NewRequest("POST", srv.URL+"/o", strings.NewReader("a"))
	req.Header.Set("Idempotency-Key", "f-1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	part := make([]byte, len("part one;"))
	if _, err := io.ReadFull(resp.Body, part); err != nil {
		t.Fatal(err)
	}
	close(seen)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := string(part) + string(rest); got != "part one;part two" {
		t.Fatalf("streamed %q", got)
	}
	r := do(t, c, "POST", srv.URL+"/o", "a", key("f-1")...)
	if !r.replayed() || string(r.body) != "part one;part two" {
		t.Fatalf("replay: %v %q", r.replayed(), r.body)
	}
}

// TestResponseSentWhenNotStored: the handler ran but its result cannot be
// stored (here another party removed the record mid-run, so the guarded
// write is refused): the client still gets the real response.
func TestResponseSentWhenNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	k := guard.Key{Scope: "POST /o", ID: "n-1"}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := e.rdb.Del(r.Context(), e.store.Name(k)).Err(); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "real answer")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	r := do(t, c, "POST", srv.URL+"/o", "a", key("n-1")...)
	if r.status != http.StatusCreated || string(r.body) != "real answer" || r.replayed() {
		t.Fatalf("%d %q replayed %v", r.status, r.body, r.replayed())
	}
	if _, err := e.g.Get(context.Background(), k); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("record: %v, want none (the completion was refused)", err)
	}
}

// TestAbandonedKey: a holder that died without finishing (its claim made
// here directly) blocks the key until its lease ends; then the next request
// takes the key over, or, when attempts are used up, gets a 500 that says so.
func TestAbandonedKey(t *testing.T) {
	for _, maxAttempts := range []int{0, 1} {
		t.Run(fmt.Sprintf("MaxAttempts=%d", maxAttempts), func(t *testing.T) {
			// The dead holder's claim and each request's must be answered
			// within a lease (a claim answered later is refused: 503): a
			// round a loaded machine held back past it proves nothing and
			// runs again with a lease twice as long.
			testenv.OnTime(t, "a lease", 200*time.Millisecond, 4, func(lease time.Duration) bool {
				return abandonedKey(t, maxAttempts, lease)
			})
		})
	}
}

// abandonedKey runs TestAbandonedKey's case with lease; late reports that
// a claim may have been answered after its lease's first deadline, or the
// first request may have reached Redis after the dead holder's lease
// ended, which proves nothing.
func abandonedKey(t *testing.T, maxAttempts int, lease time.Duration) (late bool) {
	e := newEnv(t, guard.Options{Lease: lease, MaxAttempts: maxAttempts})
	validity := lease - guard.LeaseMargin(lease)
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	fp := httpx.DefaultFingerprint(httptest.NewRequest("POST", "/o", nil), []byte("a"))
	claimed := time.Now()
	if _, err := e.g.Claim(context.Background(), guard.Key{Scope: "POST /o", ID: "dead"}, fp); err != nil {
		if errors.Is(err, guard.ErrUnavailable) && time.Since(claimed) >= validity {
			return true
		}
		t.Fatal(err)
	}
	r := do(t, c, "POST", srv.URL+"/o", "a", key("dead")...)
	if r.status != http.StatusConflict || r.header.Get("Retry-After") != "1" {
		if time.Since(claimed) >= validity {
			return true
		}
		t.Fatalf("while the dead holder's lease lives: %d Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	time.Sleep(lease + 100*time.Millisecond) // waiting for the lease to run out on the server
	sent := time.Now()
	r = do(t, c, "POST", srv.URL+"/o", "a", key("dead")...)
	if r.status == http.StatusServiceUnavailable && time.Since(sent) >= validity {
		return true
	}
	if maxAttempts == 1 {
		if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemExhausted || h.runs.Load() != 0 {
			t.Fatalf("exhausted: %d %s runs %d", r.status, r.body, h.runs.Load())
		}
		return false
	}
	if r.status != http.StatusCreated || r.replayed() || h.runs.Load() != 1 {
		t.Fatalf("recovered: %d replayed %v runs %d", r.status, r.replayed(), h.runs.Load())
	}
	return false
}

// TestFlushThenTooLarge: a response that streams and then outgrows the
// stored maximum reaches the client whole, each byte once.
func TestFlushThenTooLarge(t *testing.T) {
	e := newEnv(t, guard.Options{})
	want := strings.Repeat("a", 500) + strings.Repeat("b", 2000)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, want[:500])
		http.NewResponseController(w).Flush()
		io.WriteString(w, want[500:])
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{MaxStoredResponse: 1024}))
	if r := do(t, c, "POST", srv.URL+"/o", "a", key("ft-1")...); string(r.body) != want {
		t.Fatalf("client got %d bytes, want %d", len(r.body), len(want))
	}
	if r := do(t, c, "POST", srv.URL+"/o", "a", key("ft-1")...); r.status != 200 || r.problem(t).Type != httpx.ProblemResponseNotKept {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
}

// TestReplayHeaderPolicy: fields named by Connection are never replayed;
// ReplayHeader can keep Set-Cookie.
func TestReplayHeaderPolicy(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "1")
		w.Header().Set("X-Kept", "1")
		w.Header().Set("Set-Cookie", "a=b")
	})
	keepCookie := func(name string) bool { return name == "Set-Cookie" || httpx.DefaultReplayHeader(name) }
	srv, c := serve(t, guarded(e, h, httpx.Options{ReplayHeader: keepCookie}))
	do(t, c, "POST", srv.URL+"/o", "a", key("hp-1")...)
	r := do(t, c, "POST", srv.URL+"/o", "a", key("hp-1")...)
	if !r.replayed() || r.header.Get("X-Hop") != "" || r.header.Get("X-Kept") != "1" || r.header.Get("Set-Cookie") != "a=b" {
		t.Fatalf("replayed header %v", r.header)
	}
}

// TestClaimFromHandler: a guarded handler sees its lease and fingerprint;
// an unguarded one sees none.
func TestClaimFromHandler(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var got []guard.Lease
	var fps []string
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, fp, ok := httpx.ClaimFrom(r.Context())
		mu.Lock()
		defer mu.Unlock()
		if ok {
			got = append(got, lease)
			fps = append(fps, fp)
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	do(t, c, "POST", srv.URL+"/pay", `{"a":1}`, key("claim-1")...)
	do(t, c, "GET", srv.URL+"/pay", "")
	if len(got) != 1 || got[0].Key.ID != "claim-1" || got[0].Fence != 1 || got[0].Token == "" || fps[0] == "" {
		t.Fatalf("leases seen by the handler: %+v %q; want one, for claim-1 with fence 1", got, fps)
	}
	rec, err := e.g.Get(context.Background(), got[0].Key)
	if err != nil || rec.Token != got[0].Token || !rec.SameFingerprint(fps[0]) {
		t.Fatalf("record %+v, %v; want the handler's token and fingerprint", rec, err)
	}
}
