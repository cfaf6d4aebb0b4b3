package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// serving runs gw.Serve on a loopback listener until stop is called; stop
// returns Serve's error.
func serving(t *testing.T, gw *Gateway) (url string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ctx, ln, nil) }()
	var once sync.Once
	var serr error
	stop = func() error {
		once.Do(func() {
			cancel()
			serr = <-done
		})
		return serr
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), stop
}

// blockingUpstream answers a POST only when release is closed, and tells
// arrived about each request it got.
func blockingUpstream(t *testing.T) (u *upstream, arrived chan string, release func()) {
	u = newUpstream(t)
	arrived = make(chan string, 16)
	gate := make(chan struct{})
	u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
		arrived <- order
		select {
		case <-gate:
		case <-r.Context().Done():
			return true
		}
		return false
	})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return u, arrived, release
}

// A graceful shutdown finishes the requests in flight: a request forwarded
// before it gets the upstream's answer, stored for its key; new
// connections are refused meanwhile.
func TestShutdownFinishesInFlight(t *testing.T) {
	u, arrived, release := blockingUpstream(t)
	cfg, _ := config(t, basicConfig, u.URL)
	e := startConfigured(t, cfg)
	url, stop := serving(t, e.gw)
	got := make(chan reply, 1)
	go func() { got <- post(t, url+"/orders", "k-inflight", `{"order":"f1"}`, "X-Account-Id", "acme") }()
	<-arrived

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The listener closes at once; poll for it (nothing to wait on).
	testenv.WaitFor(t, 10*time.Second, "the listener to close while shutting down", func() bool {
		c, err := net.DialTimeout("tcp", url[len("http://"):], time.Second)
		if err != nil {
			return true
		}
		_ = c.Close()
		return false
	})
	if !e.gw.stopping.Load() {
		t.Fatal("not marked as stopping (readiness)")
	}
	release()
	r := <-got
	if r.status != http.StatusCreated {
		t.Fatalf("the in-flight request: %d %q; want the upstream's 201", r.status, r.body)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(context.Background(), guard.Key{Scope: `"acme" POST /orders`, ID: "k-inflight"})
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("the key after shutdown: %+v, %v; want completed", rec, err)
	}
}

// Past the shutdown timeout what still runs is ended: a request that was
// forwarded stores the outcome-unknown answer (never released for a
// re-run); one that was not yet sent releases its key and gets 503.
func TestShutdownTimeout(t *testing.T) {
	u, arrived, _ := blockingUpstream(t)
	// Dials to port 1 hang until the test ends: a request claimed but not
	// yet sent when the gateway must stop.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	dialed := make(chan struct{}, 1)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, port, _ := net.SplitHostPort(addr); port == "1" {
			dialed <- struct{}{}
			<-hang
			return nil, errors.New("test: dial abandoned")
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	cfg, _ := config(t, `
upstream: {upstream}
shutdown_timeout: 200ms
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
  - pattern: POST /stuck
    upstream: http://127.0.0.1:1
`, u.URL)
	e := startConfigured(t, cfg, func(o *Options) { o.dial = dial })
	url, stop := serving(t, e.gw)

	forwarded, stuck := make(chan reply, 1), make(chan reply, 1)
	go func() { forwarded <- post(t, url+"/orders", "k-late", `{"order":"t1"}`, "X-Account-Id", "acme") }()
	go func() { stuck <- post(t, url+"/stuck", "k-stuck", `{"order":"t2"}`, "X-Account-Id", "acme") }()
	<-arrived
	<-dialed
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	r := <-forwarded
	if r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown || !strings.Contains(r.body, "stopped before") {
		t.Fatalf("forwarded, unanswered at the timeout: %d %q; want 500 outcome-unknown", r.status, r.body)
	}
	rec, err := e.store.Get(context.Background(), guard.Key{Scope: `"acme" POST /orders`, ID: "k-late"})
	if err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("its key: %+v, %v; want completed (the outcome-unknown answer)", rec, err)
	}
	r = <-stuck
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("not yet sent at the timeout: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	if rec, err := e.store.Get(context.Background(), guard.Key{Scope: `"acme" POST /stuck`, ID: "k-stuck"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("its key: %+v, %v; want released", rec, err)
	}
}
