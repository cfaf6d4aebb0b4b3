package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestNoContentTypeAdded: an upstream that answers without a
// Content-Type is passed on without one, as it answered, on a guarded
// route (first answer and replays alike) and through the pass-through:
// the gateway guesses no type (net/http would sniff one, text/html here,
// which a browser would then render, whatever the upstream meant).
func TestNoContentTypeAdded(t *testing.T) {
	const page = "<html><body>hello</body></html>"
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header()["Content-Type"] = nil // net/http sends none
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, page)
		return true
	})
	direct, err := http.Get(u.URL + "/page")
	if err != nil {
		t.Fatal(err)
	}
	_ = direct.Body.Close()
	if _, ok := direct.Header["Content-Type"]; ok {
		t.Fatalf("the upstream itself sent Content-Type %q", direct.Header.Get("Content-Type"))
	}
	e := startGateway(t, basicConfig, u.URL)
	for i := range 3 {
		r := post(t, e.srv.URL+"/orders", "k-no-type", `{"order":"no-type"}`, "X-Account-Id", "acme")
		if _, ok := r.header["Content-Type"]; ok || r.status != http.StatusCreated || r.body != page || r.replayed() != (i > 0) {
			t.Fatalf("guarded request %d: %d %q Content-Type %q (replayed %v); want the upstream's 201 without a Content-Type", i, r.status, r.body, r.header.Get("Content-Type"), r.replayed())
		}
	}
	res, err := http.Get(e.srv.URL + "/page")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if _, ok := res.Header["Content-Type"]; ok || !strings.Contains(string(b), "hello") {
		t.Fatalf("pass-through: %d %q Content-Type %q; want none", res.StatusCode, b, res.Header.Get("Content-Type"))
	}
	if n := u.count("no-type"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}
