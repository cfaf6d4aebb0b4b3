package adapter

import (
	"reflect"

	"github.com/idemguard/idemguard/guard"
)

// SameStore reports whether a and b keep their keys in one store: the
// same guard.Guard, or two over one Store value (a route's or a service's
// Guard with its own TTL inside a router-wide one). A guard nested in a
// guarded run uses it to tell the outer claim of its own key from another
// request's. A Store that only wraps another, keeping its records there
// (otelx's traced store), says so with an Unwrap() guard.Store method: it
// is the store it unwraps to, however many times it was wrapped. A Store
// whose dynamic value cannot be compared is taken for another.
func SameStore(a, b *guard.Guard) bool {
	if a == b {
		return true
	}
	sa, sb := reflect.ValueOf(root(a.Store())), reflect.ValueOf(root(b.Store()))
	return sa.Type() == sb.Type() && sa.Comparable() && sa.Equal(sb)
}

// root returns the store s wraps, through every wrapper that has an
// Unwrap() guard.Store method (see wrapped).
func root(s guard.Store) guard.Store {
	wrapped(s, func(inner guard.Store) bool { s = inner; return true })
	return s
}

// wrapped calls visit with s, then with the store each wrapper on the
// way names (Unwrap() guard.Store), until visit returns false or a store
// names none: at most 64 stores, as a wrapper that unwraps to itself
// would never end the walk.
func wrapped(s guard.Store, visit func(guard.Store) bool) {
	for range 64 {
		if !visit(s) {
			return
		}
		w, ok := s.(interface{ Unwrap() guard.Store })
		if !ok {
			return
		}
		if s = w.Unwrap(); s == nil {
			return
		}
	}
}
