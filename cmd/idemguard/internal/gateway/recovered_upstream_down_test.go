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

// TestRecoveredForwardedKeyUpstreamDown: a key whose earlier attempt
// recorded its forward step (the gateway that sent it died) is recovered
// while the upstream cannot be reached: it answers outcome-unknown, as a
// recovered key does (the package doc: "never forwarding blindly
// again"), or, on a route with unknown_outcome: resend, the resend
// problem. It answered not-forwarded, "nothing was sent; retry with the
// same key", of a request that may have been delivered: the gate looks
// for the earlier forward at the first write, and a refused dial writes
// nothing.
func TestRecoveredForwardedKeyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	_ = ln.Close() // nothing listens there: every dial is refused

	for _, tc := range []struct {
		name, config, problem string
		status                int
	}{
		{"answer", basicConfig, ProblemOutcomeUnknown, http.StatusInternalServerError},
		{"resend", basicConfig + "    unknown_outcome: resend\n", ProblemResend, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startGateway(t, tc.config, dead)
			abandon(t, e, guard.Key{Scope: `"acme" POST /orders`, ID: "k-rec-down"}, `{"order":"rd1"}`, true)
			r := post(t, e.srv.URL+"/orders", "k-rec-down", `{"order":"rd1"}`, "X-Account-Id", "acme")
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

// resetOnWrite is an upstream connection whose writes fail with nothing
// written (a reset, a write deadline passed): the gate looked (the write
// was tried), but no byte of the request left the gateway.
type resetOnWrite struct{ net.Conn }

func (c resetOnWrite) Write([]byte) (int, error) { return 0, syscall.ECONNRESET }

// TestRecoveredForwardedKeyWriteSentNothing: the same recovered key when a
// write is tried and sends nothing (the connection reset; or closed by the
// upstream before the first byte, idleclosed.go). On a resend route it
// still answered not-forwarded: the gate found the earlier forward at the
// write, but only a route that does not resend made that its refusal,
// which is what failed read (found by the session's regression review).
func TestRecoveredForwardedKeyWriteSentNothing(t *testing.T) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return resetOnWrite{c}, nil
	}
	for _, tc := range []struct {
		name, config, problem string
		status                int
	}{
		{"answer", basicConfig, ProblemOutcomeUnknown, http.StatusInternalServerError},
		{"resend", basicConfig + "    unknown_outcome: resend\n", ProblemResend, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream(t)
			e := startGateway(t, tc.config, u.URL, func(o *Options) { o.dial = dial })
			abandon(t, e, guard.Key{Scope: `"acme" POST /orders`, ID: "k-rec-reset"}, `{"order":"rr1"}`, true)
			r := post(t, e.srv.URL+"/orders", "k-rec-reset", `{"order":"rr1"}`, "X-Account-Id", "acme")
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
