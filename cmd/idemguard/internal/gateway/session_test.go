package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// rawUpgrade sends a guarded request to switch to the echo protocol on a
// connection of its own and returns the answer and the session's reader.
func rawUpgrade(t *testing.T, base, key string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body := `{"order":"ws"}`
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Account-Id", "acme")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, res
}

// TestSwitchedSessionEndsAtRouteTimeout pins how long a switched session
// (a WebSocket) on a guarded route lasts: until the route's timeout,
// counted from the request. The timeout bounds the whole exchange with
// the upstream, and a session is part of that exchange: the gateway then
// closes both connections, whatever the client and the upstream are still
// saying. (Its MaxRun, the route's timeout plus its lease, comes later, so
// it never cuts a session first.) Afterwards the key answers the stored
// "outcome unknown" (the request reached the upstream), never a second
// forward. A WebSocket handshake is a GET, which the gateway never
// guards: only a guarded method that switches protocols is bounded so.
func TestSwitchedSessionEndsAtRouteTimeout(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	u := newUpstream(t)
	upstreamEnded := make(chan time.Time, 1)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
		if r.Header.Get("Upgrade") == "" {
			return false
		}
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "echo")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return true
		}
		defer conn.Close()
		for { // echo every line until the connection goes
			line, err := brw.ReadString('\n')
			if err != nil {
				upstreamEnded <- time.Now()
				return true
			}
			_, _ = brw.WriteString(line)
			_ = brw.Flush()
		}
	})
	e := startGateway(t, basicConfig+"    timeout: "+timeout.String()+"\n", u.URL)
	start := time.Now()
	conn, br, res := rawUpgrade(t, e.srv.URL, "k-long")
	if res.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("upgrade: %d %q, want 101", res.StatusCode, b)
	}
	if _, err := io.WriteString(conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); line != "hello\n" || err != nil {
		t.Fatalf("session: %q, %v; want the echo", line, err)
	}
	// The client stays in the session and says nothing more: the gateway
	// ends it (a blocking read, bounded far beyond the timeout).
	_ = conn.SetReadDeadline(start.Add(timeout + 15*time.Second))
	rest, err := io.ReadAll(br)
	cut := time.Since(start)
	if ne, ok := errors.AsType[net.Error](err); (ok && ne.Timeout()) || len(rest) != 0 {
		t.Fatalf("session end: %q, %v; want the gateway to close it", rest, err)
	}
	if cut < timeout-100*time.Millisecond || cut > timeout+15*time.Second {
		t.Errorf("session closed %s after the request, want at the route's timeout (%s)", cut, timeout)
	}
	select {
	case at := <-upstreamEnded:
		if d := at.Sub(start); d < timeout-100*time.Millisecond {
			t.Errorf("the upstream's side ended %s after the request, before the route's timeout %s", d, timeout)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream's side of the session was not closed")
	}
	t.Logf("session cut after %s (route timeout %s)", cut, timeout)
	testenv.WaitFor(t, 10*time.Second, "the cut logged", func() bool {
		return strings.Contains(e.logs.String(), "a switched session was closed at the route's timeout")
	})
	// The key is let go as the gateway's handler returns, just after the cut.
	var r reply
	testenv.WaitFor(t, 10*time.Second, "a request with the key not answered 409", func() bool {
		r = post(t, e.srv.URL+"/orders", "k-long", `{"order":"ws"}`, "X-Account-Id", "acme", "Connection", "Upgrade", "Upgrade", "echo")
		return r.status != http.StatusConflict
	})
	if r.status != http.StatusInternalServerError || r.problemType() != "https://idemguard.dev/problems/upstream-outcome-unknown" {
		t.Errorf("a request with the key after the session: %d %q, want the stored 500, outcome unknown", r.status, r.body)
	}
	if n := u.count("ws"); n != 1 {
		t.Errorf("the upstream got %d upgrades, want 1", n)
	}
}
