package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/gateway"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql's connection opener lives as long as a DB handle,
		// and lib/pq handles are closed asynchronously.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

// cli runs the command in-process and returns its exit code and output.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// wantError checks a failure: the exit code, and one line on stderr that
// names what is wrong.
func wantError(t *testing.T, code int, stderr string, wantCode int, wantText string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit %d, want %d; stderr: %s", code, wantCode, stderr)
	}
	if lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n"); len(lines) != 1 {
		t.Errorf("stderr has %d lines, want one:\n%s", len(lines), stderr)
	}
	if !strings.Contains(stderr, wantText) {
		t.Errorf("stderr %q does not say %q", stderr, wantText)
	}
}

func deadAddr(t *testing.T) string { return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) }

func TestHelpAndUnknownCommand(t *testing.T) {
	code, _, stderr := cli(t)
	if code != 2 || !strings.Contains(stderr, "usage: idemguard COMMAND") {
		t.Errorf("no args: exit %d, %q", code, stderr)
	}
	code, _, stderr = cli(t, "help")
	if code != 0 || !strings.Contains(stderr, "demo") || !strings.Contains(stderr, "purge") {
		t.Errorf("help: exit %d, %q", code, stderr)
	}
	// Optional flags are shown in brackets: --before and --state have defaults.
	for _, want := range []string{"purge --postgres DSN [--before DURATION]", "list [--redis ADDR] [--state "} {
		if !strings.Contains(stderr, want) {
			t.Errorf("help does not show %q:\n%s", want, stderr)
		}
	}
	code, _, stderr = cli(t, "frobnicate")
	wantError(t, code, stderr, 2, `unknown command "frobnicate"`)
	code, _, stderr = cli(t, "bench", "-h")
	if code != 0 || !strings.Contains(stderr, "-concurrency") {
		t.Errorf("bench -h: exit %d, %q", code, stderr)
	}
}

var effectsLine = regexp.MustCompile(`business effects\s+(\d+) == distinct (keys|messages) (\d+)\s+OK`)

// checkDemo asserts the demo's report: both storms' effects equal their
// distinct keys.
func checkDemo(t *testing.T, out string, keys, messages int) {
	t.Helper()
	for _, p := range demoProblems(out, keys, messages) {
		t.Error(p)
	}
}

// demoProblems is what is wrong with the demo's report: a storm whose
// effects are not its distinct keys, HTTP executions beside its keys.
func demoProblems(out string, keys, messages int) []string {
	m := effectsLine.FindAllStringSubmatch(out, -1)
	if len(m) != 2 {
		return []string{fmt.Sprintf("want two OK effect lines, got %d:\n%s", len(m), out)}
	}
	var problems []string
	if m[0][1] != strconv.Itoa(keys) || m[0][3] != strconv.Itoa(keys) {
		problems = append(problems, "HTTP: "+m[0][0])
	}
	if m[1][1] != strconv.Itoa(messages) || m[1][3] != strconv.Itoa(messages) {
		problems = append(problems, "consumer: "+m[1][0])
	}
	if !regexp.MustCompile(`executions\s+` + strconv.Itoa(keys) + `\s`).MatchString(out) {
		problems = append(problems, fmt.Sprintf("HTTP executions are not %d:\n%s", keys, out))
	}
	return problems
}

// The README's first command, exactly: no flags, no services.
func TestDemoNoFlags(t *testing.T) {
	start := time.Now()
	code, out, stderr := cli(t, "demo")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	checkDemo(t, out, 60, 300)
	if !strings.Contains(out, "embedded Redis (miniredis)") {
		t.Errorf("the demo does not say it runs on miniredis:\n%s", out)
	}
	if !strings.Contains(stderr, "progress: 100%") {
		t.Errorf("no plain progress lines off a terminal:\n%s", stderr)
	}
	t.Logf("demo took %s", time.Since(start))
}

