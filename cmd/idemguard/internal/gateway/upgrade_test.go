package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/conformance"
	"github.com/idemguard/idemguard/internal/testenv"
)

// upgradeTo asks url to switch to the echo protocol, with key.
func upgradeTo(t *testing.T, url, key string) conformance.Upgraded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"order":"ws"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Account-Id", "acme")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	return conformance.Upgrade(t, http.DefaultClient, req)
}

// An upstream that switches protocols (a WebSocket) on a guarded route:
// the client gets the 101 and the session through the gateway (the
// gateway read the 101's body, the switched connection, before sending
// anything, and so hung until the upstream closed a session the client
// could not start), and a request with the key during the session gets a
// 409. Once the session ended, the gateway's rule holds: the request
// reached the upstream, so a retry with the key is not forwarded again.
func TestUpgradeThroughGateway(t *testing.T) {
	for name, status := range map[string]bool{"101 then take": true, "take then 101": false} {
		t.Run(name, func(t *testing.T) {
			u := newUpstream(t)
			u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
				if r.Header.Get("Upgrade") == "" {
					return false
				}
				if status {
					w.Header().Set("Connection", "Upgrade")
					w.Header().Set("Upgrade", "echo")
					w.WriteHeader(http.StatusSwitchingProtocols)
				}
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return true
				}
				defer conn.Close()
				if !status {
					_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
				}
				fmt.Fprintf(brw, "run %d\n", u.count(order))
				_ = brw.Flush()
				_, _ = brw.ReadString('\n')
				return true
			})
			e := startGateway(t, basicConfig, u.URL)
			url := e.srv.URL + "/orders"
			first := upgradeTo(t, url, "k-ws")
			if first.Status != http.StatusSwitchingProtocols || first.Line != "run 1" {
				t.Fatalf("upgrade: %d %q (%s), want 101 and the session of run 1", first.Status, first.Line, first.Body)
			}
			if r := post(t, url, "k-ws", `{"order":"ws"}`, "X-Account-Id", "acme", "Connection", "Upgrade", "Upgrade", "echo"); r.status != http.StatusConflict {
				t.Fatalf("upgrade during the session: %d %q, want 409", r.status, r.body)
			}
			first.End(t)
			var again reply
			testenv.WaitFor(t, 10*time.Second, "a request with the key not answered 409", func() bool {
				again = post(t, url, "k-ws", `{"order":"ws"}`, "X-Account-Id", "acme", "Connection", "Upgrade", "Upgrade", "echo")
				return again.status != http.StatusConflict
			})
			if again.status == http.StatusSwitchingProtocols || u.count("ws") != 1 {
				t.Fatalf("retry after the session: %d %q, upstream ran %d upgrades; want it not forwarded again", again.status, again.body, u.count("ws"))
			}
			if !strings.Contains(string(again.body), "switched protocols") {
				t.Errorf("retry after the session: %q, want a detail that names the switch as a cause", again.body)
			}
		})
	}
}
