package httpcore

import (
	"errors"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// runTimes keeps, per route scope (Options.Scope, without the caller), a
// moving average of how long the handler took: what the in-flight answer's
// Retry-After is made of. It is this instance's own; another instance that
// has not run the route yet answers with the floor (1 s).
type runTimes struct {
	mu sync.Mutex
	m  map[string]time.Duration
}

// maxRouteScopes bounds runTimes: past it the averages start again, so a
// Scope func that names many routes cannot grow the map without end.
const maxRouteScopes = 1024

func (t *runTimes) observe(scope string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	avg, ok := t.m[scope]
	switch {
	case ok:
		t.m[scope] = avg + (d-avg)/4 // weight 1/4 on the newest run
	case t.m == nil || len(t.m) >= maxRouteScopes:
		t.m = map[string]time.Duration{scope: d}
	default:
		t.m[scope] = d
	}
}

func (t *runTimes) typical(scope string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[scope]
	return d, ok
}

// inFlightRetryAfter is when a request whose key is still running should
// come back: the route's typical run time here, at least a second (the
// unit of Retry-After), at most what is left of the holder's lease (by
// then the key is answered or free). leaseLeft <= 0 means unknown.
func (m *Engine) inFlightRetryAfter(route string, leaseLeft time.Duration) time.Duration {
	d := time.Second
	if typ, ok := m.runs.typical(route); ok {
		d = max(d, typ)
	}
	if leaseLeft > 0 {
		d = min(d, leaseLeft)
	}
	return d
}

// wait is called for a request whose key another request holds: it waits,
// up to Options.Wait, for the key to be answered or freed, and returns
// what a claim then says (a replay, the key for this request, or the
// in-flight error when the bound passed); see guard.Guard.Wait. ok is
// false when the client left (nothing was claimed).
func (m *Engine) wait(r Request, key guard.Key, fingerprint string) (out guard.Outcome, err error, ok bool) {
	ctx := r.Context()
	out, err = m.g.Wait(ctx, key, fingerprint, guard.WaitOptions{Timeout: m.opts.Wait})
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return guard.Outcome{}, nil, false
	}
	return out, err, true
}
