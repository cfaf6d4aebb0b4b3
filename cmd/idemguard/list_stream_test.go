package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
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
	items := make([]guard.BatchItem, keys)
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
