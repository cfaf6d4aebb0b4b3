// Package invtest holds what the inventory's router tests share.
package invtest

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/inventory"
)

// Row is the part of an Entry the router tests compare, as one string.
func Row(e inventory.Entry) string {
	s := strings.Join([]string{string(e.Kind), e.Handler, e.Method, string(e.Required), string(e.KeySource),
		e.Key, string(e.Scope), inventory.FormatTTL(e.TTL), e.Router}, " | ")
	if e.Gap {
		s += " | GAP"
	}
	if e.Note != "" {
		s += " | " + e.Note
	}
	return s
}

// Rows is every entry of inv, as Row writes it.
func Rows(inv *inventory.Inventory) []string {
	var out []string
	for _, e := range inv.Entries() {
		out = append(out, Row(e))
	}
	return out
}

// SameRows fails t unless inv's rows are want.
func SameRows(t testing.TB, inv *inventory.Inventory, want []string) {
	t.Helper()
	if got := Rows(inv); !slices.Equal(got, want) {
		t.Fatalf("inventory:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
