package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// An operator's release of a first attempt must not hand the next holder
// the fence of the holder it freed: that holder may still be running (a
// live lease freed with --force, or a paused process whose lease ran out),
// and a downstream write fenced by Lease.Fence would take both. Its later
// writes are refused.
func TestReleaseNextHolderGetsALargerFence(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	flags := []string{"--redis", addr, "--prefix", prefix}
	for _, c := range []struct {
		id    string
		lease time.Duration
		force bool
	}{
		{"live", time.Minute, true}, // freed while its holder runs
		// A holder whose lease ran out. Not shorter: a claim answered after
		// its deadline (lease − LeaseMargin: 97ms at 100ms) is released, and
		// a loaded machine's Redis round trip can take that long.
		{"paused", 500 * time.Millisecond, false},
	} {
		key := guard.Key{Scope: "POST /pay", ID: c.id}
		holder := guard.New(g.Store(), guard.Options{Lease: c.lease})
		first, err := holder.Claim(ctx, key, "fp")
		if err != nil {
			t.Fatal(err)
		}
		if !c.force {
			testenv.WaitFor(t, 5*time.Second, "the holder's lease to run out", func() bool {
				rec, err := g.Get(ctx, key)
				return err == nil && rec.LeaseLeft == 0
			})
		}
		args := append([]string{"release"}, flags...)
		if c.force {
			args = append(args, "--force")
		}
		code, out, stderr := cli(t, append(args, key.Scope, key.ID)...)
		if code != 0 {
			t.Fatalf("%s: release: exit %d: %s %s", c.id, code, out, stderr)
		}
		next, err := g.Claim(ctx, key, "fp")
		if err != nil {
			t.Fatalf("%s: the claim after the release: %v", c.id, err)
		}
		if next.Lease.Fence <= first.Lease.Fence {
			t.Errorf("%s: the next holder has fence %d, the freed holder %d: a fenced write cannot tell them apart",
				c.id, next.Lease.Fence, first.Lease.Fence)
		}
		if err := g.Store().Complete(ctx, first.Lease, []byte("zombie"), time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("%s: the freed holder's Complete: %v, want ErrLeaseLost", c.id, err)
		}
		if err := g.Store().Extend(ctx, first.Lease, time.Minute); !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("%s: the freed holder's Extend: %v, want ErrLeaseLost", c.id, err)
		}
	}
}

// A freed holder that is still alive cannot take its key back by keeping
// its lease alive (before anyone claims it again).
func TestReleasedHolderCannotExtendBack(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /pay", ID: "alive"}
	first, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := cli(t, "release", "--redis", addr, "--prefix", prefix, "--force", key.Scope, key.ID); code != 0 {
		t.Fatalf("release --force: exit %d: %s %s", code, out, stderr)
	}
	if err := g.Store().Extend(ctx, first.Lease, time.Minute); !errors.Is(err, guard.ErrLeaseLost) {
		t.Errorf("the freed holder's Extend: %v, want ErrLeaseLost", err)
	}
	if _, err := g.Claim(ctx, key, "fp"); err != nil {
		t.Errorf("the key is not free after release --force: %v", err)
	}
}

// --force says what it risks, on stderr, and only when the lease is alive.
func TestReleaseForceWarns(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /pay", ID: "warn"}
	if _, err := g.Claim(ctx, key, "fp"); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := cli(t, "release", "--redis", addr, "--prefix", prefix, "--force", key.Scope, key.ID)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, stderr)
	}
	if !strings.Contains(stderr, "may still be running") {
		t.Errorf("release --force of a live lease does not warn on stderr: %q (stdout %q)", stderr, out)
	}
}

// Text from the store (a failure's reason, a key) goes to the operator's
// terminal: escape sequences and line breaks in it are shown quoted, never
// sent raw.
func TestInspectQuotesControlCharacters(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /pay", ID: "evil"}
	evil := "declined\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\n  state        completed\r\u202e"
	if _, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, errors.New(evil)
	}); err == nil {
		t.Fatal("want the failure back")
	}
	code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, key.Scope, key.ID)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if strings.ContainsAny(out, "\x1b\x07\r\u202e") || strings.Count(out, "\n  state") != 1 {
		t.Errorf("inspect writes the stored error raw:\n%q", out)
	}
	if !strings.Contains(out, `\x1b]52`) {
		t.Errorf("the escape is not shown quoted:\n%s", out)
	}
}

