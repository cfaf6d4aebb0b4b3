package guard_test

import (
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// New and NewRedisStore cannot fail on their input, so they return no
// error; they panic at once on a nil dependency instead of on first use.
func TestConstructorsPanicOnNil(t *testing.T) {
	for name, mk := range map[string]func(){
		"New":           func() { guard.New(nil, guard.Options{}) },
		"NewRedisStore": func() { guard.NewRedisStore(nil, guard.RedisOptions{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(nil): no panic", name)
				}
			}()
			mk()
		}()
	}
}