// With --metrics, /metrics serves the guard's counters while the demo
// runs, and they match what the demo did.
func TestDemoMetrics(t *testing.T) {
	addr := deadAddr(t)
	var during, after string
	ready := func(url string, storms bool) {
		resp, err := http.Get(url)
		if err != nil {
			t.Errorf("GET %s: %v", url, err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if storms {
			after = string(b)
		} else {
			during = string(b)
		}
	}
	var errb bytes.Buffer
	c, err := parseDemo([]string{"--metrics", addr, "--keys", "20", "--copies", "3", "--messages", "60", "--work", "5ms"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	c.metricsReady = ready
	var outb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := demo(ctx, c, &outb, &errb); err != nil {
		t.Fatalf("%v\n%s\n%s", err, outb.String(), errb.String())
	}
	out := outb.String()
	checkDemo(t, out, 20, 60)
	if !strings.Contains(during, `idemguard_outcomes_total{kind="acquired"} 0`) {
		t.Errorf("before the storms, /metrics lacks a zero acquired count:\n%.2000s", during)
	}
	// Every key and message is acquired exactly once: 20 + 60.
	if !strings.Contains(after, `idemguard_outcomes_total{kind="acquired"} 80`) {
		t.Errorf("after the storms, acquired is not 80:\n%.3000s", after)
	}
	if !strings.Contains(after, `idemguard_store_duration_seconds_count{op="claim",result="ok"}`) {
		t.Errorf("no claim latency histogram:\n%.3000s", after)
	}
}

// On real Redis and PostgreSQL the effects are rows in a table, counted by
// the database.
func TestDemoRealServices(t *testing.T) {
	addr := testenv.RedisAddr(t)
	_, dsn := testenv.Postgres(t)
	code, out, stderr := cli(t, "demo", "--redis", addr, "--postgres", dsn, "--keys", "30", "--copies", "3", "--messages", "100", "--work", "5ms")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	checkDemo(t, out, 30, 100)
	if !strings.Contains(out, "PostgreSQL") {
		t.Errorf("the demo does not say it uses PostgreSQL:\n%s", out)
	}
}

// demo --schema takes any schema pgstore takes, a '"' in it too (the
// demo's own table was named with the '"' not doubled: a syntax error,
// after the backstop had been migrated there).
func TestDemoSchemaWithQuote(t *testing.T) {
	addr := testenv.RedisAddr(t)
	db, dsn := testenv.Postgres(t)
	schema := `demo"quote_` + strings.ToLower(rand.Text()[:6])
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+pgsql.QuoteIdent(schema)+` CASCADE`)
	})
	code, out, stderr := cli(t, "demo", "--redis", addr, "--postgres", dsn, "--schema", schema,
		"--keys", "3", "--copies", "2", "--messages", "6", "--consumers", "2", "--work", "1ms")
	if code != 0 {
		t.Fatalf("demo --schema %q: exit %d, want 0\n%s\n%s", schema, code, out, stderr)
	}
	checkDemo(t, out, 3, 6)
}

// --log writes a slog record for every replay and conflict.
func TestDemoLog(t *testing.T) {
	code, out, stderr := cli(t, "demo", "--log", "--keys", "5", "--copies", "3", "--messages", "20", "--work", "5ms")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	checkDemo(t, out, 5, 20)
	replays := regexp.MustCompile(`replays\s+(\d+)`).FindStringSubmatch(out)
	if replays == nil {
		t.Fatalf("no replays line:\n%s", out)
	}
	// Every HTTP replay (10: two copies of 5 keys) and every consumer
	// duplicate (6) is logged.
	if n := strings.Count(stderr, `msg="idemguard replayed"`); n < 10+6 {
		t.Errorf("%d replay records, want at least 16:\n%s", n, stderr)
	}
}

// With --wait, copies of a key in flight wait for the first copy's
// response instead of being told 409.
func TestDemoWait(t *testing.T) {
	code, out, stderr := cli(t, "demo", "--wait", "5s", "--keys", "10", "--copies", "4", "--messages", "20", "--work", "50ms")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	checkDemo(t, out, 10, 20)
	if !regexp.MustCompile(`conflicts\s+0\s`).MatchString(out) {
		t.Errorf("conflicts with --wait:\n%s", out)
	}
	if !regexp.MustCompile(`replays\s+30\s`).MatchString(out) {
		t.Errorf("want 30 replays (3 copies of 10 keys):\n%s", out)
	}
}

func TestVerdict(t *testing.T) {
	var b bytes.Buffer
	if f := verdict(&b, "distinct keys", 10, 10, 10); f != nil {
		t.Errorf("equal counts judged wrong: %v", f)
	}
	for _, c := range [][3]int64{{11, 10, 10}, {9, 9, 10}, {10, 9, 10}} {
		if f := verdict(&b, "distinct keys", c[0], c[1], c[2]); len(f) != 1 {
			t.Errorf("%v judged right", c)
		}
	}
	if !strings.Contains(b.String(), "WRONG") {
		t.Error("no WRONG mark printed")
	}
}

func TestDemoBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"--keys", "0"}, 2, "--keys"},
		{[]string{"--duplicates", "1.5"}, 2, "--duplicates 1.5"},
		{[]string{"--lease", "1ms"}, 2, "--lease"},
		{[]string{"--wait", "-1s"}, 2, "--wait -1s"},
		{[]string{"--redis", "nohost"}, 2, `--redis "nohost"`},
		{[]string{"--metrics", "nope"}, 2, `--metrics "nope"`},
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--redis", deadAddr(t)}, 1, "does not answer"},
		{[]string{"--postgres", "postgres://nobody@" + deadAddr(t) + "/db?sslmode=disable"}, 1, "postgres does not answer"},
		{[]string{"--postgres", "bogus"}, 2, "--postgres: "},
	} {
		code, _, stderr := cli(t, append([]string{"demo"}, c.args...)...)
		wantError(t, code, stderr, c.code, c.text)
	}
}

