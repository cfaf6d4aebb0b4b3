package httpx_test

import (
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestSetCookieNonCanonicalNotReplayed: DefaultReplayHeader never
// replays Set-Cookie, whatever case the handler writes its name in
// (w.Header()["set-cookie"], as code copying fields from another source
// does, sends a Set-Cookie all the same). (Such a cookie was stored, and
// handed to whoever replayed the key.)
func TestSetCookieNonCanonicalNotReplayed(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["set-cookie"] = []string{"session=secret"}
		w.WriteHeader(http.StatusCreated)
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("ck-1")...)
	if first.header.Get("Set-Cookie") != "session=secret" {
		t.Fatalf("first response lacks the cookie: %v", first.header)
	}
	r := do(t, c, "POST", srv.URL+"/o", "a", key("ck-1")...)
	if !r.replayed() {
		t.Fatalf("second request not replayed: %d %v", r.status, r.header)
	}
	if got := r.header.Get("Set-Cookie"); got != "" {
		t.Fatalf("replay carries Set-Cookie %q; DefaultReplayHeader never replays Set-Cookie", got)
	}
}
