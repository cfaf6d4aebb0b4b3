package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestUpgradeIsNotStored: a handler that switches protocols (a WebSocket)
// gave no answer a replay could repeat, yet a marker of it was stored as
// the key's final answer: a client that upgraded again with the key got
// a 200 problem ("response not kept") instead of a new session. The key
// is released when the session ends: each upgrade runs the handler and
// switches. Handlers switch in two ways: WriteHeader(101) and then take
// the connection (coder/websocket), or take the connection and write the
// 101 on it (gorilla/websocket, httputil.ReverseProxy).
func TestUpgradeIsNotStored(t *testing.T) {
	for name, status := range map[string]bool{"101 then hijack": true, "hijack then 101": false} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if status {
					w.Header().Set("Connection", "Upgrade")
					w.Header().Set("Upgrade", "echo")
					w.WriteHeader(http.StatusSwitchingProtocols)
				}
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				if !status {
					brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
				}
				brw.WriteString(strings.Repeat("s", int(n)))
				brw.Flush()
			})
			// returned tells when the Guard is done with a request (the
			// key released), so the next upgrade does not find it held.
			returned := make(chan struct{}, 2)
			g := guarded(e, h, httpx.Options{})
			srv, c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { returned <- struct{}{} }()
				g.ServeHTTP(w, r)
			}))
			for i := 1; i <= 2; i++ {
				req, _ := http.NewRequest("POST", srv.URL+"/ws", strings.NewReader("a"))
				req.Header.Set("Idempotency-Key", "up-1")
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "echo")
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusSwitchingProtocols || string(b) != strings.Repeat("s", i) {
					t.Fatalf("upgrade %d: %d %q, want 101 and the session of run %d", i, resp.StatusCode, b, i)
				}
				<-returned
			}
			if n := runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
			if n := e.records(t); n != 0 {
				t.Fatalf("%d records left under the key, want none", n)
			}
		})
	}
}
