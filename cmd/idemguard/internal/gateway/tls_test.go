package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// TestTLSUpstreamHandshakeIsNotTheRequest: the gate sits under TLS, and
// the handshake is done before a connection is handed to a request
// (GotConn arms the gate), so handshake bytes record no forward step:
// an upstream whose certificate is refused got none of the request, and
// the key is released as not forwarded, its record gone (a forward step
// would have kept it, failed). The
// retry, once the upstream is trusted, is forwarded once over TLS and then
// replayed.
func TestTLSUpstreamHandshakeIsNotTheRequest(t *testing.T) {
	u := newUpstream(t)
	u.Close()
	u.Server = httptest.NewUnstartedServer(u.Config.Handler)
	u.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	u.StartTLS()
	t.Cleanup(u.Server.Close)
	cfg, _ := config(t, basicConfig+"    ttl: 1h\n", u.URL)

	untrusting := startConfigured(t, cfg) // the system roots: the test certificate is refused
	r := post(t, untrusting.srv.URL+"/orders", "k-tls", `{"order":"tls"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a refused handshake: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	rec, err := untrusting.store.Get(context.Background(), guard.Key{Scope: `"acme" POST /orders`, ID: "k-tls"})
	if !errors.Is(err, guard.ErrNotFound) && (err != nil || len(rec.Steps) != 0) {
		t.Fatalf("the key's record after a refused handshake: %+v, %v; want none, or one without steps (nothing of the request was written)", rec, err)
	}

	trusting := startConfigured(t, cfg)
	trusting.gw.transport.t.TLSClientConfig = &tls.Config{RootCAs: u.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	for i := range 2 {
		r := post(t, trusting.srv.URL+"/orders", "k-tls", `{"order":"tls"}`, "X-Account-Id", "acme")
		if r.status != http.StatusCreated || r.replayed() != (i > 0) {
			t.Fatalf("over TLS, try %d: %d replayed=%v %q; want the upstream's 201, then its replay", i, r.status, r.replayed(), r.body)
		}
	}
	if n := u.count("tls"); n != 1 {
		t.Fatalf("the upstream ran it %d times, want 1", n)
	}
}
