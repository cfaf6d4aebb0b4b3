package lock_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/lock"
)

// The wrappers panic when they are made with a nil dependency, as
// http.Handle does, instead of when the wrapped function first runs.
func TestWrappersPanicOnNil(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never called
	t.Cleanup(func() { c.Close() })
	l, err := lock.New([]redis.UniversalClient{c}, lock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }
	res := func(context.Context, guard.Lease) (string, error) { return "r", nil }
	job := func(context.Context) error { return nil }
	for name, mk := range map[string]func(){
		"Guarded nil Locker":     func() { lock.Guarded(nil, "r", fn) },
		"Guarded nil fn":         func() { lock.Guarded(l, "r", nil) },
		"GuardedBy nil resource": func() { lock.GuardedBy(l, nil, fn) },
		"GuardedBy nil fn":       func() { lock.GuardedBy(l, res, nil) },
		"Singleton nil Locker":   func() { lock.Singleton(nil, "job", job) },
		"Singleton nil job":      func() { lock.Singleton(l, "job", nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			mk()
		}()
	}
	// Made with their dependencies, they do not panic.
	lock.Guarded(l, "r", fn)
	lock.GuardedBy(l, res, fn)
	lock.Singleton(l, "job", job)
}
