package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// TestShownKeysDistinct: two keys are never shown alike. shown escaped a
// no-break space (U+00A0) as the six characters \u00a0 but kept a
// backslash as it is, so the key whose id is "a<U+00A0>b" and the one
// whose id is the text `a\u00a0b` were printed identically, in list's
// table, inspect's "id" line and release's error lines: an operator who
// released the row list showed, typing what it showed, freed the other
// key.
func TestShownKeysDistinct(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	nbsp := guard.Key{Scope: "s", ID: "a\u00a0b"}
	literal := guard.Key{Scope: "s", ID: `a\u00a0b`}
	for _, k := range []guard.Key{nbsp, literal} {
		if _, err := g.Claim(ctx, k, "fp"); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	rows := map[string]int{}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := regexp.MustCompile(`^(\S+\s+\S+)\s+pending`).FindStringSubmatch(line); f != nil {
			rows[f[1]]++
		}
	}
	t.Logf("list:\n%s", out)
	for row, n := range rows {
		if n > 1 {
			t.Errorf("list shows %d different keys as the same %q: an operator cannot tell which to release", n, row)
		}
	}
	_, out1, _ := cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--", nbsp.Scope, nbsp.ID)
	_, out2, _ := cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--", literal.Scope, literal.ID)
	id := regexp.MustCompile(`(?m)^  id\s+(.*)$`)
	if a, b := id.FindStringSubmatch(out1), id.FindStringSubmatch(out2); a != nil && b != nil && a[1] == b[1] {
		t.Errorf("inspect shows the ids %q and %q both as %q", nbsp.ID, literal.ID, a[1])
	}
	// The error lines, which oneLine says name a key exactly.
	_, _, e1 := cli(t, "release", "--redis", addr, "--prefix", prefix, "--", nbsp.Scope, nbsp.ID)
	_, _, e2 := cli(t, "release", "--redis", addr, "--prefix", prefix, "--", literal.Scope, literal.ID)
	dur := regexp.MustCompile(`[0-9.]+m?s`)
	if e1, e2 = dur.ReplaceAllString(e1, "D"), dur.ReplaceAllString(e2, "D"); e1 == e2 {
		t.Errorf("release's error lines for two different keys are the same: %q", e1)
	}
}
