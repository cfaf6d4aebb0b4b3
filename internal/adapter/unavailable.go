package adapter

import (
	"time"

	"github.com/idemguard/idemguard/guard"
)

// UnavailableDelay is the delay a server's "store unavailable" answer
// (HTTP 503 Retry-After, gRPC RetryInfo) asks of its client: d, or longer
// while a circuit breaker under g's store is open and will let no call
// through before its probe: a retry sooner meets the same open breaker.
// A breaker is any store on the chain of wrappers that name what they wrap
// (Unwrap() guard.Store, as SameStore walks) with a method
// ProbeAt() (time.Time, bool), as fallback.Store has.
func UnavailableDelay(g *guard.Guard, d time.Duration) time.Duration {
	s := g.Store()
	for range 64 {
		if b, ok := s.(interface{ ProbeAt() (time.Time, bool) }); ok {
			if at, open := b.ProbeAt(); open {
				return max(d, time.Until(at))
			}
			return d
		}
		w, ok := s.(interface{ Unwrap() guard.Store })
		if !ok {
			return d
		}
		if s = w.Unwrap(); s == nil {
			return d
		}
	}
	return d
}
