package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestSoftRouteKeepsClientKey: the client's own key header is never
// forwarded, since it is not scoped by caller (README, "Upstream's
// view"), also when a soft route passes a request through unguarded (a
// body-key route whose body has no key): it went through raw, and an
// upstream that deduplicates on it (what forward_key_header is for)
// answered one caller with another's result.
func TestSoftRouteKeepsClientKey(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{} // Idempotency-Key -> the first caller's answer
	var raw []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		raw = append(raw, k)
		ans, ok := seen[k]
		if !ok || k == "" {
			b, _ := json.Marshal(map[string]string{"account": r.Header.Get("X-Account-Id")})
			ans = string(b)
			seen[k] = ans
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(ans))
	}))
	defer up.Close()
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
    key: {body: /id}
    requirement: soft
`, up.URL)
	a := post(t, e.srv.URL+"/orders", "shared-1", `{"order":"a"}`, "X-Account-Id", "acme")
	b := post(t, e.srv.URL+"/orders", "shared-1", `{"order":"b"}`, "X-Account-Id", "globex")
	mu.Lock()
	t.Logf("upstream saw Idempotency-Key %q; acme got %d %s; globex got %d %s", raw, a.status, a.body, b.status, b.body)
	for _, k := range raw {
		if k == "shared-1" {
			t.Errorf("the client's own, unscoped key %q reached the upstream (README: never forwarded)", k)
			break
		}
	}
	mu.Unlock()
	if b.body != `{"account":"globex"}` {
		t.Errorf("globex got %s: another caller's answer, through the upstream's deduplication on the forwarded client key", b.body)
	}
}
