package httpx_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/idemguard/idemguard/httpx"
)

type namedAccountKey struct{}

// namedAccountID is the kind of string type authentication middleware
// stores (type AccountID string); it has no String method.
type namedAccountID string

// TestTenantFromContextNamedString: TenantFromContext's doc says
// "a nil name uses the value itself when it is a string or a
// fmt.Stringer". A value of a defined string type is a string, but the type
// switch in caller.go only matches the predeclared string, so every
// request is named "" and a Guard answers each one 401 (caller unknown).
func TestTenantFromContextNamedString(t *testing.T) {
	tenant := httpx.TenantFromContext[namedAccountID](namedAccountKey{}, nil)
	r := httptest.NewRequest("POST", "/charges", nil)
	r = r.WithContext(context.WithValue(r.Context(), namedAccountKey{}, namedAccountID("acct_1")))
	if got := tenant(r); got != "acct_1" {
		t.Fatalf("Tenant named %q; want %q (the value, a string)", got, "acct_1")
	}
}
