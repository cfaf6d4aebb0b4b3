package inventory_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/inventory"
)

// A nil middleware given to ServeMux.Handle (a variable left unset, say
// the authentication of a test setup) is a programmer's error: Handle
// panics naming the pattern and the argument, as for a nil handler, and
// registers and lists nothing. It panicked with a nil pointer dereference
// that named neither.
func TestServeMuxNilMiddleware(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil)
	var authenticate func(http.Handler) http.Handler // never set
	plain := func(h http.Handler) http.Handler { return h }
	msg := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		mux.Handle("POST /orders", ok, plain, authenticate)
		return ""
	}()
	if !strings.Contains(msg, "nil middleware") || !strings.Contains(msg, "POST /orders") {
		t.Errorf("Handle with a nil middleware panicked with %q, want one naming the nil middleware and the pattern", msg)
	}
	if n := len(inv.Entries()); n != 0 {
		t.Errorf("%d entries listed, want none", n)
	}
	mux.Handle("POST /orders", ok, plain) // the pattern is still free
}
