package core

import (
	"context"
	"errors"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// The in-flight answer's retry delay (RetryInfo), see inFlightRetryDelay.
const (
	// DefaultInFlightRetryDelay is the delay given before this instance
	// has seen the method run.
	DefaultInFlightRetryDelay = time.Second
	// MinInFlightRetryDelay is the shortest delay given, so that a
	// duplicate of a fast call does not spin.
	MinInFlightRetryDelay = 20 * time.Millisecond
)

// InFlightRetryDelay is when a call whose key is still running should come
// back: the method's typical run time on this instance (a moving average),
// at least MinInFlightRetryDelay, DefaultInFlightRetryDelay before the
// method ran here; at most what is left of the holder's lease (by then the
// key is answered or free). Unlike HTTP's Retry-After, RetryInfo is not in
// whole seconds, so a 50 ms method is asked about again after about 50 ms,
// not a second (the rule differs from HTTP's on purpose). leaseLeft <= 0
// means unknown.
func (s *Server) InFlightRetryDelay(method string, leaseLeft time.Duration) time.Duration {
	d := DefaultInFlightRetryDelay
	if typ, ok := s.runs.Typical(method); ok {
		d = max(typ, MinInFlightRetryDelay)
	}
	if leaseLeft > 0 {
		d = min(d, max(leaseLeft, MinInFlightRetryDelay))
	}
	return d
}

// wait is called for a call whose key another call holds: it waits,
// up to Options.Wait, for the key to be answered or freed, and returns
// what a claim then says (a replay, the key for this call, or the
// in-flight error when the bound passed); see guard.Guard.Wait. ok is
// false when the client left (nothing was claimed).
func (s *Server) wait(ctx context.Context, key guard.Key, fingerprint string) (out guard.Outcome, err error, ok bool) {
	out, err = s.g.Wait(ctx, key, fingerprint, guard.WaitOptions{Timeout: s.cfg.Wait})
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return guard.Outcome{}, nil, false
	}
	return out, err, true
}

// logKey returns the attributes that name k in a log record
// (adapter.LogKey).
func (s *Server) logKey(k guard.Key) []any { return adapter.LogKey(k, s.cfg.LogKeys) }

// logErr returns err's text for a log record (and for an InvalidArgument
// the client reads), with the key's id replaced by its digest unless
// Config.LogKeys (adapter.LogErr).
func (s *Server) logErr(k guard.Key, err error) string {
	return adapter.LogErr(k, err, s.cfg.LogKeys)
}
