package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeT records what a test would log or fail with; Fatalf ends the
// calling goroutine, as testing.T's does.
type fakeT struct {
	testing.TB
	mu     sync.Mutex
	logs   []string
	fatal  string
	ended  bool
	failed bool
}

func (f *fakeT) Helper() {}

func (f *fakeT) Log(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		panic("Log in goroutine after the test has completed")
	}
	f.logs = append(f.logs, fmt.Sprint(args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal, f.failed = fmt.Sprintf(format, args...), true
	f.mu.Unlock()
	runtime.Goexit()
}

// run runs fn as a test goroutine would, until it returns or fails.
func (f *fakeT) run(fn func()) {
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	<-done
}

func TestWaitForHolds(t *testing.T) {
	f := &fakeT{}
	n := 0
	f.run(func() { WaitFor(f, time.Minute, "three polls", func() bool { n++; return n == 3 }) })
	if f.failed || n != 3 {
		t.Fatalf("failed %v (%q) after %d polls; want success after 3", f.failed, f.fatal, n)
	}
}

func TestWaitForFailsNamingWhat(t *testing.T) {
	f := &fakeT{}
	f.run(func() { WaitFor(f, 30*time.Millisecond, "the impossible", func() bool { return false }) })
	if !f.failed || !strings.Contains(f.fatal, "the impossible") {
		t.Fatalf("failed %v with %q; want a failure naming what it waited for", f.failed, f.fatal)
	}
}

func TestLoggerWritesToTLog(t *testing.T) {
	f := &fakeT{}
	log := Logger(f)
	log.Warn("store down", "err", "refused")
	if len(f.logs) != 1 || !strings.Contains(f.logs[0], `msg="store down" err=refused`) || strings.HasSuffix(f.logs[0], "\n") {
		t.Fatalf("logs %q; want one line with the record", f.logs)
	}
	f.ended = true
	log.Error("after the end") // dropped, no panic
	if len(f.logs) != 1 {
		t.Fatalf("logs %q after the test ended", f.logs)
	}
}

func TestLoggerDropsInBenchmarks(t *testing.T) {
	var b testing.B
	if Logger(&b).Enabled(t.Context(), 12) {
		t.Fatal("a benchmark's logger is enabled: its records would always print")
	}
}
