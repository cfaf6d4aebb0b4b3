package backstop_test

import (
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/breakerenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapOverFallbackRetryAfterUntilProbe: backstop.Wrap over a
// fail-closed fallback.Store (design.md's "other order") lets httpx see
// the fallback's open breaker: the 503's Retry-After is the breaker's
// probe time, not UnavailableRetry's 1 s. (Wrap named no store it wraps,
// no Unwrap() guard.Store, so adapter.UnavailableDelay stopped at it.)
func TestWrapOverFallbackRetryAfterUntilProbe(t *testing.T) {
	b := mustBackstop(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	breakerenv.RetryAfterUntilProbe(t, func(fb *fallback.Store) guard.Store { return backstop.Wrap(fb, b) })
}
