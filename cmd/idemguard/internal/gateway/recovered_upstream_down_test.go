package gateway

import (
	"context"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// resetOnWrite is an upstream connection whose writes fail with nothing
// written (a reset, a write deadline passed): the gate looked (the write
// was tried), but no byte of the request left the gateway.
type resetOnWrite struct{ net.Conn }

func (c resetOnWrite) Write([]byte) (int, error) { return 0, syscall.ECONNRESET }

// TestRecoveredForwardedKeySentNothing: a key whose earlier attempt
// recorded its forward step (the gateway that sent it died) is recovered,
// and this attempt sends nothing: the upstream cannot be reached, or its
// connection fails every write with nothing written (a reset; or closed
// by the upstream before the first byte, idleclosed.go). It answers
// outcome-unknown, as a recovered key does (the package doc: "never
// forwarding blindly again"), or, on a route with unknown_outcome:
// resend, the resend problem. It answered not-forwarded, "nothing was
// sent; retry with the same key", of a request that may have been
// delivered: the gate looks for the earlier forward at the first write,
// and a refused dial writes nothing; and when a write was tried, only a
// route that does not resend made the earlier forward its refusal, which
// is what failed read (the second found by the session's regression
// review).
func TestRecoveredForwardedKeySentNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	_ = ln.Close() // nothing listens there: every dial is refused
	resetting := func(o *Options) {
		o.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return resetOnWrite{c}, nil
		}
	}
	for _, how := range []struct {
		name string
		up   func(t *testing.T) (string, []func(*Options))
	}{
		{"dial refused", func(*testing.T) (string, []func(*Options)) { return dead, nil }},
		{"write reset", func(t *testing.T) (string, []func(*Options)) {
			return newUpstream(t).URL, []func(*Options){resetting}
		}},
	} {
		for _, tc := range []struct {
			name, config, problem string
			status                int
		}{
			{"answer", basicConfig, ProblemOutcomeUnknown, http.StatusInternalServerError},
			{"resend", basicConfig + "    unknown_outcome: resend\n", ProblemResend, http.StatusBadGateway},
		} {
			t.Run(how.name+"/"+tc.name, func(t *testing.T) {
				url, opts := how.up(t)
				e := startGateway(t, tc.config, url, opts...)
				abandon(t, e, guard.Key{Scope: `"acme" POST /orders`, ID: "k-rec"}, `{"order":"rd1"}`, true)
				r := post(t, e.srv.URL+"/orders", "k-rec", `{"order":"rd1"}`, "X-Account-Id", "acme")
				if r.problemType() == ProblemNotForwarded || strings.Contains(r.body, "nothing was sent") {
					t.Errorf("recovered key whose earlier attempt forwarded the request answered %d %s: "+
						"tells the client nothing reached the upstream", r.status, r.problemType())
				}
				if r.status != tc.status || r.problemType() != tc.problem {
					t.Errorf("got %d %q; want %d %s (the earlier attempt forwarded it)", r.status, r.problemType(), tc.status, tc.problem)
				}
			})
		}
	}
}
