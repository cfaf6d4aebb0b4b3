package main

import (
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// --prefix "" is the guard's default prefix, as guard.RedisOptions.Prefix
// "" is (a script passing an application's unset prefix on): the records
// were read under idem: while inspect took every name starting with "{"
// for a Redis key and refused idem:{…}, inspect --postgres looked for a
// gateway's rows under the prefix "", and list said it found nothing
// "under *".
func TestEmptyPrefixIsTheDefault(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	store := guard.NewRedisStore(c, guard.RedisOptions{})
	key := guard.Key{Scope: "POST /pay", ID: "k1"}
	if _, err := guard.New(store, guard.Options{}).Claim(context.Background(), key, "fp"); err != nil {
		t.Fatal(err)
	}
	name := store.Name(key)
	code, out, stderr := cli(t, "inspect", "--redis", mr.Addr(), "--prefix", "", name)
	if code != 0 || !strings.Contains(out, "state        pending") {
		t.Errorf("inspect --prefix '' %s: exit %d\n%s%s", name, code, out, stderr)
	}
	code, _, stderr = cli(t, "list", "--redis", mr.Addr(), "--prefix", "", "--state", "completed")
	if code != 0 || !strings.Contains(stderr, "0 completed keys (of 1 records scanned)") {
		t.Errorf("list --prefix '': exit %d, %q", code, stderr)
	}

	empty := miniredis.RunT(t)
	_, _, stderr = cli(t, "list", "--redis", empty.Addr(), "--prefix", "")
	if !strings.Contains(stderr, "no idemguard records under "+guard.DefaultPrefix+"* on") {
		t.Errorf("list --prefix '' on an empty Redis names the wrong prefix: %q", stderr)
	}
}