// list says when it stopped at --limit, so a count is not read as the total.
func TestListSaysLimitReached(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: strconv.Itoa(i)}, "fp"); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix, "--limit", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if n := strings.Count(out, "pending"); n != 2 {
		t.Errorf("want 2 rows:\n%s", out)
	}
	if !strings.Contains(stderr, "--limit 2") {
		t.Errorf("list does not say it stopped at --limit 2: %q", stderr)
	}
	code, _, stderr = cli(t, "list", "--redis", addr, "--prefix", prefix, "--limit", "3")
	if code != 0 || strings.Contains(stderr, "--limit") {
		t.Errorf("all 3 listed under --limit 3: exit %d, %q", code, stderr)
	}
}

// A record list cannot read is a failure a script must notice: list shows
// the rest, names the first bad one, and exits 1. inspect names it too.
func TestCorruptRecords(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: "ok"}, "fp"); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	bad := prefix + "{" + strings.Repeat("B", 22) + "}"
	hash := prefix + "{" + strings.Repeat("H", 22) + "}"
	// SCAN's pattern takes any 22 bytes: a name can carry an escape.
	escaped := prefix + "{\x1b[2J" + strings.Repeat("E", 18) + "}"
	for _, name := range []string{bad, escaped} {
		if err := rdb.Set(ctx, name, "\x01p\x1b[2Jgarbage", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.HSet(ctx, hash, "state", "pending").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), bad, hash, escaped) })

	code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix)
	if !regexp.MustCompile(`s\s+ok\s+pending`).MatchString(out) {
		t.Errorf("list does not show the readable record:\n%s", out)
	}
	if code != 1 || !strings.Contains(stderr, "3 records could not be read") {
		t.Errorf("list over corrupt records: exit %d, %q", code, stderr)
	}
	if strings.Contains(stderr, "\x1b") {
		t.Errorf("stderr carries raw escapes: %q", stderr)
	}
	// By scope and ID too, and release writes nothing over it.
	named := g.Store().(*guard.RedisStore).Name(guard.Key{Scope: "s", ID: "bad"})
	if err := rdb.Set(ctx, named, "\x01c\x01", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), named) })
	for _, cmd := range []string{"inspect", "release"} {
		code, _, stderr = cli(t, cmd, "--redis", addr, "--prefix", prefix, "--", "s", "bad")
		wantError(t, code, stderr, 1, "corrupt record: s/bad (redis key "+named)
	}
	if v, err := rdb.Get(ctx, named).Result(); err != nil || v != "\x01c\x01" {
		t.Errorf("release changed a corrupt record: %q %v", v, err)
	}
	for _, name := range []string{bad, hash, escaped} {
		code, _, stderr = cli(t, "inspect", "--redis", addr, "--prefix", prefix, name)
		wantError(t, code, stderr, 1, "corrupt")
		if strings.Contains(stderr, "\x1b") {
			t.Errorf("inspect: stderr carries raw escapes: %q", stderr)
		}
	}
}

