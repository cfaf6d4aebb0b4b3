package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// list --format json gives a script each record's redis_key "to pass to
// inspect or release" (README); for a completed record it is the only
// name there is. A guard's prefix is bytes (RedisStore names and
// ScanRecords match a non-UTF-8 prefix exactly), so the Redis key may
// not be UTF-8: encoding/json then writes U+FFFD for each stray byte and
// the line names a key that does not exist. The JSON line must let a
// script recover the exact name: redis_key itself, or redis_key_base64.
func TestListJSONKeyNotUTF8(t *testing.T) {
	addr := testenv.RedisAddr(t)
	prefix := testenv.Prefix(t) + "\xff\xfe:"
	store := guardenv.Store(t, guard.RedisOptions{Prefix: prefix})
	g := guard.New(store, guard.Options{Lease: time.Minute})
	ctx := context.Background()
	done := guard.Key{Scope: "s", ID: "done"}
	if _, err := g.Do(ctx, done, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("r"), nil }); err != nil {
		t.Fatal(err)
	}
	want := store.Name(done)

	code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix, "--state", "completed", "--format", "json")
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line, got %q", out)
	}
	var l struct {
		RedisKey       string  `json:"redis_key"`
		RedisKeyBase64 *string `json:"redis_key_base64"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil {
		t.Fatalf("line %q: %v", lines[0], err)
	}
	name := l.RedisKey
	if l.RedisKeyBase64 != nil {
		b, err := base64.StdEncoding.DecodeString(*l.RedisKeyBase64)
		if err != nil {
			t.Fatalf("redis_key_base64 %q: %v", *l.RedisKeyBase64, err)
		}
		name = string(b)
	}
	if name != want {
		t.Errorf("list --format json names the record %q (line %s), its Redis key is %q: a script cannot inspect it", name, lines[0], want)
	}
	// What the script does with it: inspect the record by that name.
	code, out, stderr = cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--", name)
	if code != 0 || !strings.Contains(out, "state        completed") {
		t.Errorf("inspect of the key list gave: exit %d: %s%s", code, out, stderr)
	}
}