func TestBench(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	code, out, stderr := cli(t, "bench", "--scenario", "setnx+set,fresh,storm,naive-storm", "--concurrency", "2,4",
		"--ops", "60", "--keys", "20", "--duplicates", "3", "--chart", chart)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| scenario") {
			rows++
		}
	}
	// Each guard row runs right after its baseline in the same transport
	// mode: setnx+set, setnx+set-auto, fresh, naive-storm-auto, storm,
	// naive-storm, at 2 and at 4 workers.
	if rows != 12 {
		t.Errorf("%d rows, want 12:\n%s", rows, out)
	}
	if !strings.Contains(out, "| fresh | miniredis | 4 |") || !strings.Contains(out, "× setnx+set-auto") {
		t.Errorf("no fresh row at 4 workers with its ratio:\n%s", out)
	}
	if !regexp.MustCompile(`\| storm \| miniredis \| 2 \|[^\n]*\| 20 \| 20 \| 0 \|`).MatchString(out) {
		t.Errorf("guard storm row does not show 20 keys, 20 effects, 0 duplicates:\n%s", out)
	}
	if st, err := os.Stat(chart); err != nil || st.Size() == 0 {
		t.Errorf("chart: %v", err)
	}
}

func TestBenchRealRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	code, out, stderr := cli(t, "bench", "--target", addr, "--scenario", "get,replay", "--concurrency", "8", "--duration", "200ms", "--format", "text")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	if !strings.Contains(out, "replay") || !strings.Contains(stderr, "redis "+addr) {
		t.Errorf("output:\n%s\n%s", out, stderr)
	}
}

func TestBenchBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"--scenario", "nope"}, 2, `unknown scenario "nope"`},
		{[]string{"--scenario", ","}, 2, "--scenario is empty"},
		{[]string{"--concurrency", "4,x"}, 2, `--concurrency: "x"`},
		{[]string{"--concurrency", "0"}, 2, `--concurrency: "0"`},
		{[]string{"--duration", "-1s"}, 2, "--duration -1s"},
		{[]string{"--duration", "soon"}, 2, "invalid value \"soon\" for flag -duration"},
		{[]string{"--target", "nohost"}, 2, `--target "nohost"`},
		{[]string{"--chart", "out.txt"}, 2, `--chart "out.txt"`},
		{[]string{"--format", "html"}, 2, `--format "html"`},
		{[]string{"--keys", "0"}, 2, "--keys 0"},
		{[]string{"--target", deadAddr(t), "--ops", "1"}, 1, "does not answer"},
	} {
		code, _, stderr := cli(t, append([]string{"bench"}, c.args...)...)
		wantError(t, code, stderr, c.code, c.text)
	}
}