// On a Cluster, given the address of any one node, the commands reach
// every master: list shows the keys of all of them, inspect and release
// find a key wherever its slot lives.
func TestKeyCommandsOnCluster(t *testing.T) {
	cluster := testenv.Cluster(t)
	prefix := testenv.Prefix(t)
	store := guardenv.StoreOn(t, cluster, guard.RedisOptions{Prefix: prefix})
	g := guard.New(store, guard.Options{Lease: time.Minute})
	ctx := context.Background()
	const n = 24
	for i := range n {
		if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: strconv.Itoa(i)}, "fp"); err != nil {
			t.Fatal(err)
		}
	}
	node := testenv.List(t, testenv.EnvCluster)[0]
	flags := []string{"--redis", node, "--prefix", prefix}
	code, out, stderr := cli(t, append([]string{"list"}, flags...)...)
	if code != 0 || !strings.Contains(stderr, fmt.Sprintf("%d pending keys", n)) {
		t.Errorf("list on a Cluster node: exit %d, %q\n%s", code, stderr, out)
	}
	for i := range n {
		id := strconv.Itoa(i)
		code, out, stderr := cli(t, append(append([]string{"inspect"}, flags...), "s", id)...)
		if code != 0 || !strings.Contains(out, "state        pending") {
			t.Fatalf("inspect s/%s on a Cluster node: exit %d, %s %s", id, code, out, stderr)
		}
	}
	code, out, stderr = cli(t, append(append([]string{"release", "--force"}, flags...), "s", "7")...)
	if code != 0 {
		t.Fatalf("release on a Cluster node: exit %d, %s %s", code, out, stderr)
	}
	if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: "7"}, "fp"); err != nil {
		t.Errorf("released key not free: %v", err)
	}
}

// Go's flag parsing stops at the first argument: a flag after SCOPE ID
// (release s i --force, migrate down --force) is refused naming it, not
// read as an argument or ignored. After --, it is an argument.
func TestFlagAfterArguments(t *testing.T) {
	dead := deadAddr(t)
	pg := "postgres://nobody@" + dead + "/db?sslmode=disable"
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"release", "--redis", dead, "s", "i", "--force"}, 2, "flag --force after the arguments"},
		{[]string{"release", "--redis", dead, "s", "i", "-force=true"}, 2, "flag -force=true after the arguments"},
		{[]string{"inspect", "--redis", dead, "s", "i", "--postgres", pg}, 2, "flag --postgres after the arguments"},
		{[]string{"migrate", "--postgres", pg, "down", "--force"}, 2, "flag --force after the arguments"},
		{[]string{"list", "--redis", dead, "pending", "--limit", "5"}, 2, "flag --limit after the arguments"},
		{[]string{"release", "--redis", dead, "--", "s", "--force"}, 1, "does not answer"}, // an ID
		{[]string{"release", "--redis", dead, "s", "--not-a-flag"}, 1, "does not answer"},  // an ID
	} {
		code, _, stderr := cli(t, c.args...)
		wantError(t, code, stderr, c.code, c.text)
	}
}

// release against a replica fails in one line naming why, and warns of
// nothing it did not do.
func TestReleaseOnReplica(t *testing.T) {
	pair := testenv.List(t, testenv.EnvReplication)
	master := redis.NewClient(&redis.Options{Addr: pair[0]})
	t.Cleanup(func() { _ = master.Close() })
	prefix := testenv.Prefix(t)
	g := guard.New(guardenv.StoreOn(t, master, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: time.Minute})
	ctx := context.Background()
	key := guard.Key{Scope: "s", ID: "i"}
	if _, err := g.Claim(ctx, key, "fp"); err != nil {
		t.Fatal(err)
	}
	if err := master.Wait(ctx, 1, 5*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := cli(t, "release", "--redis", pair[1], "--prefix", prefix, "--force", key.Scope, key.ID)
	wantError(t, code, stderr, 1, "READONLY")
	if rec, err := g.Get(ctx, key); err != nil || rec.State != guard.StatePending {
		t.Errorf("the key changed: %v %v", rec.State, err)
	}
}

// A Redis that asks for a password: --redis takes a redis:// URL with it
// (rediss:// for TLS), the password never shows in an error, and a server
// that refuses is not reported as one that does not answer.
func TestRedisURLAndRefusal(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: time.Minute})
	if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: "i"}, "fp"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client().ConfigSet(ctx, "requirepass", "hunter2").Err(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := cli(t, "list", "--redis", srv.Addr(), "--prefix", prefix)
	wantError(t, code, stderr, 1, "NOAUTH")
	if strings.Contains(stderr, "does not answer") {
		t.Errorf("a server that refused is said not to answer: %s", stderr)
	}
	code, out, stderr := cli(t, "list", "--redis", "redis://:hunter2@"+srv.Addr(), "--prefix", prefix)
	if code != 0 || !regexp.MustCompile(`s\s+i\s+pending`).MatchString(out) {
		t.Errorf("list with a redis:// URL: exit %d: %s %s", code, out, stderr)
	}
	code, _, stderr = cli(t, "inspect", "--redis", "redis://:wrong-hunter2@"+srv.Addr(), "--prefix", prefix, "s", "i")
	wantError(t, code, stderr, 1, "WRONGPASS")
	if strings.Contains(stderr, "hunter2") {
		t.Errorf("the password is in the error: %s", stderr)
	}
	code, _, stderr = cli(t, "list", "--redis", "redis://:hunter2@host:badport")
	wantError(t, code, stderr, 2, "--redis")
	if strings.Contains(stderr, "hunter2") {
		t.Errorf("the password is in the error: %s", stderr)
	}
}

