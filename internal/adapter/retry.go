package adapter

import (
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// The retrying clients' defaults (httpx.TransportOptions,
// grpcx.ClientOptions, connectx's), one set for both protocols.
const (
	// DefaultMaxAttempts bounds the attempts of one call, the first
	// included.
	DefaultMaxAttempts = 5
	// DefaultBaseDelay and DefaultMaxDelay shape the backoff (Backoff).
	DefaultBaseDelay = 100 * time.Millisecond
	DefaultMaxDelay  = 10 * time.Second
	// DefaultMaxServerDelay is the longest delay a server may ask for
	// (Retry-After, RetryInfo) before the client gives up instead.
	DefaultMaxServerDelay = time.Minute
	// DefaultInFlightDelay is the longest wait before asking again about a
	// key whose first call still runs.
	DefaultInFlightDelay = time.Second
	// DefaultMaxInFlightWait bounds the time spent asking again so.
	DefaultMaxInFlightWait = time.Minute
)

// Backoff is the full-jitter delay before retry n (n = 1, 2, ...): a
// uniformly random time in [0, min(maxDelay, base·2^(n-1))), for any n and
// any maxDelay (math.MaxInt64 too). base and maxDelay must be positive.
func Backoff(base, maxDelay time.Duration, n int) time.Duration {
	ceiling := base
	for i := 1; i < n && ceiling < maxDelay; i++ {
		if ceiling > maxDelay/2 { // doubled, it would pass maxDelay (or overflow)
			ceiling = maxDelay
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, maxDelay)
	return rand.N(ceiling)
}

// InFlightWait is how long a client waits before asking again about a key
// whose first call still runs: told (the server's delay, when ok) capped
// at ceiling (ceiling when the server said none), at least floor so that a
// delay of 0 does not make it spin, less up to a fifth at random so that
// the duplicates of one key spread out: the result is in [d - d/5, d] for
// that d. floor must be positive.
func InFlightWait(told time.Duration, ok bool, ceiling, floor time.Duration) time.Duration {
	d := told
	if !ok || d > ceiling {
		d = ceiling
	}
	d = max(d, floor)
	return d - rand.N(d/5+1)
}

// NewUUIDv7 is the clients' default key maker: a UUIDv7 (uuid.NewV7),
// which sorts by time and carries 62 random bits (google/uuid fills the
// 12 bits after the milliseconds with finer time, not randomness), in its
// 36-character text form.
func NewUUIDv7() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}
