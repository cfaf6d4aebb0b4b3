package httpx_test

import (
	"testing"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/breakerenv"
)

// unwrapping is a store wrapper that names what it wraps, as otelx's does.
type unwrapping struct{ guard.Store }

func (u unwrapping) Unwrap() guard.Store { return u.Store }

// TestUnavailableRetryAfterUntilProbe: under a fail-closed fallback.Store
// whose breaker Redis's outage opened, a 503's Retry-After says when the
// breaker lets its first probe through (open timeout 5 s), not
// UnavailableRetryAfter's 1 s: a client that followed 1 s met the same
// open breaker four more times. Also through a wrapper that unwraps to the
// fallback store (otelx's traced store).
func TestUnavailableRetryAfterUntilProbe(t *testing.T) {
	t.Run("wrapped=false", func(t *testing.T) {
		breakerenv.RetryAfterUntilProbe(t, func(fb *fallback.Store) guard.Store { return fb })
	})
	t.Run("wrapped=true", func(t *testing.T) {
		breakerenv.RetryAfterUntilProbe(t, func(fb *fallback.Store) guard.Store { return unwrapping{fb} })
	})
}
