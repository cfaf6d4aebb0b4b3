package conformance

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// UpgradeOptions say how a binding runs a switched protocol.
type UpgradeOptions struct {
	// SessionAfterReturn: the framework runs the switched protocol after
	// the handlers returned (fasthttp's Hijack, so Fiber), so the guard
	// is done with the request, and the key released, when the session
	// starts: a request with the key meanwhile runs the handler again.
	// Otherwise (net/http, Gin, Echo) the session runs inside the
	// handler, and the key stays held, answering 409 to another request
	// with it, until the session ends.
	SessionAfterReturn bool
}

// RunUpgrade checks a binding's guard over a handler that switches
// protocols (a WebSocket), in both ways handlers do it (Resp.Switch):
// the client gets its 101 and the session, nothing is stored under the
// key (a 101 is no answer a replay could repeat), and the key is
// released when the guard is done with the request, so that the next
// upgrade with the key runs the handler and switches again, and a plain
// request with the key afterwards runs the handler rather than replaying
// anything. newServer's server must support Resp.Switch.
func RunUpgrade(t *testing.T, newServer NewServer, opts UpgradeOptions) {
	for name, status := range map[string]int{"101 then take": http.StatusSwitchingProtocols, "take then 101": 0} {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int64
			handler := func(_ context.Context, r Req) Resp {
				n := runs.Add(1)
				if r.Header.Get("Upgrade") == "" {
					return Resp{Status: http.StatusCreated, Body: fmt.Appendf(nil, "plain run %d", n)}
				}
				session := func(rw *bufio.ReadWriter) {
					if status == 0 {
						_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
					}
					fmt.Fprintf(rw, "run %d\n", n)
					_ = rw.Flush()
					_, _ = rw.ReadString('\n') // the client's goodbye
				}
				return Resp{Status: status, Header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {"echo"}}, Switch: session}
			}
			c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}, handler))
			first := c.upgrade("up")
			if first.Status != http.StatusSwitchingProtocols || first.Line != "run 1" {
				t.Fatalf("upgrade: %d %q (%s), want 101 and the session of run 1", first.Status, first.Line, first.Body)
			}
			// A request with the key while the session runs.
			if opts.SessionAfterReturn {
				during := c.upgrade("up")
				if during.Status != http.StatusSwitchingProtocols || during.Line != "run 2" {
					t.Fatalf("upgrade during the session: %d %q (%s), want 101 and a session of its own", during.Status, during.Line, during.Body)
				}
				during.End(t)
			} else {
				during := c.do("POST", "/charges", `{}`, key, "up", "Connection", "Upgrade", "Upgrade", "echo")
				if during.status != http.StatusConflict || during.problem(t).Type != httpx.ProblemInFlight {
					t.Fatalf("upgrade during the session: %d %s, want 409 in flight", during.status, during.body)
				}
			}
			first.End(t)
			// The key is released once the guard is done with the first
			// request, which may come a moment after the session's end.
			var again Upgraded
			testenv.WaitFor(t, 10*time.Second, "an upgrade with the key not answered 409", func() bool {
				again = c.upgrade("up")
				return again.Status != http.StatusConflict
			})
			want := fmt.Sprintf("run %d", runs.Load())
			if again.Status != http.StatusSwitchingProtocols || again.Line != want || again.Replayed {
				t.Fatalf("upgrade after the session: %d %q (%s), want 101 and %q", again.Status, again.Line, again.Body, want)
			}
			again.End(t)
			var plain reply
			testenv.WaitFor(t, 10*time.Second, "a plain request with the key not answered 409", func() bool {
				plain = c.do("POST", "/charges", `{}`, key, "up")
				return plain.status != http.StatusConflict
			})
			if want := fmt.Sprintf("plain run %d", runs.Load()); plain.status != http.StatusCreated ||
				plain.header.Get(httpx.ReplayedHeader) != "" || string(plain.body) != want {
				t.Fatalf("plain request after the upgrades: %d %v %q, want 201 %q, not a replay", plain.status, plain.header, plain.body, want)
			}
		})
	}
}

// Upgraded is an upgrade request as its client saw it: the status, and
// for a 101 the session's first line and the switched connection.
type Upgraded struct {
	Status   int
	Replayed bool   // the answer carried httpx.ReplayedHeader
	Body     string // a non-101 answer's body
	Line     string // a 101's first line of the session
	conn     io.ReadWriteCloser
	r        *bufio.Reader
}

// Upgrade sends req, a request to switch protocols, on client and reads
// the answer: for a 101, the session's first line. client must have no
// Timeout, which would keep the switched connection from the caller (the
// body of a 101 is the connection).
func Upgrade(t testing.TB, client *http.Client, req *http.Request) Upgraded {
	t.Helper()
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	u := Upgraded{Status: res.StatusCode, Replayed: res.Header.Get(httpx.ReplayedHeader) != ""}
	if res.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		u.Body = string(b)
		return u
	}
	conn, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("101 without a connection to switch: %T", res.Body)
	}
	u.conn, u.r = conn, bufio.NewReader(conn)
	line, err := u.r.ReadString('\n')
	if err != nil {
		conn.Close()
		t.Fatalf("session: %q, %v", line, err)
	}
	u.Line = strings.TrimSuffix(line, "\n")
	return u
}

// End says goodbye on a switched connection and waits for the server to
// close the session.
func (u Upgraded) End(t testing.TB) {
	t.Helper()
	defer u.conn.Close()
	if _, err := io.WriteString(u.conn, "bye\n"); err != nil {
		t.Fatalf("session: %v", err)
	}
	if rest, err := io.ReadAll(u.r); err != nil || len(rest) != 0 {
		t.Fatalf("session end: %q, %v", rest, err)
	}
}

// upgrade asks to switch to the echo protocol with key k.
func (c *client) upgrade(k string) Upgraded {
	c.t.Helper()
	req, err := http.NewRequest("POST", c.base+"/charges", strings.NewReader(`{}`))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(key, k)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	return Upgrade(c.t, &http.Client{Transport: c.c.Transport}, req)
}
