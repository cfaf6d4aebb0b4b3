package inventory_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestTwoServeMuxes: a service with two listeners lists both muxes in one
// inventory. The public mux's catch-all serves POST /orders unguarded
// whatever the admin mux registers for POST /orders. (Within one mux a
// method's pattern settles nothing either: TestServeMuxMethodCase.) Rows
// equal once settled are listed once.
func TestTwoServeMuxes(t *testing.T) {
	idem := httpx.Guard(newGuard(time.Hour), httpx.Options{SingleCaller: true})
	inv := inventory.New(inventory.Options{})
	public := inventory.NewServeMux(inv, nil)
	public.Handle("/orders", ok)
	public.Handle("/carts", ok)
	public.Handle("POST /carts", ok, idem)
	public.Handle("GET /healthz", ok)
	admin := inventory.NewServeMux(inv, nil)
	admin.Handle("POST /orders", ok, idem)
	admin.Handle("GET /healthz", ok)
	invtest.SameRows(t, inv, []string{
		"http | /carts | POST | hard | header | Idempotency-Key | global | 1h | ServeMux",
		"http | /carts | * | none |  |  |  |  | ServeMux | GAP | every method, unguarded: PATCH, POST",
		"http | /healthz | GET | none |  |  |  |  | ServeMux",
		"http | /orders | POST | hard | header | Idempotency-Key | global | 1h | ServeMux",
		"http | /orders | * | none |  |  |  |  | ServeMux | GAP | every method, unguarded: PATCH, POST",
	})
}

// TestRouteNodeNotComparable: a Node that cannot be compared is refused
// by name when the route is added, not later by a map in the middle of a
// walk.
func TestRouteNodeNotComparable(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "Route.Node of type []int is not comparable") {
			t.Fatalf("recovered %q", msg)
		}
		if n := len(inv.Entries()); n != 0 {
			t.Fatalf("%d entries", n)
		}
	}()
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: "/x", Handler: ok, Node: []int{1}})
}
