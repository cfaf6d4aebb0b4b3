package gateway

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/httpx"
)

// TestReplayReadableWhateverTheRetryAccepts: the stored answer is one
// every retry can read. The first request accepts gzip and the upstream
// compresses; a retry that accepts only identity (or says nothing, as
// Python's urllib does, and does not decompress) still gets the plain
// body, not gzip bytes it never asked for.
func TestReplayReadableWhateverTheRetryAccepts(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Type", "text/plain")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "created")
			return true
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, "created")
		_ = zw.Close()
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	// A transport that neither adds Accept-Encoding nor decompresses: the
	// client's own header goes out as set, and the body comes back as sent.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	for i, accept := range []string{"gzip", "identity", ""} {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"z1"}`))
		req.Header.Set("Idempotency-Key", "k-gzip")
		req.Header.Set("X-Account-Id", "acme")
		if accept != "" {
			req.Header.Set("Accept-Encoding", accept)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" && accept == "gzip" {
			if body, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		b, err := io.ReadAll(body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || string(b) != "created" {
			t.Fatalf("request %d (Accept-Encoding %q): %d %q %v, %v; want 201 \"created\"", i, accept, resp.StatusCode, b, resp.Header, err)
		}
	}
	if n := u.count("z1"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

// TestUndecodableGzipAnswerKeptAsItCame: an upstream that answers with
// Content-Encoding: gzip and a body that is no gzip still answered: its
// effect happened and its status says how it went. That answer is the
// key's result as the upstream sent it (status, headers, the bytes as they
// came, Content-Encoding included), the same for the first caller and every
// retry, which never reaches the upstream; not a 500 outcome-unknown.
func TestUndecodableGzipAnswerKeptAsItCame(t *testing.T) {
	const raw = "this is not gzip"
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, raw)
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"bad-gzip"}`))
		req.Header.Set("Idempotency-Key", "k-bad-gzip")
		req.Header.Set("X-Account-Id", "acme")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || string(b) != raw ||
			resp.Header.Get("Content-Encoding") != "gzip" || (resp.Header.Get("Idempotent-Replayed") == "true") != (i > 0) {
			t.Fatalf("request %d: %d %q %v, %v; want the upstream's 201 with its gzip-labelled bytes as they came", i, resp.StatusCode, b, resp.Header, err)
		}
	}
	if n := u.count("bad-gzip"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
	if !strings.Contains(e.logs.String(), "does not decode") {
		t.Errorf("no log line about the undecodable answer:\n%s", e.logs.String())
	}
}

// TestGzipAnswerOverTheLimitStreamsDecoded: the gateway decodes gzip
// itself; an answer longer (decoded) than max_stored_response still
// reaches the first caller whole and plain, and a retry gets the
// response-not-kept problem, not a second run. A gzip answer whose
// connection breaks before its end is still an unknown outcome.
func TestGzipAnswerOverTheLimitStreamsDecoded(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 4096) // 64 KiB, a few hundred bytes compressed
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		if order == "broken" {
			w.Header().Set("Content-Length", "100000")
		}
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, big)
		if order == "broken" {
			_ = zw.Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
			return true
		}
		_ = zw.Close()
		return true
	})
	e := startGateway(t, basicConfig+"    max_stored_response: 4KiB\n", u.URL)
	r := post(t, e.srv.URL+"/orders", "k-gz-big", `{"order":"gz-big"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.body != big || r.header.Get("Content-Encoding") != "" {
		t.Fatalf("first: %d, %d bytes, Content-Encoding %q; want 201 and the %d bytes plain", r.status, len(r.body), r.header.Get("Content-Encoding"), len(big))
	}
	again := post(t, e.srv.URL+"/orders", "k-gz-big", `{"order":"gz-big"}`, "X-Account-Id", "acme")
	if again.status != http.StatusCreated || !again.replayed() || again.problemType() != httpx.ProblemResponseNotKept {
		t.Fatalf("replay: %d %q", again.status, again.body)
	}
	if n := u.count("gz-big"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
	e2 := startGateway(t, basicConfig, u.URL)
	r = post(t, e2.srv.URL+"/orders", "k-gz-broken", `{"order":"broken"}`, "X-Account-Id", "acme")
	if r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown {
		t.Fatalf("a gzip answer cut off: %d %q; want 500 outcome-unknown", r.status, r.body)
	}
}