// release of a failed key changes nothing, and does not promise a retry
// its guard's MaxAttempts may refuse.
func TestReleaseFailedKey(t *testing.T) {
	addr, prefix, _ := keysFixture(t)
	g := guard.New(guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{Prefix: prefix}), guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	key := guard.Key{Scope: "s", ID: "spent"}
	if _, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, errors.New("declined") }); err == nil {
		t.Fatal("want the failure")
	}
	code, out, stderr := cli(t, "release", "--redis", addr, "--prefix", prefix, key.Scope, key.ID)
	if code != 0 || !strings.Contains(out, "nothing to do") || !strings.Contains(out, "MaxAttempts") {
		t.Errorf("release of a failed key: exit %d: %q %q", code, out, stderr)
	}
	if _, err := g.Claim(ctx, key, "fp"); !errors.Is(err, guard.ErrExhausted) {
		t.Errorf("the key's attempts are spent, the claim says %v", err)
	}
}

// list under a prefix shows that prefix's records only, not those of a
// guard whose prefix merely starts the same (no bug: pins ScanRecords'
// pattern as list uses it).
func TestListOtherPrefixes(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	other := guard.New(guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{Prefix: prefix + "v2:"}), guard.Options{})
	if _, err := g.Claim(ctx, guard.Key{Scope: "s", ID: "mine"}, "fp"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Claim(ctx, guard.Key{Scope: "s", ID: "theirs"}, "fp"); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix)
	if code != 0 || !strings.Contains(out, "mine") || strings.Contains(out, "theirs") || !strings.Contains(stderr, "1 pending keys (of 1 records") {
		t.Errorf("exit %d:\n%s%s", code, out, stderr)
	}
}

// During a Redis outage the row in PostgreSQL (a fallback's, the
// backstop's, a pgstore.Store's) is the one record of the key there is:
// inspect --postgres shows it, and still exits 1 naming Redis. So does a
// Redis record that cannot be read: the row is shown beside the error.
func TestInspectPostgresWhenRedisFails(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pg, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "billing", ID: "invoice-7"}
	if _, err := guard.New(pg, guard.Options{}).Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("paid"), nil
	}); err != nil {
		t.Fatal(err)
	}
	dead := deadAddr(t)
	code, out, stderr := cli(t, "inspect", "--redis", dead, "--postgres", dsn, key.Scope, key.ID)
	wantError(t, code, stderr, 1, "redis at "+dead+" does not answer")
	if !strings.Contains(out, "postgres\n") || !strings.Contains(out, "state        completed") || !strings.Contains(out, "result size  4 bytes") {
		t.Errorf("inspect --postgres with Redis down does not show the row:\n%s", out)
	}

	addr, prefix, g := keysFixture(t)
	named := g.Store().(*guard.RedisStore).Name(key)
	rdb := testenv.Redis(t)
	if err := rdb.Set(ctx, named, "\x01c\x01", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), named) })
	code, out, stderr = cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--postgres", dsn, key.Scope, key.ID)
	wantError(t, code, stderr, 1, "corrupt record: billing/invoice-7")
	if !strings.Contains(out, "postgres\n") || !strings.Contains(out, "state        completed") {
		t.Errorf("inspect --postgres over a corrupt Redis record does not show the row:\n%s", out)
	}
	// Without --postgres there is nothing else to show: Redis's error alone.
	code, out, stderr = cli(t, "inspect", "--redis", dead, key.Scope, key.ID)
	wantError(t, code, stderr, 1, "does not answer")
	if out != "" {
		t.Errorf("inspect with Redis down and no --postgres wrote %q", out)
	}
}

