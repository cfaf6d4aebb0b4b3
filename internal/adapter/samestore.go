package adapter

import (
	"reflect"

	"github.com/idemguard/idemguard/guard"
)

// SameStore reports whether a and b keep their keys in one store: the
// same guard.Guard, or two over one Store value (a route's or a service's
// Guard with its own TTL inside a router-wide one). A guard nested in a
// guarded run uses it to tell the outer claim of its own key from another
// request's. A Store whose dynamic value cannot be compared is taken for
// another.
func SameStore(a, b *guard.Guard) bool {
	if a == b {
		return true
	}
	sa, sb := reflect.ValueOf(a.Store()), reflect.ValueOf(b.Store())
	return sa.Type() == sb.Type() && sa.Comparable() && sa.Equal(sb)
}
