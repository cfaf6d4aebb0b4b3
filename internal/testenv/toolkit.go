package testenv

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond every millisecond (backing off to 20 ms) until it
// holds, and fails the test naming what it waited for when limit passes
// first. It is for conditions another goroutine or process makes true; it
// never stands in for synchronisation the code under test offers.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
		time.Sleep(pause)
	}
}

// Logger returns a logger whose records go to t.Log: silent in a passing
// run without -v, shown beside the failure otherwise. Records logged after
// the test ended are dropped. In a benchmark, whose log is printed even
// when it passes and whose timing the logging would change, every record
// is dropped.
func Logger(t testing.TB) *slog.Logger { return LoggerAt(t, slog.LevelDebug) }

// LoggerAt is Logger keeping only records at level or above: for a storm
// whose every request would log, so that what went wrong is still shown.
func LoggerAt(t testing.TB, level slog.Level) *slog.Logger {
	if _, bench := t.(*testing.B); bench {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
