package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
	"github.com/idemguard/idemguard/pgstore"
)

// silentServer accepts connections and never answers: a hung server, a
// firewall that swallows packets after the handshake, a port given to the
// wrong service. It stops when the test ends.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// bounded runs the command line and fails the test if it takes longer
// than limit, which a command against a server that never answers must
// not (connectTimeout, and a retry).
func bounded(t *testing.T, limit time.Duration, args ...string) (code int, stderr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code   int
		stderr string
	}
	res := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		c := run(ctx, args, &out, &errb)
		res <- result{c, errb.String()}
	}()
	select {
	case r := <-res:
		return r.code, r.stderr
	case <-time.After(limit):
		cancel() // a context-blind hang still leaks: the test fails anyway
		t.Fatalf("%v: still running after %s against a server that does not answer", args, limit)
		return 0, ""
	}
}

// A service that accepts connections but never answers is reported as not
// answering, in bounded time, with exit 1: never a hang at 3 a.m.
func TestSilentServicesBounded(t *testing.T) {
	pg := "postgres://nobody@" + silentServer(t) + "/db?sslmode=disable"
	rd := silentServer(t)
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"migrate", "--postgres", pg, "up"}, "postgres does not answer"},
		{[]string{"purge", "--postgres", pg}, "postgres does not answer"},
		{[]string{"list", "--redis", rd}, "does not answer"},
	} {
		start := time.Now()
		code, stderr := bounded(t, 20*time.Second, c.args...)
		wantError(t, code, stderr, 1, c.text)
		t.Logf("%v: %s", c.args[0], time.Since(start).Round(time.Millisecond))
	}
}

// A DSN's own connect_timeout is kept.
func TestPostgresConnectTimeoutKept(t *testing.T) {
	for dsn, want := range map[string]time.Duration{
		"postgres://u@h/db":                   connectTimeout,
		"postgres://u@h/db?connect_timeout=9": 9 * time.Second,
		"host=h connect_timeout=1":            time.Second,
	} {
		cfg, err := postgresConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnectTimeout != want {
			t.Errorf("%s: connect timeout %s, want %s", dsn, cfg.ConnectTimeout, want)
		}
	}
	if _, err := postgresConfig("postgres://u:pw@h:bad/db"); err == nil || !errors.As(err, new(usageError)) {
		t.Errorf("a bad DSN: %v, want a usage error", err)
	}
}

