package adapter

import (
	"strings"
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
	// m holds each name's average. Its keys are the table's own copies,
	// and an average changes through its pointer: assigning to an entry
	// would replace its key with the string assigned by (Go's maps do),
	// which may be a view of a buffer its caller reuses.
	m map[string]*time.Duration
}

// Observe records that a run of name took d: the average moves a quarter
// of the way to d (d itself for a name not seen yet). The table keeps a
// copy of name, not name itself: a name that shares a buffer its caller
// reuses (a fasthttp view) is safe to pass. A name already known costs no
// allocation.
func (t *RunTimes) Observe(name string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if avg, ok := t.m[name]; ok {
		*avg += (d - *avg) / 4 // weight 1/4 on the newest run
		return
	}
	if t.m == nil || len(t.m) >= MaxRunTimes {
		t.m = make(map[string]*time.Duration)
	}
	avg := new(time.Duration) // not &d, which would put d on the heap for every call
	*avg = d
	t.m[strings.Clone(name)] = avg
}

// Typical returns name's average run time, and false when no run of it
// has been observed (since the table last started again).
func (t *RunTimes) Typical(name string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d, ok := t.m[name]; ok {
		return *d, true
	}
	return 0, false
}

// Len returns how many names the table holds (at most MaxRunTimes).
func (t *RunTimes) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
