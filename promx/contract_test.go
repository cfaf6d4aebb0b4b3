package promx_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/promx"
)

// TestContract runs the store contract over Metrics.Store wrapping a
// RedisStore on the real server: the wrapper is a guard.Store (and a
// StepStore and BatchStore, as its store is) and must keep every rule.
func TestContract(t *testing.T) {
	c := testenv.Redis(t)
	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, storetest.Harness{
		New:     func(t *testing.T) guard.Store { return m.Store(guardenv.StoreOn(t, c, guard.RedisOptions{})) },
		Advance: storetest.Wait,
	})
}
