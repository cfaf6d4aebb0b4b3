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

func (f *fakeT) Logf(format string, args ...any) { f.Log(fmt.Sprintf(format, args...)) }

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

func TestOnTimeDoublesWhileLate(t *testing.T) {
	f := &fakeT{}
	var spans []time.Duration
	f.run(func() {
		OnTime(f, "a lease", 100*time.Millisecond, 4, func(d time.Duration) bool {
			spans = append(spans, d)
			return len(spans) < 3
		})
	})
	if f.failed || fmt.Sprint(spans) != "[100ms 200ms 400ms]" || len(f.logs) != 2 {
		t.Fatalf("failed %v (%q), spans %v, logs %q; want spans 100ms, 200ms, 400ms and two logs", f.failed, f.fatal, spans, f.logs)
	}
}

func TestOnTimeFailsWhenEveryRoundLate(t *testing.T) {
	f := &fakeT{}
	var spans []time.Duration
	f.run(func() {
		OnTime(f, "a Timeout", 400*time.Millisecond, 3, func(d time.Duration) bool { spans = append(spans, d); return true })
	})
	if !f.failed || fmt.Sprint(spans) != "[400ms 800ms 1.6s]" || !strings.Contains(f.fatal, "a Timeout up to 1.6s") {
		t.Fatalf("failed %v (%q), spans %v; want 3 rounds up to 1.6s, then a failure naming them", f.failed, f.fatal, spans)
	}
}
