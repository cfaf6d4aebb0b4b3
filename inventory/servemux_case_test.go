package inventory_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestServeMuxMethodCase: http.ServeMux matches a pattern's method in
// its exact case, so a "patch" request (as fetch sends PATCH) is served
// by the path's catch-all, not by its guarded "PATCH /orders"; a "post
// /quotes" pattern takes no POST at all. A method's own pattern never
// settles a catch-all on a ServeMux: its unsafe methods stay gaps.
func TestServeMuxMethodCase(t *testing.T) {
	idem := httpx.Guard(newGuard(time.Hour), httpx.Options{SingleCaller: true})
	var served []string
	mark := func(name string) http.Handler {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = append(served, name) })
	}
	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil)
	mux.Handle("PATCH /orders", mark("guarded"), idem)
	mux.Handle("/orders", mark("catch-all"))
	mux.Handle("post /quotes", mark("guarded"), idem)
	mux.Handle("/quotes", mark("catch-all"))
	for _, req := range []*http.Request{
		httptest.NewRequest("patch", "/orders", nil),
		httptest.NewRequest("POST", "/quotes", nil),
	} {
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(served) != 2 || served[0] != "catch-all" || served[1] != "catch-all" {
		t.Fatalf("served %v", served)
	}
	invtest.SameRows(t, inv, []string{
		"http | /orders | PATCH | hard | header | Idempotency-Key | global | 1h | ServeMux",
		"http | /orders | * | none |  |  |  |  | ServeMux | GAP | every method, unguarded: PATCH, POST",
		"http | /quotes | POST | hard | header | Idempotency-Key | global | 1h | ServeMux",
		"http | /quotes | * | none |  |  |  |  | ServeMux | GAP | every method, unguarded: PATCH, POST",
	})
}
