package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestIPv6HostRouteAccepted: a route whose host is an IPv6 literal
// ("::1", as ServeMux sees the Host "[::1]:8443" once it strips the port)
// matches, and guards, requests to that host (a first version of the
// refusal of hosts with a port refused it; found by review).
func TestIPv6HostRouteAccepted(t *testing.T) {
	ua, na := looseUpstream(t)
	up, np := looseUpstream(t)
	tmpl := basicConfig[:strings.Index(basicConfig, "routes:")] + `routes:
  - pattern: POST ::1/orders
    upstream: ` + ua.URL + `
`
	e := startGateway(t, tmpl, up.URL)
	for range 3 {
		if s := send(t, e.srv.URL+"/orders", "POST", "[::1]:8443", "k-v6"); s != http.StatusCreated {
			t.Errorf("POST [::1]:8443/orders: %d", s)
		}
	}
	if a, p := na.Load(), np.Load(); a != 1 || p != 0 {
		t.Errorf("orders run: the ::1 route's upstream %d, the pass-through's %d; want 1, 0", a, p)
	}
}