// expiredRows writes n completed rows under scope whose TTL (50ms) has
// passed by the database's clock.
func expiredRows(t *testing.T, db *sql.DB, scope string, n int) {
	t.Helper()
	ctx := context.Background()
	store, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(store, guard.Options{TTL: 50 * time.Millisecond, Lease: time.Second})
	for i := range n {
		if _, err := g.Do(ctx, guard.Key{Scope: scope, ID: strconv.Itoa(i)}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			return []byte("old"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the rows to expire", func() bool {
		var live int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE scope = $1 AND expires_at > now()`, scope).Scan(&live); err != nil {
			t.Fatal(err)
		}
		return live == 0
	})
}

// purge neither deletes nor waits on an expired row that a business
// transaction is re-using (backstop.Commit holds its lock): the commit
// keeps its row. (No bug: pins pgstore.Purge's SKIP LOCKED as the
// operator command runs it.)
func TestPurgeSkipsARowBeingRecommitted(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	expiredRows(t, db, "pay", 2)
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	lease := guard.Lease{Key: guard.Key{Scope: "pay", ID: "0"}, Token: "retry", Fence: 2, Attempt: 1}
	if err := b.Commit(ctx, tx, lease, "fp", []byte("new")); err != nil {
		t.Fatal(err)
	}
	code, stderr := bounded(t, 20*time.Second, "purge", "--postgres", dsn)
	if code != 0 {
		t.Fatalf("purge: exit %d: %s", code, stderr)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var result string
	if err := db.QueryRowContext(ctx, `SELECT result FROM idemguard_keys WHERE scope = 'pay' AND id = '0' AND status = 'completed'`).Scan(&result); err != nil || result != "new" {
		t.Errorf("the re-committed row: %q, %v", result, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE scope = 'pay'`).Scan(&left); err != nil || left != 1 {
		t.Errorf("%d rows left (%v), want the re-committed one alone", left, err)
	}
}

// Two purges at once, from two hosts, with and without --lock-addrs: both
// succeed, and together they delete each expired row once.
func TestConcurrentPurges(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	lockAddrs := strings.Join(testenv.List(t, testenv.EnvRedlock), ",")
	purged := regexp.MustCompile(`purged (\d+) expired rows|another purge holds the lock`)
	for _, withLock := range []bool{false, true} {
		scope := fmt.Sprintf("lock-%t", withLock)
		expiredRows(t, db, scope, 40)
		args := []string{"purge", "--postgres", dsn, "--batch", "3"}
		if withLock {
			args = append(args, "--lock-addrs", lockAddrs)
		}
		var wg sync.WaitGroup
		outs := make([]string, 2)
		codes := make([]int, 2)
		for i := range 2 {
			wg.Go(func() { codes[i], outs[i], _ = cli(t, args...) })
		}
		wg.Wait()
		total := 0
		for i := range 2 {
			m := purged.FindStringSubmatch(outs[i])
			if codes[i] != 0 || m == nil {
				t.Fatalf("lock %t: purge %d: exit %d: %q", withLock, i, codes[i], outs[i])
			}
			n, _ := strconv.Atoi(m[1])
			total += n
		}
		if total != 40 {
			t.Errorf("lock %t: the purges report %d rows deleted, want 40: %q", withLock, total, outs)
		}
		var left int
		if err := db.QueryRow(`SELECT count(*) FROM idemguard_keys WHERE scope = $1`, scope).Scan(&left); err != nil || left != 0 {
			t.Errorf("lock %t: %d rows left (%v)", withLock, left, err)
		}
	}
}

// migrate up against a database a newer idemguard migrated says so and
// fails: the schema is not this build's, and "up" changed nothing.
func TestMigrateUpNewerSchema(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	if _, err := db.Exec(`INSERT INTO idemguard_schema_migrations (version, name) VALUES (9999, 'from_the_future')`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up")
	wantError(t, code, stderr, 1, "schema version 9999, newer than this build")
}

// Purges of different tables (another database, schema or server) do not
// skip each other under one set of lock nodes; two purges of the same
// tables still take turns.
func TestPurgeLockPerTables(t *testing.T) {
	ctx := context.Background()
	dbA, dsnA := testenv.Postgres(t)
	dbB, dsnB := testenv.Postgres(t)
	for _, dsn := range []string{dsnA, dsnB} {
		if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
			t.Fatal(stderr)
		}
	}
	expiredRows(t, dbA, "x", 3)
	expiredRows(t, dbB, "x", 3)
	addrs := testenv.List(t, testenv.EnvRedlock)
	nodes := lock.NewNodes(addrs...)
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	})
	l, err := lock.New(nodes, lock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nameA, err := purgeLock(ctx, dbA, dsnA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Obtain(ctx, nameA) // a purge of A under way
	if err != nil {
		t.Fatal(err)
	}
	lockAddrs := strings.Join(addrs, ",")
	_, out, stderr := cli(t, "purge", "--postgres", dsnB, "--lock-addrs", lockAddrs)
	if !strings.Contains(out, "purged 3 expired rows") {
		t.Errorf("a purge of other tables: %q %q", out, stderr)
	}
	_, out, stderr = cli(t, "purge", "--postgres", dsnA, "--lock-addrs", lockAddrs)
	if !strings.Contains(out, "another purge holds the lock") {
		t.Errorf("a second purge of the same tables: %q %q", out, stderr)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, out, stderr = cli(t, "purge", "--postgres", dsnA, "--lock-addrs", lockAddrs)
	if !strings.Contains(out, "purged 3 expired rows") {
		t.Errorf("the purge of A once its lock is free: %q %q", out, stderr)
	}
	if strings.Contains(nameA, "@") || strings.Contains(nameA, "password") {
		t.Errorf("the lock name %q carries credentials", nameA)
	}
}

// migrate --force down leaves no idemguard table behind, the version
// table included (the version it reports after the down must not make it
// again), and one run on a database never migrated makes nothing: no
// schema, no table.
func TestMigrateDownLeavesNothing(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	tables := func(schema string) []string {
		t.Helper()
		rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
			WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) ORDER BY 1`, schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return names
	}
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	code, out, stderr := cli(t, "migrate", "--postgres", dsn, "--force", "down")
	if code != 0 || !regexp.MustCompile(`migrated down: schema version [1-9]\d* -> 0 `).MatchString(out) {
		t.Fatalf("down: exit %d: %s %s", code, out, stderr)
	}
	if left := tables(""); len(left) != 0 {
		t.Errorf("tables left after migrate --force down: %v", left)
	}
	// down again, and down of a schema never made.
	code, out, stderr = cli(t, "migrate", "--postgres", dsn, "--force", "down")
	if code != 0 || !strings.Contains(out, "schema version 0 -> 0") {
		t.Fatalf("down again: exit %d: %s %s", code, out, stderr)
	}
	schema := "never_made_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	code, out, stderr = cli(t, "migrate", "--postgres", dsn, "--schema", schema, "--force", "down")
	if code != 0 || !strings.Contains(out, "schema version 0 -> 0") {
		t.Fatalf("down of a schema never made: exit %d: %s %s", code, out, stderr)
	}
	var made bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&made); err != nil {
		t.Fatal(err)
	}
	if made {
		_, _ = db.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`)
		t.Errorf("migrate --force down made schema %s", schema)
	}
	if left := tables(""); len(left) != 0 {
		t.Errorf("tables after a second down: %v", left)
	}
	// up after it all still works, from 0.
	if code, out, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 || !regexp.MustCompile(`schema version 0 -> [1-9]`).MatchString(out) {
		t.Fatalf("up: exit %d: %s %s", code, out, stderr)
	}
}
