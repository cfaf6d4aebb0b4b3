package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// The error line names the key an operator acted on exactly: a key whose
// id holds a no-break space (U+00A0, shown escaped) or two spaces is not
// named as another key. (oneLine folded the message with strings.Fields,
// inside the key too, naming it with one plain space.)
func TestErrorLineNamesTheKeyExactly(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	for _, id := range []string{"a\u00a0b", "a  b"} {
		k := guard.Key{Scope: "s", ID: id}
		if _, err := g.Claim(ctx, k, "fp"); err != nil { // a live holder (1 min lease)
			t.Fatal(err)
		}
		code, _, stderr := cli(t, "release", "--redis", addr, "--prefix", prefix, "--", k.Scope, k.ID)
		if code != 1 || !strings.Contains(stderr, "lease is alive") {
			t.Fatalf("release of a live holder %q: exit %d: %s", id, code, stderr)
		}
		if strings.Contains(stderr, "s/a b ") {
			t.Errorf("release of %q: the error line names the key %q, another key:\n%s", id, "s/a b", stderr)
		}
	}
}
