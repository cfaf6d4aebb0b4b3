package gateway

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestFailOpenLogsNoKey: the README promises logs with keys as digests
// (log.keys: true logs them in full). Under fail-open, package fallback
// logs every request it lets through unguarded with its key's text, the
// caller and the client's key in clear: the gateway's own lines kept
// them out, this one did not.
func TestFailOpenLogsNoKey(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String() // nothing listens there once closed
	_ = ln.Close()
	u := newUpstream(t)
	tmpl := `
upstream: {upstream}
redis: {addrs: ["` + dead + `"], prefix: "{prefix}"}
fallback: {policy: fail-open}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`
	for _, full := range []bool{false, true} {
		text := tmpl
		if full {
			text += "log: {keys: true}\n"
		}
		e := startGateway(t, text, u.URL)
		r := post(t, e.srv.URL+"/orders", "k-secret-4711", `{"order":"fo"}`, "X-Account-Id", "acct-secret-0815")
		if r.status != http.StatusCreated {
			t.Fatalf("fail-open with Redis down: %d %q; want the upstream's 201", r.status, r.body)
		}
		logs := e.logs.String()
		if !strings.Contains(logs, "UNGUARDED") {
			t.Fatalf("no fail-open line in the log:\n%s", logs)
		}
		for _, s := range []string{"k-secret-4711", "acct-secret-0815"} {
			if got := strings.Contains(logs, s); got != full {
				t.Errorf("log.keys %v: the log names %q: %v; want %v:\n%s", full, s, got, full, logs)
			}
		}
	}
}
