package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestHostInScope: behind a host switch (as gorilla/mux's Host() routes,
// or a chi router per host), one guard serves the same route of two
// hosts. With the host in Options.Scope, as its doc says, the same key
// and body sent to the second host runs that host's handler instead of
// being answered with the first host's response; with DefaultScope, which
// holds no host, it is the first host's replay.
func TestHostInScope(t *testing.T) {
	for _, tc := range []struct {
		name   string
		scope  func(r *http.Request) string
		bRuns  int32
		replay bool
	}{
		{"host in scope", func(r *http.Request) string { return r.Host + " " + httpx.DefaultScope(r) }, 1, false},
		{"default scope", nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			idem := httpx.Guard(e.g, httpx.Options{SingleCaller: true, Scope: tc.scope})
			var runs [2]atomic.Int32
			hosts := map[string]http.Handler{}
			for i, host := range []string{"a.test", "b.test"} {
				hosts[host] = idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs[i].Add(1)
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte("charged by " + host))
				}))
			}
			sw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hosts[r.Host].ServeHTTP(w, r) })
			post := func(host string) *httptest.ResponseRecorder {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, "http://"+host+"/charges", strings.NewReader(`{"amount":100}`))
				r.Header.Set("Idempotency-Key", "k-1")
				sw.ServeHTTP(w, r)
				return w
			}
			if w := post("a.test"); w.Code != http.StatusCreated {
				t.Fatalf("a.test: %d", w.Code)
			}
			w := post("b.test")
			replayed := w.Header().Get(httpx.ReplayedHeader) == "true"
			if runs[1].Load() != tc.bRuns || replayed != tc.replay {
				t.Errorf("b.test: handler ran %d times, replayed %t (%q); want %d, %t", runs[1].Load(), replayed, w.Body.String(), tc.bRuns, tc.replay)
			}
		})
	}
}
