package httpcore

import (
	"errors"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// inFlightRetryAfter is when a request whose key is still running should
// come back: the route's typical run time here (m.runs, keyed by route
// scope, Options.Scope without the caller), at least a second (the unit of
// Retry-After), at most what is left of the holder's lease (by then the
// key is answered or free). leaseLeft <= 0 means unknown. gRPC's rule
// differs on purpose: RetryInfo is not in whole seconds.
func (m *Engine) inFlightRetryAfter(route string, leaseLeft time.Duration) time.Duration {
	d := time.Second
	if typ, ok := m.runs.Typical(route); ok {
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
