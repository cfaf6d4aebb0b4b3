package adapter

import (
	"sync"
	"time"
)

// MaxRunTimes bounds a RunTimes: past it the averages start again, so a
// route or method namer that names many cannot grow the map without end.
const MaxRunTimes = 1024

// RunTimes keeps, per route or method, a moving average of how long the
// handler took: what the in-flight answer's retry delay (Retry-After,
// RetryInfo) is made of. It is this instance's own; another instance that
// has not run the route yet answers with its adapter's default. The zero
// value is ready to use and safe for concurrent use.
type RunTimes struct {
	mu sync.Mutex
	m  map[string]time.Duration
}

// Observe records that a run of name took d: the average moves a quarter
// of the way to d (d itself for a name not seen yet).
func (t *RunTimes) Observe(name string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	avg, ok := t.m[name]
	switch {
	case ok:
		t.m[name] = avg + (d-avg)/4 // weight 1/4 on the newest run
	case t.m == nil || len(t.m) >= MaxRunTimes:
		t.m = map[string]time.Duration{name: d}
	default:
		t.m[name] = d
	}
}

// Typical returns name's average run time, and false when no run of it
// has been observed (since the table last started again).
func (t *RunTimes) Typical(name string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[name]
	return d, ok
}

// Len returns how many names the table holds (at most MaxRunTimes).
func (t *RunTimes) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