// keysFixture writes keys in each state under a prefix of the test's own.
func keysFixture(t *testing.T) (addr, prefix string, g *guard.Guard) {
	t.Helper()
	addr, prefix = testenv.RedisAddr(t), testenv.Prefix(t)
	store := guardenv.Store(t, guard.RedisOptions{Prefix: prefix})
	return addr, prefix, guard.New(store, guard.Options{Lease: time.Minute})
}

func TestInspectListRelease(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	ctx := context.Background()
	k := func(id string) guard.Key { return guard.Key{Scope: "POST /orders", ID: id} }
	if _, err := g.Do(ctx, k("done"), "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("0123456789"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, k("running"), "fp"); err != nil {
		t.Fatal(err)
	}
	// A holder that died: its lease (500ms) ran out. Not shorter: a claim
	// answered after its deadline (lease − LeaseMargin: 97ms at 100ms) is
	// released, and a loaded machine's Redis round trip can take that long.
	short := guard.New(g.Store(), guard.Options{Lease: 500 * time.Millisecond})
	if _, err := short.Claim(ctx, k("stuck"), "fp"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Do(ctx, k("broken"), "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, errors.New("card declined")
	}); err == nil {
		t.Fatal("want the failure back")
	}
	flags := []string{"--redis", addr, "--prefix", prefix}

	code, out, stderr := cli(t, append(append([]string{"inspect"}, flags...), "POST /orders", "done")...)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"state        completed", "fence        1", "attempts     1", "result size  10 bytes", "lease left   none"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect done: no %q in\n%s", want, out)
		}
	}
	_, out, _ = cli(t, append(append([]string{"inspect"}, flags...), "POST /orders", "broken")...)
	if !strings.Contains(out, "state        failed") || !strings.Contains(out, "last error   card declined") {
		t.Errorf("inspect broken:\n%s", out)
	}
	_, out, _ = cli(t, append(append([]string{"inspect"}, flags...), "POST /orders", "running")...)
	if !regexp.MustCompile(`lease left\s+[1-9][0-9.]*s`).MatchString(out) {
		t.Errorf("inspect running: no lease left:\n%s", out)
	}

	// Wait for the stuck key's lease to run out (a Redis TTL on a real server).
	testenv.WaitFor(t, 5*time.Second, "the stuck key's 500ms lease to run out", func() bool {
		rec, err := g.Get(ctx, k("stuck"))
		if err != nil {
			t.Fatal(err)
		}
		return rec.LeaseLeft == 0
	})

	code, out, stderr = cli(t, append(append([]string{"list"}, flags...), "--state", "pending")...)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	if !regexp.MustCompile(`POST /orders\s+running\s+pending\s+1\s+1\s+[0-9.]+m?s`).MatchString(out) ||
		!regexp.MustCompile(`POST /orders\s+stuck\s+pending\s+1\s+1\s+expired`).MatchString(out) ||
		strings.Contains(out, "done") || strings.Contains(out, "broken") {
		t.Errorf("list pending:\n%s", out)
	}
	if !strings.Contains(stderr, "2 pending keys") {
		t.Errorf("list pending summary: %s", stderr)
	}
	// A completed record keeps no scope and ID: list shows its Redis key.
	_, out, _ = cli(t, append(append([]string{"list"}, flags...), "--state", "completed")...)
	doneName := g.Store().(*guard.RedisStore).Name(k("done"))
	if !regexp.MustCompile(`-\s+-\s+completed\s+1\s+1\s+-\s+`+regexp.QuoteMeta(doneName)).MatchString(out) || strings.Contains(out, "running") {
		t.Errorf("list completed:\n%s", out)
	}
	// ... and inspect takes that Redis key, the only name such a record has.
	code, out, stderr = cli(t, append(append([]string{"inspect"}, flags...), doneName)...)
	if code != 0 {
		t.Fatalf("inspect %s: exit %d: %s", doneName, code, stderr)
	}
	for _, want := range []string{doneName, "state        completed", "result size  10 bytes", "not kept"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect by Redis key: no %q in\n%s", want, out)
		}
	}
	code, _, stderr = cli(t, append(append([]string{"inspect"}, flags...), prefix+"{AAAAAAAAAAAAAAAAAAAAAA}")...)
	wantError(t, code, stderr, 1, "no record under "+prefix+"{AAAAAAAAAAAAAAAAAAAAAA}")
	code, _, stderr = cli(t, append(append([]string{"inspect", "--postgres", "postgres://x@127.0.0.1:1/db"}, flags...), doneName)...)
	wantError(t, code, stderr, 2, "--postgres finds a row by SCOPE ID")
	_, out, _ = cli(t, append(append([]string{"list"}, flags...), "--state", "failed")...)
	if !regexp.MustCompile(`POST /orders\s+broken\s+failed\s+1\s+1\s+-`).MatchString(out) {
		t.Errorf("list failed:\n%s", out)
	}

	// release refuses a completed key and a live holder, frees a stuck one.
	code, _, stderr = cli(t, append(append([]string{"release"}, flags...), "POST /orders", "done")...)
	wantError(t, code, stderr, 1, "is completed")
	code, _, stderr = cli(t, append(append([]string{"release"}, flags...), "POST /orders", "running")...)
	wantError(t, code, stderr, 1, "lease is alive")
	code, out, stderr = cli(t, append(append([]string{"release"}, flags...), "POST /orders", "stuck")...)
	if code != 0 || !strings.Contains(out, "released POST /orders/stuck") {
		t.Fatalf("release stuck: exit %d: %s %s", code, out, stderr)
	}
	if rec, err := g.Get(ctx, k("stuck")); err != nil || rec.State != guard.StateFailed || rec.LastError != releaseReason {
		t.Errorf("after release the stuck key reads %v %q (%v), want failed by the release", rec.State, rec.LastError, err)
	}
	ran := false
	if _, err := g.Do(ctx, k("stuck"), "fp", func(context.Context, guard.Lease) ([]byte, error) {
		ran = true
		return nil, nil
	}); err != nil || !ran {
		t.Errorf("a released key did not run again: %v", err)
	}
	code, _, _ = cli(t, append(append([]string{"release", "--force"}, flags...), "POST /orders", "running")...)
	if code != 0 {
		t.Errorf("release --force of a live holder: exit %d", code)
	}
	if rec, err := g.Get(ctx, k("done")); err != nil || rec.State != guard.StateCompleted {
		t.Errorf("the completed key changed: %v %v", rec.State, err)
	}
	code, _, stderr = cli(t, append(append([]string{"inspect"}, flags...), "POST /orders", "never")...)
	wantError(t, code, stderr, 1, "no record for POST /orders/never")
}

