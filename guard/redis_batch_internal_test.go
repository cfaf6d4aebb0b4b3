package guard

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// KeySlot is keySlot, for the external tests.
var KeySlot = keySlot

// keySlot is the slot a Cluster gives a name: the store's names, and
// names whose braces make Redis hash all of the name or only a part.
func TestKeySlotIsClusters(t *testing.T) {
	c := testenv.Cluster(t)
	s := NewRedisStore(c, RedisOptions{})
	names := []string{"", "plain", "a{b}c", "{}x", "{x", "x}", "}{x}", "{a}{b}", "a{{b}}", "{", "}", "{}", "prefix{}{x}", "é{ü}"}
	for i := range 200 {
		names = append(names, s.Name(Key{Scope: "slot", ID: fmt.Sprint(i)}))
	}
	ps := NewRedisStore(c, RedisOptions{Prefix: "a{b}"}) // a prefix with a tag of its own
	names = append(names, ps.Name(Key{Scope: "slot", ID: "x"}))
	for _, name := range names {
		want, err := c.ClusterKeySlot(context.Background(), name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(name); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, the Cluster says %d", name, got, want)
		}
	}
}
