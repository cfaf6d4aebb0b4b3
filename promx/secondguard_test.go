package promx_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemguard/idemguard/promx"
)

// TestTwoGuardsOnOneRegistry: New's doc says how two guards' metrics share
// a registry: another Namespace, or every one of them under
// WrapRegistererWith with the same label names. Its advice was to wrap the
// second guard's alone, which the registry refuses (a name registered once
// with a label and once without).
func TestTwoGuardsOnOneRegistry(t *testing.T) {
	t.Run("wrapped alike", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		for _, name := range []string{"payments", "orders"} {
			if _, err := promx.New(prometheus.WrapRegistererWith(prometheus.Labels{"guard": name}, reg), promx.Options{}); err != nil {
				t.Fatalf("guard %s: %v", name, err)
			}
		}
	})
	t.Run("namespaces", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		for _, ns := range []string{"payments", "orders"} {
			if _, err := promx.New(reg, promx.Options{Namespace: ns}); err != nil {
				t.Fatalf("namespace %s: %v", ns, err)
			}
		}
	})
	t.Run("second alone wrapped", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if _, err := promx.New(reg, promx.Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := promx.New(prometheus.WrapRegistererWith(prometheus.Labels{"guard": "second"}, reg), promx.Options{}); err == nil {
			t.Fatal("the registry took a second guard's metrics wrapped with a label the first's lack; the doc says it refuses them")
		}
	})
}
