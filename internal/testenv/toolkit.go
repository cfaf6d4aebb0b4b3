package testenv

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/wait"
)

// EndsWithin reports whether ctx is done within d: a holder whose context
// must end by a deadline is given d of grace past it.
func EndsWithin(ctx context.Context, d time.Duration) bool { return !wait.For(ctx, d) }

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

// OnTime runs round, a case whose calls must come within a span of real
// time (a lease, a timeout), with span first and then, as long as round
// reports it was late, with spans 2, 4, … times as long, rounds in all. A
// loaded machine can hold a call back past such a span; the code under
// test is then right to answer as it did and the round proves nothing, so
// it runs again, not passed. A round on time checks as strictly as ever.
// Every round late fails the test. what names the span in the log
// ("a lease", "a Timeout").
func OnTime(t testing.TB, what string, first time.Duration, rounds int, round func(span time.Duration) (late bool)) {
	t.Helper()
	span := first
	for i := range rounds {
		if !round(span) {
			return
		}
		if i == rounds-1 {
			break
		}
		t.Logf("the round with %s of %s was too late to prove anything; again with %s", what, span, 2*span)
		span *= 2
	}
	t.Fatalf("rounds with %s up to %s were all too late to prove anything", what, span)
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
