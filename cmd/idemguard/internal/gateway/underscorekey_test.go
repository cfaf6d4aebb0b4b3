package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// wsgiKeyPy is a WSGI upstream on Python's wsgiref, as CGI-style servers
// (wsgiref, PHP, Puma) name fields: "Idempotency_Key" and
// "Idempotency-Key" are both HTTP_IDEMPOTENCY_KEY. It answers 201 with the
// key it read there.
const wsgiKeyPy = `
import sys
from wsgiref.simple_server import make_server, WSGIRequestHandler
class Q(WSGIRequestHandler):
    def log_message(self, *a): pass
def app(env, start):
    n = int(env.get("CONTENT_LENGTH") or 0)
    env["wsgi.input"].read(n)
    body = ("key=" + env.get("HTTP_IDEMPOTENCY_KEY", "")).encode()
    start("201 Created" if env["REQUEST_METHOD"] == "POST" else "200 OK",
          [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
make_server("127.0.0.1", int(sys.argv[1]), app, handler_class=Q).serve_forever()
`

// The client's own key never reaches the upstream (forward.go's
// Rewrite), spelt with '_' for '-' either: a CGI-style upstream reads
// Idempotency_Key as its Idempotency-Key, and one deduplicating on it
// would answer one caller with another's result. (That spelling passed
// untouched.)
func TestClientKeyUnderscoreSpellingNotForwarded(t *testing.T) {
	url := startPython(t, wsgiKeyPy)
	e := startGateway(t, `forward_key_header: ""`+basicConfig+"    timeout: 5s\n", url)
	r := post(t, e.srv.URL+"/orders", "k-us", `{"order":"us1"}`, "X-Account-Id", "mallory", "Idempotency_Key", "victims-key")
	if r.status != http.StatusCreated {
		t.Fatalf("post: %d %q", r.status, r.body)
	}
	if got := strings.TrimPrefix(r.body, "key="); got != "" {
		t.Fatalf("the upstream read HTTP_IDEMPOTENCY_KEY=%q from a client-chosen Idempotency_Key field; with forward_key_header \"\" it must get no key at all", got)
	}
}
