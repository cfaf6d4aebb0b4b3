package inventory_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/inventory"
)

// TestMarkdownControlCharacters: a pattern or group name with terminal
// control sequences, bidirectional overrides or bytes that are not UTF-8
// is written escaped, so that the table printed in a terminal (idemguard
// inventory, curl of the debug endpoint) cannot erase, recolour or reorder
// a row, and the gap column reads as written.
func TestMarkdownControlCharacters(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: "/a\x1b[2K\x1b[1A\u202e\xff\x7f", Handler: ok})
	inv.AddConsumer("g\x08\x08\u2066", "t\x00", inventory.Policy{})
	var b strings.Builder
	if err := inv.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`| /a\x1b[2K\x1b[1A\u202e\xff\x7f | POST | none |`,
		`| consumer group g\b\b\u2066 | t\x00 | hard |`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	for i, r := range out {
		if r != '\n' && (r < ' ' || r == 0x7f || r == '\u202e' || r == '\u2066' || r == '\ufffd') {
			t.Fatalf("raw %U at %d in\n%q", r, i, out)
		}
	}
}

// TestJSONKeepsPatterns: JSON carries a pattern with quotes, backslashes
// and control characters as it is, and consumer groups of one name with
// different settings (two processors) as two entries, neither hidden.
func TestJSONKeepsPatterns(t *testing.T) {
	pattern := "/a\"b\\c\x1b\n\u2028</script>"
	inv := inventory.New(inventory.Options{})
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: pattern, Handler: ok})
	inv.AddConsumer("shipping", "order.paid", inventory.Policy{TTL: time.Hour})
	inv.AddConsumer("shipping", "order.paid", inventory.Policy{TTL: time.Minute, KeySource: inventory.KeyComputed})
	body, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Entries []struct {
			Handler, Method, TTL string
			Gap                  bool
		} `json:"entries"`
		Gaps int `json:"gaps"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if len(doc.Entries) != 3 || doc.Gaps != 1 || doc.Entries[0].Handler != pattern || !doc.Entries[0].Gap ||
		doc.Entries[1].TTL == doc.Entries[2].TTL {
		t.Fatalf("%s", body)
	}
}
