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
	wait := d
	wrapped(g.Store(), func(s guard.Store) bool {
		b, ok := s.(interface{ ProbeAt() (time.Time, bool) })
		if !ok {
			return true
		}
		if at, open := b.ProbeAt(); open {
			wait = max(d, time.Until(at))
		}
		return false
	})
	return wait
}
