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
)

// echoSessions makes u switch to the echo protocol for every request that
// asks (Upgrade: echo), echoing lines until either side closes; ended gets
// a value as each session's upstream side ends.
func echoSessions(t *testing.T, u *upstream) (ended chan struct{}) {
	ended = make(chan struct{}, 4)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
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
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				ended <- struct{}{}
				return true
			}
			_, _ = brw.WriteString(line)
			_ = brw.Flush()
		}
	})
	return ended
}

// openSession switches a connection of its own to the echo protocol with
// a request of method to path, and checks one line goes both ways.
func openSession(t *testing.T, base, method, path, key string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req, _ := http.NewRequest(method, base+path, strings.NewReader(`{"order":"sess-`+key+`"}`))
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
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%s %s: %v, %v; want 101", method, path, res, err)
	}
	if _, err := io.WriteString(conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); line != "hello\n" || err != nil {
		t.Fatalf("session: %q, %v; want the echo", line, err)
	}
	return conn, br
}

// TestSessionsEndAtShutdown: switched sessions (a WebSocket passed
// through, a guarded request that switched) are connections net/http's
// Shutdown no longer tracks. They get the shutdown timeout like requests
// in flight; then the gateway closes both their connections, logs each
// one it cut and how many were open, and Serve returns only once they are
// closed (before, Serve returned with them open, and the process's exit
// cut them with no word).
func TestSessionsEndAtShutdown(t *testing.T) {
	u := newUpstream(t)
	ended := echoSessions(t, u)
	cfg, _ := config(t, strings.Replace(basicConfig, "redis:", "shutdown_timeout: 300ms\nredis:", 1), u.URL)
	e := startConfigured(t, cfg)
	url, stop := serving(t, e.gw)
	passed, pbr := openSession(t, url, http.MethodGet, "/ws", "k-pass")
	guarded, gbr := openSession(t, url, http.MethodPost, "/orders", "k-sess")

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]struct {
		c  net.Conn
		br *bufio.Reader
	}{"passed through": {passed, pbr}, "guarded": {guarded, gbr}} {
		// Serve returned: the session is closed already (the deadline only
		// bounds a read that would otherwise hang).
		_ = s.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		rest, err := io.ReadAll(s.br)
		if ne, ok := errors.AsType[net.Error](err); (ok && ne.Timeout()) || len(rest) != 0 {
			t.Errorf("%s session after Serve returned: %q, %v; want it closed by the gateway", name, rest, err)
		}
	}
	for range 2 {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("an upstream side of a session was not closed")
		}
	}
	logs := e.logs.String()
	if n := strings.Count(logs, "a switched session was closed at shutdown"); n != 2 {
		t.Errorf("%d log lines for the sessions cut, want 2:\n%s", n, logs)
	}
	if !strings.Contains(logs, `"sessions":2`) {
		t.Errorf("no line counting the sessions open at the shutdown timeout:\n%s", logs)
	}
}
