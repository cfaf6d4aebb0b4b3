package httpx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/conformance"
)

// netHTTPServer serves h behind httpx.Guard on a ServeMux, for the shared
// conformance suite.
func netHTTPServer(t testing.TB, g *guard.Guard, opts httpx.Options, h conformance.Handler) string {
	guarded := httpx.Guard(g, opts)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		lease, _, claimed := httpx.ClaimFrom(r.Context())
		resp := h(r.Context(), conformance.Req{Method: r.Method, Path: r.URL.Path, Body: body, Header: r.Header,
			Claimed: claimed, Lease: lease})
		for k, vs := range resp.Header {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		if resp.Switch != nil {
			switchProtocols(w, resp)
			return
		}
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	})
	mux := http.NewServeMux()
	mux.Handle("/", guarded(handler))
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", strconv.FormatInt(n.Add(1), 10)) // outer middleware
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// switchProtocols answers resp's 101 (if it has one) and runs its session
// on the connection, as coder/websocket (WriteHeader, then Hijack) or
// gorilla/websocket (the 101 written on the connection) does.
func switchProtocols(w http.ResponseWriter, resp conformance.Resp) {
	if resp.Status != 0 {
		w.WriteHeader(resp.Status)
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	resp.Switch(brw)
}

// TestConformance runs the suite every binding of the shared core runs
// (ginx, echox, fiberx run it too).
func TestConformance(t *testing.T) { conformance.Run(t, netHTTPServer) }

// TestConformanceUpgrade runs the protocol-switch cases (a WebSocket):
// nothing stored, the key released when the session ends.
func TestConformanceUpgrade(t *testing.T) {
	conformance.RunUpgrade(t, netHTTPServer, conformance.UpgradeOptions{})
}

// TestConformanceStorm: 1,000 keys × 8 copies over two servers on one
// Redis, each key's effect exactly once.
func TestConformanceStorm(t *testing.T) {
	f := conformance.Storm(t, netHTTPServer, 1000, 8)
	t.Log(f)
}
