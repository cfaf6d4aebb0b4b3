package lock_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/lock"
)

// TestNewTypedNilNode: New refuses a nil node with an error, a typed nil
// ((*redis.Client)(nil) in the interface) too. It slipped past the check:
// after another node New panicked (comparing the nodes' addresses); alone
// it returned a Locker whose every round would panic in redsync's
// goroutine for the node, which no caller can recover.
func TestNewTypedNilNode(t *testing.T) {
	good := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer good.Close()
	var typedNil *redis.Client
	for _, tc := range []struct {
		name  string
		nodes []redis.UniversalClient
	}{
		{"typed nil after a node", []redis.UniversalClient{good, typedNil}},
		{"typed nil alone", []redis.UniversalClient{typedNil}},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("New panicked: %v", r)
				}
			}()
			l, err := lock.New(tc.nodes, lock.Options{})
			if err == nil {
				return fmt.Errorf("New = %v, nil error", l)
			}
			return nil
		}()
		if err != nil {
			t.Errorf("%s: %v; want New's 'node %%d is nil' error", tc.name, err)
		}
	}
}
