package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A completed key is answered by the gateway alone: however often and
// however concurrently it is sent again, the upstream sees one request,
// and the answer comes with the upstream stopped.
func TestReplayNeverReachesUpstream(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	url := e.srv.URL + "/orders"
	first := post(t, url, "k-replay", `{"order":"o1"}`, "X-Account-Id", "acme")
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d %q %v", first.status, first.body, first.header)
	}
	var wg sync.WaitGroup
	replies := make(chan reply, 40)
	for i := range 40 {
		if i < 20 {
			replies <- post(t, url, "k-replay", `{"order":"o1"}`, "X-Account-Id", "acme")
			continue
		}
		wg.Go(func() { replies <- post(t, url, "k-replay", `{"order":"o1"}`, "X-Account-Id", "acme") })
	}
	wg.Wait()
	close(replies)
	for r := range replies {
		if r.status != http.StatusCreated || !r.replayed() || r.body != first.body || r.header.Get("Location") != "/orders/o1" {
			t.Fatalf("repeat: %d replayed=%v %q, want the first's 201 replayed: %q", r.status, r.replayed(), r.body, first.body)
		}
	}
	u.mu.Lock()
	seen := len(u.headers)
	u.mu.Unlock()
	if seen != 1 {
		t.Fatalf("the upstream got %d requests, want 1: replays reached it", seen)
	}
	if n := testutil.ToFloat64(e.gw.metrics.requests.WithLabelValues("POST /orders", resultForwarded)); n != 1 {
		t.Errorf("forwarded counter %v, want 1", n)
	}
	// With the upstream gone, the key is still answered: by the gateway
	// alone.
	u.Close()
	if r := post(t, url, "k-replay", `{"order":"o1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated || !r.replayed() || r.body != first.body {
		t.Fatalf("replay with the upstream down: %d replayed=%v %q, want the first's 201 replayed", r.status, r.replayed(), r.body)
	}
}

// Stripe's rule: the upstream's answer is the result once it ran, 500s
// included; a retry gets the stored 500 and the upstream is not asked again.
func TestUpstream5xxIsStored(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, order string) bool {
		http.Error(w, "database on fire", http.StatusInternalServerError)
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	for i := range 3 {
		r := post(t, e.srv.URL+"/orders", "k-500", `{"order":"o500"}`, "X-Account-Id", "acme")
		if r.status != http.StatusInternalServerError || r.replayed() != (i > 0) || !strings.Contains(r.body, "database on fire") {
			t.Fatalf("try %d: %d replayed=%v %q", i, r.status, r.replayed(), r.body)
		}
	}
	if n := u.count("o500"); n != 1 {
		t.Fatalf("the upstream ran the request %d times, want 1", n)
	}
}

// A request that never reached the upstream (the dial was refused) frees
// its key: the retry runs once the upstream is back.
func TestNotDeliveredReleasesTheKey(t *testing.T) {
	port := testenv.FreePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	e := startGateway(t, basicConfig, "http://"+addr)
	r := post(t, e.srv.URL+"/orders", "k-down", `{"order":"down"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded || r.header.Get("Retry-After") == "" {
		t.Fatalf("upstream down: %d %q %v; want 503 not-forwarded with Retry-After", r.status, r.body, r.header)
	}
	key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-down"}
	if rec, err := e.store.Get(context.Background(), key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the key's record after a refused dial: %+v, %v; want none (released)", rec, err)
	}

	u := newUpstreamOn(t, addr)
	r = post(t, e.srv.URL+"/orders", "k-down", `{"order":"down"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry with the upstream back: %d %q", r.status, r.body)
	}
	if n := u.count("down"); n != 1 {
		t.Fatalf("upstream ran it %d times, want 1", n)
	}
}

// newUpstreamOn is newUpstream listening on addr.
func newUpstreamOn(t *testing.T, addr string) *upstream {
	t.Helper()
	u := newUpstream(t)
	u.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(u.Config.Handler)
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	u.Server = s
	return u
}

// Once the request may have reached the upstream, a failure never frees
// the key: the outcome-unknown answer is stored and replayed, and the
// upstream is not asked again.
func TestFailureAfterDeliveryIsStoredUnknown(t *testing.T) {
	cases := []struct {
		name   string
		config string
		handle func(w http.ResponseWriter, r *http.Request) bool
		detail string
	}{
		{"connection closed without an answer", basicConfig, func(w http.ResponseWriter, r *http.Request) bool {
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
			return true
		}, "failed before its whole answer came"},
		{"body cut within the stored limit", basicConfig, func(w http.ResponseWriter, r *http.Request) bool {
			conn, brw, _ := http.NewResponseController(w).Hijack()
			_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{\"order\":")
			_ = brw.Flush()
			_ = conn.Close()
			return true
		}, "failed before its whole answer came"},
		{"timeout", basicConfig + "    timeout: 300ms\n", func(w http.ResponseWriter, r *http.Request) bool {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return true
		}, "did not answer within 300ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := newUpstream(t)
			u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool { return c.handle(w, r) })
			e := startGateway(t, c.config, u.URL)
			first := post(t, e.srv.URL+"/orders", "k-unknown", `{"order":"u1"}`, "X-Account-Id", "acme")
			if first.status != http.StatusInternalServerError || first.problemType() != ProblemOutcomeUnknown ||
				first.replayed() || !strings.Contains(first.body, c.detail) {
				t.Fatalf("first: %d %q; want 500 %s saying %q", first.status, first.body, ProblemOutcomeUnknown, c.detail)
			}
			var p problem
			_ = json.Unmarshal([]byte(first.body), &p)
			if p.ForwardedAt == "" || p.UpstreamKey == "" || p.Key != "k-unknown" {
				t.Errorf("problem %+v: want forwarded_at, upstream_idempotency_key and the key", p)
			}
			u.setHandle(nil) // the upstream would answer now: it must not be asked
			again := post(t, e.srv.URL+"/orders", "k-unknown", `{"order":"u1"}`, "X-Account-Id", "acme")
			if again.status != http.StatusInternalServerError || !again.replayed() || again.body != first.body {
				t.Fatalf("retry: %d replayed=%v %q; want the stored outcome-unknown answer", again.status, again.replayed(), again.body)
			}
			if n := u.count("u1"); n != 1 {
				t.Fatalf("upstream got the request %d times, want 1", n)
			}
		})
	}
}

// abandon claims key as a gateway would, records the forward step if
// forwarded, and leaves the claim to expire: a gateway killed after (or
// before) it forwarded the request.
func abandon(t *testing.T, e *gwEnv, key guard.Key, body string, forwarded bool) {
	t.Helper()
	g := guard.New(e.store, guard.Options{Lease: time.Second})
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	out, err := g.Claim(context.Background(), key, httpx.DefaultFingerprint(req, []byte(body)))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %+v, %v", out, err)
	}
	if forwarded {
		if _, err := guard.Step(context.Background(), out.Lease, forwardStep, func(context.Context) (int64, error) {
			return time.Now().UnixMilli(), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the abandoned lease to run out on the server's clock", func() bool {
		rec, err := e.store.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return rec.LeaseLeft == 0
	})
}

// The recovery rule: a key whose previous holder recorded the forward step
// and died is never forwarded again; it gets the outcome-unknown answer,
// stored. A key whose holder died before forwarding is forwarded.
func TestRecoveredKey(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	url := e.srv.URL + "/orders"

	abandon(t, e, guard.Key{Scope: `"acme" POST /orders`, ID: "k-forwarded"}, `{"order":"r1"}`, true)
	r := post(t, url, "k-forwarded", `{"order":"r1"}`, "X-Account-Id", "acme")
	if r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown || !strings.Contains(r.body, "earlier attempt") {
		t.Fatalf("recovered after forwarding: %d %q; want 500 outcome-unknown", r.status, r.body)
	}
	again := post(t, url, "k-forwarded", `{"order":"r1"}`, "X-Account-Id", "acme")
	if again.status != http.StatusInternalServerError || !again.replayed() || again.body != r.body {
		t.Fatalf("retry: %d %q", again.status, again.body)
	}
	if n := u.count("r1"); n != 0 {
		t.Fatalf("the upstream got a request whose earlier attempt was forwarded: %d times", n)
	}

	abandon(t, e, guard.Key{Scope: `"acme" POST /orders`, ID: "k-not-forwarded"}, `{"order":"r2"}`, false)
	r = post(t, url, "k-not-forwarded", `{"order":"r2"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || u.count("r2") != 1 {
		t.Fatalf("recovered before forwarding: %d %q, upstream %d; want it forwarded once", r.status, r.body, u.count("r2"))
	}
	if n := testutil.ToFloat64(e.gw.metrics.requests.WithLabelValues("POST /orders", resultEarlierForward)); n != 1 {
		t.Errorf("earlier_forward counter %v, want 1", n)
	}
}

// unknown_outcome: resend: the key is released after a failed exchange
// and the retry sends the request again with the same upstream key, which
// an upstream that deduplicates uses.
func TestResendMode(t *testing.T) {
	u := newUpstream(t)
	var mu sync.Mutex
	fails := 1
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
			return true
		}
		return false
	})
	e := startGateway(t, basicConfig+"    unknown_outcome: resend\n", u.URL)
	url := e.srv.URL + "/orders"
	r := post(t, url, "k-resend", `{"order":"s1"}`, "X-Account-Id", "acme")
	if r.status != http.StatusBadGateway || r.problemType() != ProblemResend || r.header.Get("Retry-After") == "" {
		t.Fatalf("first: %d %q; want 502 %s with Retry-After", r.status, r.body, ProblemResend)
	}
	r = post(t, url, "k-resend", `{"order":"s1"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("retry: %d %q; want the resent request's 201", r.status, r.body)
	}
	u.mu.Lock()
	keys := u.keys["s1"]
	u.mu.Unlock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("the upstream got keys %q; want the same derived key twice", keys)
	}
	if r := post(t, url, "k-resend", `{"order":"s1"}`, "X-Account-Id", "acme"); !r.replayed() || r.status != http.StatusCreated {
		t.Fatalf("third: %d %q; want the replay", r.status, r.body)
	}
}

// A response larger than max_stored_response streams to the client whole;
// the key keeps a marker, and a replay says the response was not kept
// without running the request again.
func TestLargeResponseStreams(t *testing.T) {
	u := newUpstream(t)
	big := strings.Repeat("0123456789abcdef", 4096) // 64 KiB
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, big)
		return true
	})
	e := startGateway(t, basicConfig+"    max_stored_response: 4KiB\n", u.URL)
	r := post(t, e.srv.URL+"/orders", "k-big", `{"order":"b1"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.body != big {
		t.Fatalf("first: %d, %d bytes; want 201 and the %d bytes", r.status, len(r.body), len(big))
	}
	again := post(t, e.srv.URL+"/orders", "k-big", `{"order":"b1"}`, "X-Account-Id", "acme")
	if again.status != http.StatusCreated || !again.replayed() || again.problemType() != httpx.ProblemResponseNotKept {
		t.Fatalf("replay: %d %q", again.status, again.body)
	}
	if n := u.count("b1"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

// The client's own key never reaches the upstream, which may deduplicate
// on it across callers: with forward_key_header renamed only the derived
// key goes (under that name), and with none no key goes at all; on a
// route keyed by the header, by a body field or computed (which takes the
// client's Idempotency-Key when it sends one: it went through as it came,
// and an upstream deduplicating on it answered one caller with another's
// result).
func TestClientKeyNotForwarded(t *testing.T) {
	routes := map[string]string{"header": "", "body": "    key: {body: /order}\n", "computed": "    key: {computed: true}\n"}
	for route, key := range routes {
		for name, forward := range map[string]string{"renamed": "X-Upstream-Key", "none": `""`} {
			t.Run(route+"/"+name, func(t *testing.T) {
				u := newUpstream(t)
				e := startGateway(t, "forward_key_header: "+forward+basicConfig+key, u.URL)
				if r := post(t, e.srv.URL+"/orders", "k-raw", `{"order":"raw"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
					t.Fatalf("post: %d %q", r.status, r.body)
				}
				u.mu.Lock()
				h := u.headers[len(u.headers)-1]
				u.mu.Unlock()
				if v := h.Values("Idempotency-Key"); len(v) != 0 {
					t.Errorf("the upstream got the client's key %q", v)
				}
				if route != "header" {
					return
				}
				lease := guard.Lease{Key: guard.Key{Scope: `"acme" POST /orders`, ID: "k-raw"}}
				if got, want := h.Get("X-Upstream-Key"), lease.KeyFor(forwardStep); name == "renamed" && got != want {
					t.Errorf("X-Upstream-Key %q, want the derived key %q", got, want)
				}
			})
		}
	}
}

// What the upstream receives: X-Forwarded-*, the derived key (the same
// across attempts, another for another caller), and unguarded traffic as
// it was sent.
func TestWhatTheUpstreamSees(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	post(t, e.srv.URL+"/orders", "k-h", `{"order":"h1"}`, "X-Account-Id", "acme")
	post(t, e.srv.URL+"/orders", "k-h", `{"order":"h2"}`, "X-Account-Id", "globex")
	u.mu.Lock()
	h1 := u.headers[0]
	k1, k2 := u.keys["h1"][0], u.keys["h2"][0]
	u.mu.Unlock()
	if h1.Get("X-Forwarded-For") != "127.0.0.1" || h1.Get("X-Forwarded-Proto") != "http" ||
		h1.Get("X-Forwarded-Host") != strings.TrimPrefix(e.srv.URL, "http://") {
		t.Errorf("X-Forwarded-*: %v", h1)
	}
	if k1 == "k-h" || len(k1) != 36 || k1 == k2 {
		t.Errorf("upstream keys %q, %q: want derived keys (36 characters), one per caller", k1, k2)
	}
	lease := guard.Lease{Key: guard.Key{Scope: `"acme" POST /orders`, ID: "k-h"}}
	if k1 != lease.KeyFor(forwardStep) {
		t.Errorf("upstream key %q, want Lease.KeyFor(%q) = %q", k1, forwardStep, lease.KeyFor(forwardStep))
	}

	// Unguarded: another path, a GET on the route, a POST elsewhere twice.
	resp, err := http.Get(e.srv.URL + "/orders?x=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(b), `"method":"GET"`) {
		t.Errorf("GET passed through: %d %s", resp.StatusCode, b)
	}
	for range 2 {
		if r := post(t, e.srv.URL+"/elsewhere", "k-x", `{"order":"x1"}`); r.status != http.StatusCreated || r.replayed() {
			t.Errorf("POST /elsewhere: %d %q", r.status, r.body)
		}
	}
	if n := u.count("x1"); n != 2 {
		t.Errorf("unguarded POST ran %d times, want 2 (not guarded)", n)
	}
}

// Duplicates that arrive while the first runs wait for its answer
// (route wait) and get it as a replay; the upstream runs once.
func TestWaitingDuplicates(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		time.Sleep(300 * time.Millisecond) // a slow upstream: the duplicates arrive meanwhile
		return false
	})
	e := startGateway(t, basicConfig+"    wait: 10s\n", u.URL)
	var wg sync.WaitGroup
	replies := make([]reply, 8)
	for i := range replies {
		wg.Go(func() { replies[i] = post(t, e.srv.URL+"/orders", "k-wait", `{"order":"w1"}`, "X-Account-Id", "acme") })
	}
	wg.Wait()
	fresh := 0
	for _, r := range replies {
		if r.status != http.StatusCreated || r.body != replies[0].body {
			t.Fatalf("copy: %d %q", r.status, r.body)
		}
		if !r.replayed() {
			fresh++
		}
	}
	if fresh != 1 || u.count("w1") != 1 {
		t.Fatalf("%d fresh answers, upstream ran %d times; want 1 and 1", fresh, u.count("w1"))
	}
}

// Keys from the JSON body, computed keys, and a soft route.
func TestKeySources(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
defaults:
  caller: {single: true}
routes:
  - pattern: POST /body
    key: {body: /order}
  - pattern: POST /computed
    key: {computed: true}
  - pattern: POST /soft
    requirement: soft
`, u.URL)
	for range 3 {
		if r := post(t, e.srv.URL+"/body", "", `{"order":"body1"}`); r.status != http.StatusCreated {
			t.Fatalf("body key: %d %q", r.status, r.body)
		}
		if r := post(t, e.srv.URL+"/computed", "", `{"order":"comp1"}`); r.status != http.StatusCreated {
			t.Fatalf("computed key: %d %q", r.status, r.body)
		}
		if r := post(t, e.srv.URL+"/soft", "", `{"order":"soft1"}`); r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("soft without a key: %d %q", r.status, r.body)
		}
	}
	if r := post(t, e.srv.URL+"/body", "", `{"other":1}`); r.status != http.StatusBadRequest || r.problemType() != httpx.ProblemMissingKey {
		t.Fatalf("body without the key: %d %q", r.status, r.body)
	}
	if a, b, c := u.count("body1"), u.count("comp1"), u.count("soft1"); a != 1 || b != 1 || c != 3 {
		t.Fatalf("upstream runs: body %d, computed %d, soft (unguarded) %d; want 1, 1, 3", a, b, c)
	}
}

// The caller header: keys of two callers never meet; a request naming no
// caller, or two, is refused before anything is stored or sent.
func TestHeaderCaller(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	url := e.srv.URL + "/orders"
	for _, acct := range []string{"acme", "globex", "acme"} {
		if r := post(t, url, "k-same", `{"order":"c1"}`, "X-Account-Id", acct); r.status != http.StatusCreated {
			t.Fatalf("%s: %d %q", acct, r.status, r.body)
		}
	}
	if n := u.count("c1"); n != 2 {
		t.Fatalf("upstream ran %d times for two callers' same key, want 2", n)
	}
	for _, h := range [][]string{nil, {"X-Account-Id", "acme", "X-Account-Id", "globex"}} {
		r := post(t, url, "k-none", `{"order":"c2"}`, h...)
		if r.status != http.StatusUnauthorized || r.problemType() != httpx.ProblemCallerUnknown {
			t.Fatalf("caller header %v: %d %q; want 401 caller-unknown", h, r.status, r.body)
		}
	}
	if n := u.count("c2"); n != 0 {
		t.Fatalf("a request without a caller reached the upstream %d times", n)
	}
}

func TestMetricsAndHealthOnTheProxyListener(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	post(t, e.srv.URL+"/orders", "k-m", `{"order":"m1"}`, "X-Account-Id", "acme")
	post(t, e.srv.URL+"/orders", "k-m", `{"order":"m1"}`, "X-Account-Id", "acme")
	resp, err := http.Get(e.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`idemguard_gateway_requests_total{result="forwarded",route="POST /orders"} 1`,
		`idemguard_outcomes_total{kind="replayed"} 1`,
		`idemguard_store_duration_seconds_count{op="claim",result="ok"} 2`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(e.logs.String(), "k-m") {
		t.Errorf("the log names the key:\n%s", e.logs.String())
	}
	if n := u.count("m1"); n != 1 {
		t.Errorf("upstream ran %d", n)
	}
	_ = fmt.Sprint()
}

// A response that streams (larger than max_stored_response) and then
// breaks: the client's connection is cut (it must not take a truncated
// body for a whole one), and the key keeps its marker: the upstream ran,
// so the retry is not sent again.
func TestLargeResponseBreaks(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		conn, brw, _ := http.NewResponseController(w).Hijack()
		_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
		_, _ = brw.WriteString(strings.Repeat("x", 8192))
		_ = brw.Flush()
		_ = conn.Close()
		return true
	})
	e := startGateway(t, basicConfig+"    max_stored_response: 4KiB\n", u.URL)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"lb1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-lb")
	req.Header.Set("X-Account-Id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("the broken response read whole (%d bytes, status %d); want the connection cut", len(b), resp.StatusCode)
	}
	u.setHandle(nil)
	again := post(t, e.srv.URL+"/orders", "k-lb", `{"order":"lb1"}`, "X-Account-Id", "acme")
	if again.status != http.StatusCreated || !again.replayed() || again.problemType() != httpx.ProblemResponseNotKept {
		t.Fatalf("retry: %d %q; want the marker replayed", again.status, again.body)
	}
	if n := u.count("lb1"); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// net/http sends a request again by itself on a new connection when a
// reused one fails after the request went out, if it deems the request
// replayable, which a POST with an Idempotency-Key header and no body is.
// The gateway refuses that resend: the upstream may have acted on the
// first. The key keeps the outcome-unknown answer and the upstream saw
// the request once.
func TestNoResendByNetHTTP(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		if r.Method != http.MethodPost {
			return false
		}
		conn, _, _ := http.NewResponseController(w).Hijack() // read it, acted, no answer
		_ = conn.Close()
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	// An unguarded GET first, so that the POST reuses its connection.
	resp, err := http.Get(e.srv.URL + "/warm")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	r := post(t, e.srv.URL+"/orders", "k-empty", "", "X-Account-Id", "acme")
	if r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown {
		t.Fatalf("%d %q; want 500 outcome-unknown", r.status, r.body)
	}
	if n := u.count(""); n != 1 {
		t.Fatalf("the upstream got the POST %d times, want 1", n)
	}
}

// A client that hangs up does not cut the request off: once claimed it is
// seen through to the upstream's answer, which is stored for the retry.
func TestClientHangUp(t *testing.T) {
	u := newUpstream(t)
	arrived := make(chan struct{}, 1)
	finished := make(chan struct{})
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		arrived <- struct{}{}
		time.Sleep(200 * time.Millisecond) // the client is gone by now
		return false
	})
	e := startGateway(t, basicConfig, u.URL)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"hang"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-hang")
	req.Header.Set("X-Account-Id", "acme")
	go func() {
		defer close(finished)
		<-arrived
		cancel()
	}()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("the request was not cut off by the client")
	}
	<-finished
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := post(t, e.srv.URL+"/orders", "k-hang", `{"order":"hang"}`, "X-Account-Id", "acme")
		if r.status == http.StatusConflict && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond) // the first request is still with the upstream
			continue
		}
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("retry after the client hung up: %d %q; want the upstream's 201, replayed", r.status, r.body)
		}
		break
	}
	if n := u.count("hang"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

// A route whose pattern matches every request ("/": guard every POST and
// PATCH of the service) is a configuration Load accepts; the gateway
// serves it, guarding its methods and passing the others through, rather
// than panicking on its own pass-through pattern.
func TestRouteForEveryPath(t *testing.T) {
	for _, pattern := range []string{"/", "/{path...}"} {
		t.Run(pattern, func(t *testing.T) {
			u := newUpstream(t)
			e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: "`+pattern+`"
`, u.URL)
			for range 2 {
				if r := post(t, e.srv.URL+"/any/orders", "k-all", `{"order":"all1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
					t.Fatalf("POST: %d %q", r.status, r.body)
				}
			}
			if n := u.count("all1"); n != 1 {
				t.Fatalf("upstream ran %d times for one key, want 1", n)
			}
			resp, err := http.Get(e.srv.URL + "/any/orders")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("GET: %d, want the upstream's 201 passed through", resp.StatusCode)
			}
		})
	}
}

// max_idle_conns: 0 keeps no idle upstream connection (each request
// dials its own), as the field says, rather than net/http's default of 2
// that a zero MaxIdleConnsPerHost means.
func TestMaxIdleConnsZeroKeepsNone(t *testing.T) {
	var conns atomic.Int32
	u := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	u.Start()
	defer u.Close()
	e := startGateway(t, "max_idle_conns: 0\n"+basicConfig, u.URL)
	for i := range 3 {
		if r := post(t, e.srv.URL+"/orders", fmt.Sprint("k-idle-", i), `{"order":"i1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
			t.Fatalf("request %d: %d %q", i, r.status, r.body)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("3 requests used %d upstream connections; want 3 (none kept idle)", n)
	}
}
