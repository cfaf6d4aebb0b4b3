package inventory_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
)

// TestGuardMethodsListedUpperCaseOnce: httpx.Options.Methods are taken "in
// any case", and a route's own method is listed in upper case (Entry.Method
// is the HTTP method). The rows an any-method route's guard gives keep the
// guard's spelling: Methods {"post"} lists a "post" row (sorted after
// every usual method), and {"POST", "post"} lists POST twice.
func TestGuardMethodsListedUpperCaseOnce(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil)
	mux.Handle("/pay", ok, httpx.Guard(newGuard(time.Hour), httpx.Options{SingleCaller: true, Methods: []string{"POST", "post"}}))
	var methods []string
	for _, e := range inv.Entries() {
		methods = append(methods, e.Method)
		if e.Method != inventory.AnyMethod && e.Method != "POST" {
			t.Errorf("row with method %q for a guard on POST: want POST, once", e.Method)
		}
	}
	if len(methods) != 2 {
		t.Errorf("methods %q, want [POST *]", methods)
	}
}
