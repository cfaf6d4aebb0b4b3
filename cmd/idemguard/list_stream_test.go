package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// cancelOnWrite is a terminal whose operator presses Ctrl-C as soon as the
// first line shows.
type cancelOnWrite struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.Buffer.Write(p)
}

// list's table streams: rows reach the terminal while the scan goes on,
// so a list over a large keyspace is seen as it comes, holds a bounded
// number of rows in memory, and an operator's Ctrl-C keeps what was
// shown. (The table was aligned over every row at the end: with --limit 0
// over 120,000 records nothing was printed for 23 s, the process grew to
// 74 MB against 27 MB, and a Ctrl-C printed no row at all.)
func TestListTableStreams(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	const keys = 3 * listBlock
	completeKeys(t, g, keys)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	var errb bytes.Buffer
	code := run(ctx, []string{"list", "--redis", addr, "--prefix", prefix, "--state", "completed", "--limit", "0"}, out, &errb)
	rows := strings.Count(out.String(), " completed ")
	if code != 1 || !strings.Contains(errb.String(), "context canceled") {
		t.Errorf("Ctrl-C at the first line shown: exit %d, %q; want 1 and the cancellation: the first line came after the scan (%d rows)", code, errb.String(), rows)
	}
	if rows == 0 || rows >= keys {
		t.Errorf("%d of %d rows shown before the Ctrl-C; want the rows listed by then, not all", rows, keys)
	}
	if !strings.HasPrefix(out.String(), "SCOPE") {
		t.Errorf("the table has no header:\n%s", out.String())
	}
}

// killOnWrite is a terminal that sees Redis die as soon as the first line
// shows.
type killOnWrite struct {
	bytes.Buffer
	kill func()
	once sync.Once
}

func (w *killOnWrite) Write(p []byte) (int, error) {
	w.once.Do(w.kill)
	return w.Buffer.Write(p)
}

// list walks the keyspace with SCAN, never KEYS (which blocks a large
// server): it runs on a server whose KEYS is disabled, as production
// servers often have it. A Redis that dies during the list leaves the
// rows listed before on the terminal and exits 1 naming Redis.
func TestListScansAndRedisDiesMidList(t *testing.T) {
	srv := testenv.StartRedis(t, "--rename-command", "KEYS", "")
	store := guard.NewRedisStore(srv.Client(), guard.RedisOptions{})
	g := guard.New(store, guard.Options{})
	const keys = 3 * listBlock
	completeKeys(t, g, keys)
	code, out, stderr := cli(t, "list", "--redis", srv.Addr(), "--state", "completed", "--limit", "0")
	if code != 0 || strings.Count(out, " completed ") != keys {
		t.Fatalf("list on a server without KEYS: exit %d, %d rows, %s", code, strings.Count(out, " completed "), stderr)
	}

	w := &killOnWrite{kill: srv.Kill}
	var errb bytes.Buffer
	code = run(context.Background(), []string{"list", "--redis", srv.Addr(), "--state", "completed", "--limit", "0"}, w, &errb)
	wantError(t, code, errb.String(), 1, "scan "+srv.Addr())
	if rows := strings.Count(w.String(), " completed "); rows < listBlock || rows >= keys {
		t.Errorf("Redis killed at the first line shown: %d of %d rows listed, want the first block's %d at least, not all", rows, keys, listBlock)
	}
}

// completeKeys completes n keys (scope "POST /x", ids 0 to n-1) through
// g, in one batch.
func completeKeys(t *testing.T, g *guard.Guard, n int) {
	t.Helper()
	items := make([]guard.BatchItem, n)
	for i := range items {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: "POST /x", ID: strconv.Itoa(i)}, Fingerprint: "fp"}
	}
	for _, r := range g.DoBatch(context.Background(), items, func(context.Context, int, guard.Lease) ([]byte, error) {
		return []byte("ok"), nil
	}, guard.BatchOptions{}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}
