package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// During a PostgreSQL outage (the backstop's claims fail closed, a
// gateway's fallback cannot answer) the Redis record is what an operator
// has: inspect --postgres shows it, says PostgreSQL was not read, and
// exits 1 naming PostgreSQL, as it shows the row when Redis fails. It
// failed at once, showing nothing.
func TestInspectRedisWhenPostgresFails(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /pay", ID: "held"}
	if _, err := g.Claim(ctx, key, "fp"); err != nil {
		t.Fatal(err)
	}
	dsn := "postgres://postgres@" + deadAddr(t) + "/idemguard?sslmode=disable"
	code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--postgres", dsn, key.Scope, key.ID)
	wantError(t, code, stderr, 1, "postgres does not answer")
	if !strings.Contains(out, "state        pending") || !strings.Contains(out, "id           held") {
		t.Errorf("inspect --postgres with PostgreSQL down does not show the Redis record:\n%s", out)
	}
	if !strings.Contains(out, "postgres: not read: ") {
		t.Errorf("inspect --postgres with PostgreSQL down does not say the row was not read:\n%s", out)
	}

	// Both down: Redis's error, PostgreSQL's said on stdout.
	dead := deadAddr(t)
	code, out, stderr = cli(t, "inspect", "--redis", dead, "--postgres", dsn, key.Scope, key.ID)
	wantError(t, code, stderr, 1, "redis at "+dead+" does not answer")
	if !strings.Contains(out, "postgres: not read: ") {
		t.Errorf("inspect with both down:\n%s", out)
	}
}
