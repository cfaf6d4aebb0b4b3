package adapter_test

import (
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
	"github.com/idemguard/idemguard/memstore"
)

// wrapper passes every call to the store it wraps and names it.
type wrapper struct{ guard.Store }

func (w *wrapper) Unwrap() guard.Store { return w.Store }

// self unwraps to itself: the walk ends.
type self struct{ guard.Store }

func (s *self) Unwrap() guard.Store { return s }

func TestSameStore(t *testing.T) {
	a, b := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	loop := &self{a}
	cases := []struct {
		name string
		x, y guard.Store
		want bool
	}{
		{"one store", a, a, true},
		{"two stores", a, b, false},
		{"wrapped and not", &wrapper{a}, a, true},
		{"wrapped twice, each on its own", &wrapper{&wrapper{a}}, &wrapper{a}, true},
		{"wrappers of two stores", &wrapper{a}, &wrapper{b}, false},
		{"a wrapper that unwraps to itself", loop, loop, true},
		{"a wrapper that unwraps to itself and its store", loop, a, false},
	}
	for _, c := range cases {
		if got := adapter.SameStore(guard.New(c.x, guard.Options{}), guard.New(c.y, guard.Options{})); got != c.want {
			t.Errorf("%s: SameStore = %v, want %v", c.name, got, c.want)
		}
	}
}
