package testenv

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// Store returns a RedisStore on the standalone Redis, under a prefix of its
// own (opts.Prefix is replaced by Prefix(t) unless set), with its scripts
// loaded.
func Store(t testing.TB, opts guard.RedisOptions) *guard.RedisStore {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = Prefix(t)
	}
	s := guard.NewRedisStore(Redis(t), opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("load scripts: %v", err)
	}
	return s
}

// Guard returns a Guard over Store(t, guard.RedisOptions{}).
func Guard(t testing.TB, opts guard.Options) *guard.Guard {
	t.Helper()
	return guard.New(Store(t, guard.RedisOptions{}), opts)
}

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
// the test ended are dropped.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
