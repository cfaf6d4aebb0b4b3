package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The logger writes every replay and conflict with the key's digest, and
// nothing for routine events unless asked.
func TestLoggerLogsReplaysAndConflicts(t *testing.T) {
	var buf bytes.Buffer
	l := metrics.NewLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), metrics.LogOptions{})
	ctx := context.Background()
	key := guard.Key{Scope: "POST /orders", ID: "k-1"}
	for _, kind := range []guard.EventKind{guard.EventAcquired, guard.EventCompleted, guard.EventReplayed,
		guard.EventInProgress, guard.EventMismatch, guard.EventExhausted, guard.EventLeaseLost, guard.EventUnavailable, guard.EventCorrupt} {
		var err error
		switch kind {
		case guard.EventUnavailable:
			err = guard.ErrUnavailable
		case guard.EventCorrupt:
			err = guard.ErrCorrupt
		}
		l.Observe(ctx, guard.Event{Kind: kind, Key: key, Attempt: 2, Err: err})
	}
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		recs = append(recs, m)
	}
	wantEvents := []string{"replayed", "in_progress", "mismatch", "exhausted", "lease_lost", "unavailable", "corrupt"}
	if len(recs) != len(wantEvents) {
		t.Fatalf("%d records, want %d:\n%s", len(recs), len(wantEvents), buf.String())
	}
	for i, r := range recs {
		if r["event"] != wantEvents[i] || r["scope"] != key.Scope || r["key"] != metrics.KeyDigest(key) || r["attempt"] != float64(2) {
			t.Errorf("record %d: %v", i, r)
		}
		wantLevel := "WARN"
		switch wantEvents[i] {
		case "replayed":
			wantLevel = "INFO"
		case "corrupt": // a record nothing can read: an operator's to fix
			wantLevel = "ERROR"
		}
		if r["level"] != wantLevel {
			t.Errorf("record %d level %v, want %s", i, r["level"], wantLevel)
		}
	}
	if recs[5]["error"] != guard.ErrUnavailable.Error() {
		t.Errorf("unavailable record has error %v", recs[5]["error"])
	}

	buf.Reset()
	all := metrics.NewLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		metrics.LogOptions{All: true, ReplayLevel: slog.LevelDebug})
	all.Observe(ctx, guard.Event{Kind: guard.EventAcquired, Key: key})
	all.Observe(ctx, guard.Event{Kind: guard.EventReplayed, Key: key})
	if n := strings.Count(buf.String(), "level=DEBUG"); n != 2 {
		t.Errorf("All with debug replays: %d debug records:\n%s", n, buf.String())
	}
}

func TestTee(t *testing.T) {
	var a, b int
	o := metrics.Tee(guard.ObserverFunc(func(context.Context, guard.Event) { a++ }), nil,
		guard.ObserverFunc(func(context.Context, guard.Event) { b++ }))
	o.Observe(context.Background(), guard.Event{Kind: guard.EventReplayed})
	if a != 1 || b != 1 {
		t.Fatalf("a=%d b=%d", a, b)
	}
}

// The logger names keys by their digest by default, in error texts too;
// LogKeys puts the id back. The digest is stable and tells keys apart.
func TestLoggerRedactsKeys(t *testing.T) {
	ctx := context.Background()
	key := guard.Key{Scope: "POST /charges", ID: "ch_9c1e77-secret"}
	ev := guard.Event{Kind: guard.EventInProgress, Key: key,
		Err: &guard.InProgressError{Key: key, RetryAfter: time.Second}}
	for _, logKeys := range []bool{false, true} {
		var buf bytes.Buffer
		l := metrics.NewLogger(slog.New(slog.NewJSONHandler(&buf, nil)), metrics.LogOptions{LogKeys: logKeys})
		l.Observe(ctx, ev)
		l.Observe(ctx, guard.Event{Kind: guard.EventUnavailable, Key: key,
			Err: fmt.Errorf("claim %s: %w", key, guard.ErrUnavailable)})
		out := buf.String()
		if strings.Count(out, metrics.KeyDigest(key)) < 2 {
			t.Errorf("LogKeys=%v: the digest is not on every record:\n%s", logKeys, out)
		}
		if strings.Contains(out, key.ID) != logKeys {
			t.Errorf("LogKeys=%v: the key's id in the log: %v\n%s", logKeys, !logKeys, out)
		}
		if !strings.Contains(out, "lease ends in 1s") || !strings.Contains(out, "store unavailable") {
			t.Errorf("LogKeys=%v: the errors lost their meaning:\n%s", logKeys, out)
		}
	}
	d := metrics.KeyDigest(key)
	if len(d) != 12 || d != metrics.KeyDigest(guard.Key{Scope: key.Scope, ID: key.ID}) {
		t.Fatalf("digest %q", d)
	}
	for _, other := range []guard.Key{{Scope: key.Scope, ID: key.ID + "x"}, {Scope: key.Scope + "x", ID: key.ID},
		{Scope: "POST /charges" + "\x00" + "ch", ID: "_9c1e77-secret"}} {
		if metrics.KeyDigest(other) == d {
			t.Errorf("%v has the digest of %v", other, key)
		}
	}
}

// Redact hides ids from 4 bytes (order numbers are often that short), in
// both the "scope/id" form and bare; a shorter id only in the first form.
func TestRedactShortIDs(t *testing.T) {
	for _, c := range []struct {
		id, text, want string
	}{
		{"40213", "claim orders/40213: charge 40213 declined", "claim orders/<key D>: charge <key D> declined"},
		{"4021", "order 4021 failed", "order <key D> failed"},
		{"42", "claim orders/42: 42 items, 142 left", "claim orders/<key D>: 42 items, 142 left"},
		{"", "nothing to hide", "nothing to hide"},
	} {
		key := guard.Key{Scope: "orders", ID: c.id}
		want := strings.ReplaceAll(c.want, "D", metrics.KeyDigest(key))
		if got := metrics.Redact(c.text, key); got != want {
			t.Errorf("Redact(%q, id %q) = %q, want %q", c.text, c.id, got, want)
		}
	}
}

// The levels LogOptions.All documents: recovered and failed at Info with
// or without it; acquired, completed and released at Debug, only with it.
func TestLoggerRoutineLevels(t *testing.T) {
	key := guard.Key{Scope: "s", ID: "routine"}
	for _, all := range []bool{false, true} {
		var buf bytes.Buffer
		l := metrics.NewLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), metrics.LogOptions{All: all})
		for _, k := range []guard.EventKind{guard.EventAcquired, guard.EventRecovered, guard.EventCompleted, guard.EventFailed, guard.EventReleased} {
			l.Observe(context.Background(), guard.Event{Kind: k, Key: key})
		}
		want := []string{"level=INFO msg=\"idemguard recovered\"", "level=INFO msg=\"idemguard failed\""}
		if all {
			want = append(want, "level=DEBUG msg=\"idemguard acquired\"", "level=DEBUG msg=\"idemguard completed\"", "level=DEBUG msg=\"idemguard released\"")
		}
		out := buf.String()
		if n := strings.Count(out, "\n"); n != len(want) {
			t.Errorf("All=%v: %d records, want %d:\n%s", all, n, len(want), out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("All=%v: no %s in:\n%s", all, w, out)
			}
		}
	}
}
