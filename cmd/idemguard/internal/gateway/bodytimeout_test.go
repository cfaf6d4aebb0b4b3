package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// bodyTimeoutConfig is basicConfig with a client_body_timeout of 1 s.
const bodyTimeoutConfig = `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
client_body_timeout: 1s
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`

// sendHead writes a guarded POST's request line and header, announcing
// body's length, and the first n bytes of body.
func sendHead(t *testing.T, c net.Conn, key, body string, n int) {
	t.Helper()
	_, err := fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"+
		"Idempotency-Key: %s\r\nX-Account-Id: acme\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body[:n])
	if err != nil {
		t.Fatal(err)
	}
}

// TestBodyIdleTimeout: a client that sends its header and then trickles
// its body (slowloris) held a connection and a goroutine of the gateway
// for as long as it liked: the server bounded the header only. Now each
// read of a body must bring data within client_body_timeout, as nginx's
// client_body_timeout: the stalled client is cut off, its key is not
// left claimed (the body is read before the claim), and a client that
// sends slowly but steadily, for longer than the timeout in all, is
// served.
func TestBodyIdleTimeout(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, bodyTimeoutConfig, u.URL)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	body := `{"order":"slow1"}`

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sendHead(t, c, "k-slow", body, 5) // and then nothing
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	got, err := io.ReadAll(c) // until the gateway closes the connection
	held := time.Since(start)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a client that stalled mid-body is still connected after %v", held)
	}
	status, _, _ := strings.Cut(string(got), "\r\n")
	t.Logf("stalled client cut off after %v: %q", held.Round(time.Millisecond), status)
	if !strings.HasPrefix(status, "HTTP/1.1 400 ") || !strings.Contains(string(got), "client_body_timeout") || strings.Contains(string(got), "127.0.0.1") {
		t.Errorf("stalled client's answer: %q; want 400 naming client_body_timeout, not the socket's addresses", got)
	}
	if held < 800*time.Millisecond {
		t.Errorf("stalled client cut off after %v, before client_body_timeout (1s)", held)
	}
	if n := u.count("slow1"); n != 0 {
		t.Fatalf("the stalled request reached the upstream %d times", n)
	}
	// Its key was not left claimed: the retry, whole, is forwarded.
	if r := post(t, e.srv.URL+"/orders", "k-slow", body, "X-Account-Id", "acme"); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the stalled request's retry: %d (replayed %v) %s; want 201, forwarded", r.status, r.replayed(), r.body)
	}
	if n := u.count("slow1"); n != 1 {
		t.Fatalf("slow1 reached the upstream %d times, want 1", n)
	}

	// Passed through unguarded, the body streams to the upstream: a stall
	// is cut off as well.
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := fmt.Fprintf(c3, "PUT /other HTTP/1.1\r\nHost: gateway\r\nContent-Length: 100\r\n\r\nsome"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_ = c3.SetReadDeadline(start.Add(10 * time.Second))
	got, err = io.ReadAll(c3)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a client that stalled mid-body on a pass-through is still connected after %v", time.Since(start))
	}
	status, _, _ = strings.Cut(string(got), "\r\n")
	t.Logf("stalled pass-through client cut off after %v: %q", time.Since(start).Round(time.Millisecond), status)

	// Slow but steady: a chunk every 250 ms, 2 s in all.
	steady := `{"order":"steady1","pad":"` + strings.Repeat("x", 64) + `"}`
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	sendHead(t, c2, "k-steady", steady, 0)
	const chunks = 8
	for i := range chunks {
		time.Sleep(250 * time.Millisecond) // the client's pace, not a synchronisation
		if _, err := io.WriteString(c2, steady[i*len(steady)/chunks:(i+1)*len(steady)/chunks]); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatalf("slow but steady upload: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || u.count("steady1") != 1 {
		t.Fatalf("slow but steady upload: %d %s, upstream saw it %d times; want 201, once", res.StatusCode, b, u.count("steady1"))
	}
}
