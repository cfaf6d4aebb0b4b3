package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestInventoryCommand: `idemguard inventory` lists the demo's own route
// and consumer, as the demo registers them.
func TestInventoryCommand(t *testing.T) {
	code, out, stderr := cli(t, "inventory")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"| path/handler | method/type | idempotency_required | key_source | dedup_scope | key | ttl | gap |",
		"| /orders | POST | hard | header | tenant | Idempotency-Key | 10m |  |",
		"| consumer group billing | order (Redis stream) | hard | computed | global | Options.Key | 10m |  |",
		"No gaps",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, stderr = cli(t, "inventory", "--format", "json", "--unsafe", "post, patch,PUT")
	if code != 0 {
		t.Fatalf("json: exit %d: %s", code, stderr)
	}
	var doc struct {
		Entries []struct {
			Kind, Handler, Method string
			Required              string  `json:"idempotency_required"`
			KeySource             string  `json:"key_source"`
			Scope                 string  `json:"dedup_scope"`
			TTLSeconds            float64 `json:"ttl_seconds"`
		} `json:"entries"`
		Gaps int `json:"gaps"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(doc.Entries) != 2 || doc.Gaps != 0 {
		t.Fatalf("%+v", doc)
	}
	if e := doc.Entries[0]; e.Kind != "http" || e.Handler != "/orders" || e.Method != "POST" || e.Required != "hard" ||
		e.KeySource != "header" || e.Scope != "tenant" || e.TTLSeconds != 600 {
		t.Errorf("route %+v", e)
	}
	if e := doc.Entries[1]; e.Kind != "consumer" || e.Handler != "billing" || e.Scope != "global" {
		t.Errorf("consumer %+v", e)
	}

	code, _, stderr = cli(t, "inventory", "--format", "yaml")
	wantError(t, code, stderr, 2, `--format "yaml"`)
	for _, bad := range []string{"PO/ST", "PO ST", "PÖST", `PO"ST`} {
		code, _, stderr = cli(t, "inventory", "--unsafe", bad)
		// As the terminal shows it: a quoted value's \" as \\" (oneLine).
		wantError(t, code, stderr, 2, oneLine(fmt.Sprintf("%q is not an HTTP method", strings.ToUpper(bad))))
	}
	// Any token is a method (RFC 9110): M-SEARCH (UPnP), VERSION-CONTROL (WebDAV).
	if code, _, stderr = cli(t, "inventory", "--unsafe", "POST,m-search,VERSION-CONTROL"); code != 0 {
		t.Errorf("--unsafe with methods that have a '-': exit %d: %s", code, stderr)
	}
	code, _, stderr = cli(t, "inventory", "--unsafe", " , ")
	wantError(t, code, stderr, 2, "no methods")
	code, _, stderr = cli(t, "inventory", "extra")
	wantError(t, code, stderr, 2, `unexpected argument "extra"`)
}
