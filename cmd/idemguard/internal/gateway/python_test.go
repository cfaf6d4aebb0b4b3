package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// echoPy is an upstream as simple Python services are written
// (http.server, the body read by its Content-Length): it answers 201 with
// the body it read.
const echoPy = `
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// startPython runs script with a free port as its argument and returns
// its URL once it answers GET /.
func startPython(t *testing.T, script string) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		if os.Getenv(testenv.EnvRequire) == "1" {
			t.Fatal("python3 is not installed: the gateway tests run upstreams in Python")
		}
		t.Skip("python3 is not installed")
	}
	port := strconv.Itoa(testenv.FreePort(t))
	cmd := exec.Command("python3", "-c", script, port)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url := "http://127.0.0.1:" + port
	testenv.WaitFor(t, 20*time.Second, "the Python upstream to answer", func() bool {
		resp, err := http.Get(url + "/")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return true
	})
	return url
}

// A client's chunked body (no Content-Length) reaches the upstream with
// its length: httpx.Guard read it whole already, and an upstream that
// reads by Content-Length (Python's http.server) would otherwise act on
// an empty body, and the answer to that would be stored for the key.
func TestChunkedBodyReachesUpstreamWithItsLength(t *testing.T) {
	url := startPython(t, echoPy)
	e := startGateway(t, basicConfig+"    timeout: 5s\n", url)
	const body = `{"order":"chunked1"}`
	for i := range 2 {
		// io.MultiReader hides the length: the client sends it chunked.
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.srv.URL+"/orders",
			io.MultiReader(strings.NewReader(body[:5]), strings.NewReader(body[5:])))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-chunked")
		req.Header.Set("X-Account-Id", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(got) != body {
			t.Fatalf("attempt %d: %d %q; want 201 and the body the upstream read, %q", i, resp.StatusCode, got, body)
		}
		if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Fatalf("attempt %d: replayed=%v", i, replayed)
		}
	}
}

// A chunked body with trailers stays chunked, so its trailers still reach
// the upstream.
func TestChunkedBodyKeepsRequestTrailers(t *testing.T) {
	got := make(chan string, 1)
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- string(b) + " " + r.Trailer.Get("X-Sum")
		w.WriteHeader(http.StatusCreated)
	}))
	defer u.Close()
	e := startGateway(t, basicConfig, u.URL)
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", io.MultiReader(strings.NewReader(`{"order":"tr1"}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k-req-trailer")
	req.Header.Set("X-Account-Id", "acme")
	req.Trailer = http.Header{"X-Sum": {"42"}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%d", resp.StatusCode)
	}
	if s := <-got; s != `{"order":"tr1"} 42` {
		t.Fatalf("the upstream read %q; want the body and the trailer 42", s)
	}
}