func TestInspectPostgres(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pg, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(pg, guard.Options{})
	key := guard.Key{Scope: "billing", ID: "invoice-9"}
	if _, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("paid"), nil }); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := cli(t, "inspect", "--redis", testenv.RedisAddr(t), "--prefix", testenv.Prefix(t), "--postgres", dsn, "billing", "invoice-9")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, "no record for billing/invoice-9") || !strings.Contains(out, "postgres\n") ||
		!strings.Contains(out, "state        completed") || !strings.Contains(out, "result size  4 bytes") {
		t.Errorf("inspect from postgres:\n%s", out)
	}
}

// TestInspectGatewayFallback: inspect --postgres finds the row a gateway
// kept in its fallback PostgreSQL during a Redis outage, by the scope and
// ID it shows and the gateway's Redis prefix (--prefix): the gateway keeps
// it under that prefix, so a lookup by the bare scope found nothing.
func TestInspectGatewayFallback(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pg, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix(t)
	scope := `"acct9" POST /orders`
	g := guard.New(pg, guard.Options{})
	if _, err := g.Do(ctx, guard.Key{Scope: gateway.SecondaryScope(prefix, scope), ID: "shared-K"}, "fp",
		func(context.Context, guard.Lease) ([]byte, error) { return []byte("201"), nil }); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := cli(t, "inspect", "--redis", testenv.RedisAddr(t), "--prefix", prefix, "--postgres", dsn, scope, "shared-K")
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, stderr, out)
	}
	if !strings.Contains(out, "postgres (the fallback of the gateway with redis.prefix") ||
		!strings.Contains(out, "state        completed") || !strings.Contains(out, "result size  3 bytes") {
		t.Errorf("inspect from a gateway's fallback:\n%s", out)
	}
	// Another gateway's prefix names none of it.
	code, out, _ = cli(t, "inspect", "--redis", testenv.RedisAddr(t), "--prefix", prefix+"other:", "--postgres", dsn, scope, "shared-K")
	if code != 1 || !strings.Contains(out, "postgres: no row for") {
		t.Errorf("inspect with another prefix: exit %d\n%s", code, out)
	}
}

