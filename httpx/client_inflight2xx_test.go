package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestInFlightAnswerOfA2xxStatus: Options.InFlightStatus says "NewClient
// knows the answer by its problem type, ProblemInFlight, whatever its
// status, and asks again without counting attempts". Behind a Guard whose
// InFlightStatus is 202 Accepted (an "in progress" status some APIs use), a
// duplicate sent while the key's first request runs should be asked about
// again and get the first request's response. inFlightAnswer only looks at
// statuses >= 400, so the Transport hands the caller the 202 problem
// document as if it were the answer: the caller sees a success without the
// effect's response, and never learns the real outcome.
func TestInFlightAnswerOfA2xxStatus(t *testing.T) {
	e := newEnv(t, guard.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	var runs int
	var mu sync.Mutex
	h := guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		if n == 1 {
			close(started)
		}
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}), httpx.Options{InFlightStatus: http.StatusAccepted})
	var answers2xx int
	srv, plain := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusAccepted {
			mu.Lock()
			answers2xx++
			if answers2xx == 2 {
				open() // asked again once: let the first request finish
			}
			mu.Unlock()
		}
	}))

	first := make(chan reply, 1)
	go func() {
		r, err := send(t.Context(), plain, "POST", srv.URL+"/charges", "x", key("k-202")...)
		if err != nil {
			t.Errorf("first request: %v", err)
		}
		first <- r
	}()
	<-started

	c := retryClient(t, httpx.TransportOptions{InFlightDelay: 20 * time.Millisecond, MaxInFlightWait: 5 * time.Second})
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k-202")
	resp, err := c.Do(req)
	open()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if f := <-first; f.status != http.StatusCreated || string(f.body) != "charged" {
		t.Fatalf("first request: %d %q", f.status, f.body)
	}
	if resp.StatusCode != http.StatusCreated || string(b) != "charged" || resp.Header.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("duplicate got %d %s %q (replayed %q); want the replay of the first request's 201 \"charged\": "+
			"the in-flight answer (problem type %s) was returned to the caller instead of asked about again",
			resp.StatusCode, resp.Header.Get("Content-Type"), b, resp.Header.Get(httpx.ReplayedHeader), httpx.ProblemInFlight)
	}
}
