package gateway

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
)

// an answer whose body ends with the connection (no
// Content-Length, not chunked: HTTP/1.0, or "Connection: close", as
// Python's wsgiref and http.server send) and is labelled gzip, cut off
// mid-stream (the upstream process died while it wrote): the transport
// sees a clean end, but the gzip stream itself says it ended early (a
// valid header, then no end of its data). The gateway takes that for "an
// answer labelled gzip that does not decode" and stores the truncated
// bytes as the upstream's complete answer, replayed to every retry for
// the key's ttl. README: "nothing frees the key ... an answer that never
// came back whole" is an unknown outcome, and the gateway holds the
// answer "so a body that breaks within it is an unknown outcome, not a
// truncated response stored as complete" (holdAnswer).
func TestTruncatedGzipIsNotStoredAsComplete(t *testing.T) {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, `{"order":"gz-cut","items":"`+strings.Repeat("abcdefghij", 400)+`"}`)
	_ = zw.Close()
	cut := zb.Bytes()[:zb.Len()/2] // a valid gzip header and half its data

	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return true
		}
		_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n")
		_, _ = brw.Write(cut)
		_ = brw.Flush()
		_ = conn.Close() // the process died mid-body: a FIN, the end of a close-delimited body
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	// A client that reads the bytes as they come (no decoding of its own).
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	post := func(key, body string) reply {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Account-Id", "acme")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}
	first := post("k-gz-cut", `{"order":"gz-cut"}`)
	if first.status == http.StatusCreated {
		t.Errorf("first: 201 with %d bytes (Content-Encoding %q): a gzip stream cut in half passed as the upstream's answer",
			len(first.body), first.header.Get("Content-Encoding"))
	}
	again := post("k-gz-cut", `{"order":"gz-cut"}`)
	if again.status != http.StatusInternalServerError || again.problemType() != ProblemOutcomeUnknown {
		t.Fatalf("retry: %d replayed=%v %d bytes; want the 500 %s: the answer never came back whole",
			again.status, again.replayed(), len(again.body), ProblemOutcomeUnknown)
	}
	if n := u.count("gz-cut"); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// The same gzip stream without its end, but framed (chunked: the
// transport saw the whole body arrive): the upstream's encoder was never
// closed, the answer came whole. That is still the upstream's answer,
// kept as it came (TestUndecodableGzipAnswerKeptAsItCame), not an unknown
// outcome: only an unframed body's early end is taken for a cut.
func TestUnfinishedGzipFramedIsKept(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, `{"order":"gz-open"}`)
		_ = zw.Flush() // never closed: no gzip trailer
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	var first []byte
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"gz-open"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-gz-open")
		req.Header.Set("X-Account-Id", "acme")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("request %d: %d %v %v; want the upstream's 201 as it came", i, resp.StatusCode, resp.Header, err)
		}
		if i == 0 {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Fatalf("replay differs from the first answer")
		}
	}
	if n := u.count("gz-open"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}