// A script reads list --format json: one object per line with each key's
// exact scope and id (the table shows them padded and escaped, so a scope
// with spaces or an id with trailing spaces or a bidi override cannot be
// read back from it), and releases what it found by them.
func TestListJSONForScripts(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	pending := []guard.Key{
		{Scope: `"acct 42" POST /charges`, ID: "  trail  "},
		{Scope: "bidi", ID: "abc\u202edef"},
		{Scope: "s", ID: `"q" <&>`},
	}
	for _, k := range pending {
		if _, err := g.Claim(ctx, k, "fp"); err != nil {
			t.Fatal(err)
		}
	}
	done := guard.Key{Scope: "s", ID: "done"}
	if _, err := g.Do(ctx, done, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("r"), nil }); err != nil {
		t.Fatal(err)
	}
	store := g.Store().(*guard.RedisStore)
	type listed struct {
		Scope       *string `json:"scope"`
		ID          *string `json:"id"`
		State       string  `json:"state"`
		Fence       int64   `json:"fence"`
		Attempts    int     `json:"attempts"`
		LeaseLeftMS int64   `json:"lease_left_ms"`
		RedisKey    string  `json:"redis_key"`
	}
	read := func(state string) []listed {
		t.Helper()
		code, out, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix, "--state", state, "--format", "json")
		if code != 0 {
			t.Fatalf("list --format json: exit %d: %s", code, stderr)
		}
		var recs []listed
		for line := range strings.Lines(out) {
			var r listed
			dec := json.NewDecoder(strings.NewReader(line))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			recs = append(recs, r)
		}
		return recs
	}
	got := read("pending")
	if len(got) != len(pending) {
		t.Fatalf("%d pending records listed, want %d: %+v", len(got), len(pending), got)
	}
	for _, k := range pending {
		i := slices.IndexFunc(got, func(r listed) bool { return r.Scope != nil && r.ID != nil && *r.Scope == k.Scope && *r.ID == k.ID })
		if i < 0 {
			t.Errorf("%q not listed with its exact scope and id: %+v", k, got)
			continue
		}
		r := got[i]
		if r.State != "pending" || r.Fence != 1 || r.Attempts != 1 || r.LeaseLeftMS <= 0 || r.RedisKey != store.Name(k) {
			t.Errorf("%q listed as %+v", k, r)
		}
		code, _, stderr := cli(t, "release", "--force", "--redis", addr, "--prefix", prefix, "--", *r.Scope, *r.ID)
		if code != 0 {
			t.Errorf("release of %q as list gave it: exit %d: %s", k, code, stderr)
		}
	}
	if left := read("pending"); len(left) != 0 {
		t.Errorf("pending after releasing what list gave: %+v", left)
	}
	// A completed record keeps no scope and id: none is given, its Redis key is.
	c := read("completed")
	if len(c) != 1 || c[0].Scope != nil || c[0].ID != nil || c[0].State != "completed" || c[0].RedisKey != store.Name(done) || c[0].LeaseLeftMS != 0 {
		t.Errorf("completed listed as %+v", c)
	}
	code, _, stderr := cli(t, "list", "--redis", addr, "--format", "yaml")
	wantError(t, code, stderr, 2, `--format "yaml"`)
}

