package inventory_test

import (
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// switchable is a Guarded handler of another library that reports what it
// enforces now: nothing while it is switched off, or a requirement this
// package does not know.
type switchable struct {
	http.Handler
	required inventory.Requirement
}

func (s switchable) IdempotencyPolicy() inventory.Policy {
	return inventory.Policy{Required: s.required, KeySource: inventory.KeyHeader, Key: "Idempotency-Key", Scope: inventory.ScopeGlobal}
}

// TestGuardRequiringNothing: a guard that says it requires no key
// (RequireNone), or something other than soft or hard, guards nothing the
// inventory can vouch for: its unsafe routes are gaps. A guard that lists
// no methods acts on every method: its any-method route is one row with
// its policy, not a row saying "none".
func TestGuardRequiringNothing(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: "/off", Handler: switchable{ok, inventory.RequireNone}})
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: "/odd", Handler: switchable{ok, "sometimes"}})
	inv.AddRoute(inventory.Route{Router: "r", Pattern: "/any", Handler: switchable{ok, inventory.RequireNone}})
	inv.AddRoute(inventory.Route{Router: "r", Method: "POST", Pattern: "/on", Handler: switchable{ok, ""}})
	inv.AddRoute(inventory.Route{Router: "r", Pattern: "/all", Handler: switchable{ok, inventory.RequireHard}})
	invtest.SameRows(t, inv, []string{
		"http | /all | * | hard | header | Idempotency-Key | global |  | r",
		"http | /any | * | none |  |  |  |  | r | GAP | every method, unguarded: PATCH, POST",
		"http | /odd | POST | none |  |  |  |  | r | GAP",
		"http | /off | POST | none |  |  |  |  | r | GAP",
		"http | /on | POST | hard | header | Idempotency-Key | global |  | r",
	})
}
