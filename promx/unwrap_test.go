package promx_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/breakerenv"
	"github.com/idemguard/idemguard/promx"
)

// TestTimedFallbackRetryAfterUntilProbe: Metrics.Store over a fail-closed
// fallback.Store whose breaker is open keeps httpx's 503 Retry-After at
// the breaker's probe time, as it is for the fallback.Store itself and
// through otelx's traced store; and the timed store names the store it
// wraps, so two timed views of one store are one store for nested guards
// (internal/adapter's SameStore). (It named nothing: the breaker was
// invisible and clients were told 1 s while it refused everything for
// 5 s.)
func TestTimedFallbackRetryAfterUntilProbe(t *testing.T) {
	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	breakerenv.RetryAfterUntilProbe(t, func(fb *fallback.Store) guard.Store {
		s := m.Store(fb)
		if u, ok := s.(interface{ Unwrap() guard.Store }); !ok || u.Unwrap() != guard.Store(fb) {
			t.Errorf("promx's timed store does not unwrap to the store it times")
		}
		return s
	})
}
