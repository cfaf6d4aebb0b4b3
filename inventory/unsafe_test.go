package inventory_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/inventory"
)

// TestUnsafeMethodsAsConfigured: UnsafeMethods read from configuration
// (strings.Split of "POST, PUT", or of an unset variable) keep their
// methods: spaces around a method are dropped, and a list with no method
// in it is the default, never "no method is unsafe" (which would list
// every route as no gap).
func TestUnsafeMethodsAsConfigured(t *testing.T) {
	for _, tc := range []struct {
		unsafe []string
		gaps   string
	}{
		{strings.Split("post, put", ","), "POST,PUT"},
		{strings.Split("", ","), "PATCH,POST"},
		{[]string{" ", "\tdelete "}, "DELETE"},
	} {
		inv := inventory.New(inventory.Options{UnsafeMethods: tc.unsafe})
		for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "GET"} {
			inv.AddRoute(inventory.Route{Router: "r", Method: m, Pattern: "/x", Handler: ok})
		}
		var gaps []string
		for _, e := range inv.Gaps() {
			gaps = append(gaps, e.Method)
		}
		slices.Sort(gaps)
		if got := strings.Join(gaps, ","); got != tc.gaps {
			t.Errorf("UnsafeMethods %q: gaps %s, want %s", tc.unsafe, got, tc.gaps)
		}
	}
}