func TestKeyCommandsBadInput(t *testing.T) {
	dead := deadAddr(t)
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"inspect", "only-scope"}, 2, "want SCOPE and ID, or a Redis key as idemguard list shows it (idem:{…}), got 1 arguments"},
		{[]string{"inspect", "s", strings.Repeat("x", 300)}, 2, "invalid key"},
		{[]string{"inspect", "--redis", "nohost", "s", "i"}, 2, `--redis "nohost"`},
		{[]string{"inspect", "--redis", dead, "s", "i"}, 1, "redis at " + dead + " does not answer"},
		{[]string{"inspect", "--redis", dead, "--postgres", "postgres://x@" + dead + "/db", "s", "i"}, 1, "does not answer"},
		{[]string{"inspect", "--redis", dead, "--postgres", "bogus", "s", "i"}, 2, "--postgres: "},
		{[]string{"list", "--state", "bogus"}, 2, `--state "bogus"`},
		{[]string{"list", "--limit", "-1"}, 2, "--limit -1"},
		{[]string{"list", "--redis", dead}, 1, "does not answer"},
		{[]string{"list", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"release", "s"}, 2, "want SCOPE and ID"},
		{[]string{"release", "--redis", dead, "s", "i"}, 1, "does not answer"},
	} {
		code, _, stderr := cli(t, c.args...)
		wantError(t, code, stderr, c.code, c.text)
	}
	// A key that does not exist cannot be released.
	addr, prefix, _ := keysFixture(t)
	// A prefix under which nothing is kept (often not the guard's) is named.
	code, _, stderr := cli(t, "list", "--redis", addr, "--prefix", prefix+"typo:")
	if code != 0 || !strings.Contains(stderr, "no idemguard records under "+prefix+"typo:* on "+addr) || !strings.Contains(stderr, "--prefix") {
		t.Errorf("list under an empty prefix: exit %d, %q", code, stderr)
	}
	code, _, stderr = cli(t, "release", "--redis", addr, "--prefix", prefix, "s", "absent")
	wantError(t, code, stderr, 1, "no record for s/absent")
}