// A key is anyone's text (a client picks its Idempotency-Key; list
// --format json hands it to a script as stored): what inspect and release
// write about it shows a bidirectional override or an invisible character
// escaped, as list's table does, never raw for the terminal to obey.
func TestKeyEchoedEscaped(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	raw := "\u202e\u200b"
	run := guard.Key{Scope: "s" + raw, ID: "run" + raw}
	if _, err := g.Claim(ctx, run, "fp"); err != nil {
		t.Fatal(err)
	}
	failed := guard.Key{Scope: "s" + raw, ID: "failed" + raw}
	if _, err := g.Do(ctx, failed, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, errors.New("no") }); err == nil {
		t.Fatal("want the failure")
	}
	for _, args := range [][]string{
		{"release", "--force", "--", run.Scope, run.ID},
		{"release", "--", failed.Scope, failed.ID},
		{"inspect", "--", "s" + raw, "absent" + raw},
	} {
		_, out, stderr := cli(t, append([]string{args[0], "--redis", addr, "--prefix", prefix}, args[1:]...)...)
		if strings.ContainsAny(out+stderr, raw) {
			t.Errorf("%s writes the key raw:\n%q\n%q", args[0], out, stderr)
		}
		if !strings.Contains(out+stderr, `\u202e`) {
			t.Errorf("%s does not show the key escaped:\n%s%s", args[0], out, stderr)
		}
	}
}

// inspect shows the steps a pending or failed record keeps, in order, by
// name and size: before releasing a stuck checkout an operator sees that
// its charge step is stored (the next attempt resumes after it) or not.
func TestInspectShowsSteps(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	key := guard.Key{Scope: "POST /checkout", ID: "cart-9"}
	if _, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		if _, err := guard.Step(ctx, l, "reserve", func(context.Context) ([]byte, error) { return []byte("r-1"), nil }); err != nil {
			return nil, err
		}
		if _, err := guard.Step(ctx, l, "charge\u202e", func(context.Context) ([]byte, error) { return []byte("ch_12345"), nil }); err != nil {
			return nil, err
		}
		return nil, errors.New("order service down")
	}); err == nil {
		t.Fatal("want the failure")
	}
	code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, key.Scope, key.ID)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "  steps        reserve (3 bytes), charge\\u202e (8 bytes)\n") {
		t.Errorf("inspect of a failed record with two steps:\n%s", out)
	}
	done := guard.Key{Scope: "POST /checkout", ID: "cart-10"}
	if _, err := g.Do(ctx, done, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := cli(t, "inspect", "--redis", addr, "--prefix", prefix, done.Scope, done.ID); strings.Contains(out, "steps") {
		t.Errorf("a record without steps shows a steps line:\n%s", out)
	}
}

// TestRedisTLSMismatchHinted: when the URL and the server disagree on TLS
// (rediss:// to a plain-text Redis, redis:// or host:port to a TLS port)
// the error says so; a server that refused (an error reply) or a port
// without one gets no hint.
// Before, both read "does not answer" and nothing else (the ops trial).
func TestRedisTLSMismatchHinted(t *testing.T) {
	plain := testenv.StartRedis(t)
	tlsPort := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(tlsPort.Close)
	for _, tc := range []struct{ url, want string }{
		{"rediss://" + plain.Addr(), "a rediss:// URL speaks TLS"},
		{tlsPort.Listener.Addr().String(), "use a rediss:// URL"},
		{"redis://" + tlsPort.Listener.Addr().String(), "use a rediss:// URL"},
	} {
		code, _, stderr := cli(t, "list", "--redis", tc.url)
		wantError(t, code, stderr, 1, tc.want)
	}
	code, _, stderr := cli(t, "list", "--redis", deadAddr(t))
	wantError(t, code, stderr, 1, "does not answer")
	if strings.Contains(stderr, "TLS") {
		t.Errorf("a port without a server gets a TLS hint: %s", stderr)
	}
	if err := plain.Client().ConfigSet(context.Background(), "requirepass", "hunter2").Err(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = cli(t, "list", "--redis", plain.Addr())
	wantError(t, code, stderr, 1, "NOAUTH")
	if strings.Contains(stderr, "TLS") {
		t.Errorf("a server that refused gets a TLS hint: %s", stderr)
	}
}
