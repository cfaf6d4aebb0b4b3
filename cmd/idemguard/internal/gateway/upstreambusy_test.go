package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// unknown_outcome: resend in front of an upstream that deduplicates (here
// itself guarded by httpx.Guard): the first request times out at the
// gateway while it still runs upstream, so the key is released; the
// client's retry resends it with the same derived key and the upstream
// answers "in progress" (its InFlightStatus with Retry-After). That answer
// is passed to the client and not stored: once the upstream's run ends,
// the next retry gets its real answer (the upstream's replay), and the
// effect ran once. Stored, the "in progress" would be replayed for the
// key's whole TTL.
func TestResendUpstreamInProgressIsNotStored(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var runs atomic.Int32
			started, finish := make(chan struct{}, 1), make(chan struct{})
			store := guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: testenv.Prefix(t) + "upstream:"})
			g := guard.New(store, guard.Options{TTL: time.Minute, Lease: 10 * time.Second})
			guarded := httpx.Guard(g, httpx.Options{Methods: []string{http.MethodPost}, SingleCaller: true, InFlightStatus: status})
			up := httptest.NewServer(guarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				started <- struct{}{}
				<-finish
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"order":"busy","run":%d}`, n)
			})))
			t.Cleanup(up.Close)
			var finished atomic.Bool
			t.Cleanup(func() {
				if finished.CompareAndSwap(false, true) {
					close(finish)
				}
			})

			// The route's timeout must let the forward reach the upstream's
			// handler (its guard's claim first) on a loaded machine.
			e := startGateway(t, basicConfig+"    unknown_outcome: resend\n    timeout: 1s\n", up.URL)
			url := e.srv.URL + "/orders"
			first := post(t, url, "k-busy", `{"order":"busy"}`, "X-Account-Id", "acme")
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatalf("the upstream's handler never ran the first (answered %d %q)", first.status, first.body)
			}
			if first.status != http.StatusBadGateway || first.problemType() != ProblemResend {
				t.Fatalf("first: %d %q; want 502 %s (timed out, released for a resend)", first.status, first.body, ProblemResend)
			}

			// The upstream still runs the first: the resend is answered "in
			// progress". The client gets that, and the key stays free.
			busy := post(t, url, "k-busy", `{"order":"busy"}`, "X-Account-Id", "acme")
			if busy.status != status || busy.header.Get("Retry-After") == "" || busy.replayed() {
				t.Fatalf("resend while the upstream runs: %d %q %v; want the upstream's %d with Retry-After, not replayed",
					busy.status, busy.body, busy.header, status)
			}
			if n := testutil.ToFloat64(e.gw.metrics.requests.WithLabelValues("POST /orders", resultUpstreamBusy)); n != 1 {
				t.Errorf("upstream_busy counter %v, want 1", n)
			}
			key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-busy"}
			if rec, err := e.store.Get(context.Background(), key); err == nil && rec.State == guard.StateCompleted {
				t.Fatalf("the upstream's in-progress answer was stored as the key's result: %q", rec.Result)
			}

			finished.Store(true)
			close(finish)
			// The upstream stores its answer once its handler returned;
			// until then a retry may be told "in progress" again.
			var last reply
			testenv.WaitFor(t, 5*time.Second, "the upstream's real answer", func() bool {
				last = post(t, url, "k-busy", `{"order":"busy"}`, "X-Account-Id", "acme")
				return last.status != status
			})
			if last.status != http.StatusCreated || !strings.Contains(last.body, `"run":1`) {
				t.Fatalf("retry after the upstream finished: %d %q; want its 201 of run 1", last.status, last.body)
			}
			if r := post(t, url, "k-busy", `{"order":"busy"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated || !r.replayed() || r.body != last.body {
				t.Fatalf("next retry: %d %q; want the stored 201 replayed", r.status, r.body)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the upstream's effect ran %d times, want 1", n)
			}
		})
	}
}

// unknown_outcome: answer does not take the upstream to deduplicate: a
// 409 with Retry-After is its answer like any other, stored and replayed.
func TestAnswerModeStoresUpstream409(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "in progress", http.StatusConflict)
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	for i := range 2 {
		r := post(t, e.srv.URL+"/orders", "k-409", `{"order":"c1"}`, "X-Account-Id", "acme")
		if r.status != http.StatusConflict || r.replayed() != (i > 0) {
			t.Fatalf("try %d: %d replayed=%v %q; want the 409 stored and replayed", i, r.status, r.replayed(), r.body)
		}
	}
	if n := u.count("c1"); n != 1 {
		t.Fatalf("the upstream got the request %d times, want 1", n)
	}
}
