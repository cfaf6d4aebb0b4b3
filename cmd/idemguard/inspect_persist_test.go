package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestPendingWithoutExpiryNamedCorrupt: a pending record that lost its
// expiry (an operator's PERSIST, a keyspace copied or restored without
// its TTLs) never frees its key: every claim but its holder's fails with
// ErrCorrupt, for good. inspect and list say so and exit 1, as for any
// record they cannot use; they showed it as an ordinary pending record
// whose "next claim recovers the key", and exited 0.
func TestPendingWithoutExpiryNamedCorrupt(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /pay", ID: "persisted"}
	if _, err := g.Claim(ctx, key, "fp"); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	name := g.Store().(*guard.RedisStore).Name(key)
	if err := rdb.Persist(ctx, name).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), name) })

	// What the guard makes of the record: no claim can take it.
	_, cerr := g.Claim(ctx, key, "fp")
	if !errors.Is(cerr, guard.ErrCorrupt) {
		t.Fatalf("precondition: the next claim: %v, want ErrCorrupt", cerr)
	}
	t.Logf("the next claim: %v", cerr)

	code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, key.Scope, key.ID)
	t.Logf("inspect: exit %d\n%s%s", code, out, stderr)
	if code != 1 || strings.Contains(out, "the next claim recovers the key") {
		t.Errorf("inspect of a pending record without expiry (every claim fails with ErrCorrupt): exit %d, want 1 naming it corrupt; it says:\n%s%s", code, out, stderr)
	}
	code, out, stderr = cli(t, "list", "--redis", addr, "--prefix", prefix)
	t.Logf("list: exit %d\n%s%s", code, out, stderr)
	if code != 1 || !strings.Contains(stderr, "could not be read") {
		t.Errorf("list over a pending record without expiry: exit %d, want 1 (a record that cannot be used); stderr %q", code, stderr)
	}
}
