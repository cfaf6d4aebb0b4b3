package httpcore

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/adapter"
)

// The in-flight Retry-After is the route's typical run time here, at least
// a second, at most what is left of the lease.
func TestInFlightRetryAfter(t *testing.T) {
	m := &Engine{}
	if d := m.inFlightRetryAfter("POST /a", 25*time.Second); d != time.Second {
		t.Fatalf("unknown route: %s, want 1s", d)
	}
	m.runs.Observe("POST /a", 100*time.Millisecond)
	if d := m.inFlightRetryAfter("POST /a", 25*time.Second); d != time.Second {
		t.Fatalf("100 ms route: %s, want the 1s floor", d)
	}
	m.runs.Observe("POST /slow", 4*time.Second)
	if d := m.inFlightRetryAfter("POST /slow", 25*time.Second); d != 4*time.Second {
		t.Fatalf("4 s route: %s", d)
	}
	if d := m.inFlightRetryAfter("POST /slow", 2500*time.Millisecond); d != 2500*time.Millisecond {
		t.Fatalf("4 s route, 2.5 s of lease left: %s", d)
	}
	if got := retryAfter(m.inFlightRetryAfter("POST /slow", 2500*time.Millisecond)); got != "3" {
		t.Fatalf("Retry-After %q", got)
	}
	// The average follows the newest runs.
	for range 20 {
		m.runs.Observe("POST /slow", 2*time.Second)
	}
	if d := m.inFlightRetryAfter("POST /slow", time.Minute); d < 2*time.Second || d > 2100*time.Millisecond {
		t.Fatalf("after runs of 2 s: %s", d)
	}
	// The table is bounded.
	for i := range 2 * adapter.MaxRunTimes {
		m.runs.Observe("route-"+strconv.Itoa(i), time.Second)
	}
	if n := m.runs.Len(); n > adapter.MaxRunTimes {
		t.Fatalf("%d route scopes kept", n)
	}
}