func TestMigrateAndPurge(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	code, out, stderr := cli(t, "migrate", "--postgres", dsn, "up")
	if code != 0 || !strings.Contains(out, "migrated up: schema version 0 -> ") {
		t.Fatalf("migrate up: exit %d: %s %s", code, out, stderr)
	}
	code, out, _ = cli(t, "migrate", "--postgres", dsn, "up")
	if code != 0 || !regexp.MustCompile(`version (\d+) -> (\d+)`).MatchString(out) {
		t.Fatalf("migrate up again: exit %d: %s", code, out)
	}
	// Rows: two expired, one live.
	ctx := context.Background()
	store, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, ttl := range []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, time.Hour} {
		// A lease of its own length: the claim is bounded by it, and a
		// loaded machine's Postgres once took over a second (the test is
		// about TTLs, not leases).
		g := guard.New(store, guard.Options{TTL: ttl, Lease: 10 * time.Second})
		if _, err := g.Do(ctx, guard.Key{Scope: "p", ID: strconv.Itoa(i)}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the short TTLs to pass on the database's clock.
	testenv.WaitFor(t, 5*time.Second, "2 rows to expire", func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE expires_at <= now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	code, out, stderr = cli(t, "purge", "--postgres", dsn, "--before", "1h")
	if code != 0 || !strings.Contains(out, "purged 0 expired rows") {
		t.Fatalf("purge --before 1h of rows expired moments ago: exit %d: %s %s", code, out, stderr)
	}
	code, out, stderr = cli(t, "purge", "--postgres", dsn, "--before", "0s", "--lock-addrs", strings.Join(testenv.List(t, testenv.EnvRedlock), ","))
	if code != 0 || !strings.Contains(out, "purged 2 expired rows") {
		t.Fatalf("purge: exit %d: %s %s", code, out, stderr)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys`).Scan(&left); err != nil || left != 1 {
		t.Errorf("%d rows left (%v), want the live one", left, err)
	}
	code, out, _ = cli(t, "purge", "--postgres", dsn, "--before", "0s")
	if code != 0 || !strings.Contains(out, "purged 0 expired rows") {
		t.Errorf("second purge without a lock: exit %d: %s", code, out)
	}
	// down drops the tables and their rows: not without --force.
	code, _, stderr = cli(t, "migrate", "--postgres", dsn, "down")
	wantError(t, code, stderr, 2, "add --force")
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys`).Scan(&left); err != nil || left != 1 {
		t.Errorf("after a refused down: %d rows (%v), want the live one kept", left, err)
	}
	code, out, stderr = cli(t, "migrate", "--postgres", dsn, "--force", "down")
	if code != 0 || !strings.Contains(out, "-> 0") {
		t.Fatalf("migrate --force down: exit %d: %s %s", code, out, stderr)
	}
}

func TestMigratePurgeBadInput(t *testing.T) {
	dead := "postgres://nobody@" + deadAddr(t) + "/db?sslmode=disable"
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"migrate", "up"}, 2, "--postgres is required"},
		{[]string{"migrate", "--postgres", dead}, 2, "want one direction"},
		{[]string{"migrate", "--postgres", dead, "sideways"}, 2, `"sideways": want one direction`},
		{[]string{"migrate", "--postgres", dead, "up", "now"}, 2, `got "up now"`},
		{[]string{"migrate", "--postgres", dead, "down"}, 2, "add --force"},
		{[]string{"migrate", "--postgres", dead, "up"}, 1, "postgres does not answer"},
		{[]string{"purge", "--before", "0s"}, 2, "--postgres is required"},
		{[]string{"purge", "--postgres", dead, "--before", "-1s"}, 2, "--before -1s must not be negative"},
		{[]string{"purge", "--postgres", dead, "--before", "0s", "--batch", "0"}, 2, "--batch 0"},
		{[]string{"purge", "--postgres", dead, "--before", "0s", "--lock-addrs", "a,b"}, 2, `"a" is not host:port`},
		{[]string{"purge", "--postgres", dead, "--before", "0s", "--lock-addrs", "h:1,i:1,h:1"}, 2, `"h:1" is given twice`},
		// A list with no node in it asked for the lock: running without it is not what was asked.
		{[]string{"purge", "--postgres", dead, "--before", "0s", "--lock-addrs", ",,"}, 2, `--lock-addrs ",,": no node`},
		{[]string{"purge", "--postgres", dead, "--before", "0s", "--lock-addrs", " "}, 2, `--lock-addrs " ": no node`},
		{[]string{"purge", "--postgres", dead, "--before", "0s"}, 1, "postgres does not answer"},
		// A DSN that cannot be read is a mistake in the command line, not
		// a server that does not answer.
		{[]string{"migrate", "--postgres", "bogus", "up"}, 2, `--postgres: `},
		{[]string{"purge", "--postgres", "host=h port=notaport", "--before", "0s"}, 2, `--postgres: `},
		{[]string{"migrate", "--postgres", "postgres://u:hunter2@h:badport/db", "up"}, 2, `--postgres: `},
	} {
		code, _, stderr := cli(t, c.args...)
		wantError(t, code, stderr, c.code, c.text)
		if strings.Contains(stderr, "hunter2") {
			t.Errorf("%v: the password is in the error: %s", c.args, stderr)
		}
	}
	// A database without the tables: the error says how to make them.
	_, dsn := testenv.Postgres(t)
	code, _, stderr := cli(t, "purge", "--postgres", dsn)
	wantError(t, code, stderr, 1, "idemguard migrate up")
	code, _, stderr = cli(t, "inspect", "--redis", testenv.RedisAddr(t), "--postgres", dsn, "s", "i")
	wantError(t, code, stderr, 1, "idemguard migrate up")
	// Lock nodes that do not answer: one line, non-zero, nothing purged.
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	// Three addresses, one free port on three loopback hosts: three
	// FreePort calls could give one port twice (a node given twice).
	port := strconv.Itoa(testenv.FreePort(t))
	code, _, stderr = cli(t, "purge", "--postgres", dsn, "--before", "0s", "--lock-addrs", "127.0.0.1:"+port+",127.0.0.2:"+port+",127.0.0.3:"+port)
	wantError(t, code, stderr, 1, "no quorum answers")
}

func TestServeBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("upstream: http://127.0.0.1:9\nredis: {addrs: [\"127.0.0.1:6379\"]}\n"+
		"defaults: {caller: {single: true}}\nroutes:\n  - pattern: POST /x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{}, 2, "--config FILE is required"},
		{[]string{"--config", good, "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--config", good, "--print-inventory", "--format", "xml"}, 2, `--format "xml"`},
		// Without --print-inventory, --format would start the gateway.
		{[]string{"--config", good, "--format", "json"}, 2, "--format goes with --print-inventory"},
		{[]string{"--config", filepath.Join(dir, "absent.yaml")}, 1, "no such file"},
	} {
		code, _, stderr := cli(t, append([]string{"serve"}, c.args...)...)
		wantError(t, code, stderr, c.code, c.text)
	}
	// Every mistake of a configuration on a line of its own, with its
	// place, then one line saying nothing started.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("listen: nowhere\nupstream: ftp://x\nroutes:\n  - pattern: POST /x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := cli(t, "serve", "--config", bad)
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code != 1 || len(lines) < 3 || !strings.Contains(stderr, "bad.yaml:1:") || !strings.Contains(stderr, "bad.yaml:2:") ||
		!strings.HasSuffix(lines[len(lines)-1], "mistake(s) in the configuration; nothing was started") {
		t.Errorf("exit %d:\n%s", code, stderr)
	}
}

// TestDemoSaysWhyTheStoreFailed: against a Redis that answers but
// refuses writes (out of memory) the demo fails at once, and says why.
// Before, its client retried the 503s for about 50 s and printed the last
// one, which names no cause (that stays on the server).
func TestDemoSaysWhyTheStoreFailed(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	// A script may write past maxmemory; the commands after it may not.
	// The client waits for the script's answer however long it runs, and
	// never sends it again: on a loaded machine (load ~30) the script ran
	// 5.4 s, a client with go-redis's default read timeout and retries
	// gave up on it and sent it again, and that was answered "BUSY Redis
	// is busy running a script" (as a 7 s script is on an idle machine).
	fill := "for i=1,100000 do redis.call('set','fill'..i,string.rep('x',100)) end return 0"
	filler := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: -1, MaxRetries: -1})
	defer filler.Close()
	if err := filler.Eval(context.Background(), fill, nil).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, _, stderr := cli(t, "demo", "--redis", srv.Addr(), "--keys", "3", "--copies", "2", "--messages", "4", "--work", "5ms")
	if code != 1 || !strings.Contains(stderr, "refuses writes") || !strings.Contains(stderr, "OOM") {
		t.Fatalf("demo against a full Redis: exit %d, stderr:\n%s\nwant exit 1 naming the store's OOM", code, stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the demo took %v to give up on a full Redis", took)
	}
}

// A demo whose store becomes unusable mid-run fails naming the store's
// last error (storeCause), not only the 503 its client was given.
func TestDemoStoreCause(t *testing.T) {
	var sc storeCause
	failed := errors.New("http: POST k: status 503")
	if err := sc.explain(failed); err != failed {
		t.Fatalf("with no store error: %v, want the error as it was", err)
	}
	sc.Observe(context.Background(), guard.Event{Kind: guard.EventInProgress, Err: errors.New("not this")})
	oom := fmt.Errorf("%w: OOM command not allowed", guard.ErrUnavailable)
	sc.Observe(context.Background(), guard.Event{Kind: guard.EventUnavailable, Err: oom})
	err := sc.explain(failed)
	if !errors.Is(err, failed) || !strings.Contains(err.Error(), "OOM command not allowed") || strings.Contains(err.Error(), "not this") {
		t.Fatalf("explained: %v; want the failure and the store's OOM", err)
	}
}
