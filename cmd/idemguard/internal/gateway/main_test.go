package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.ClientGoroutines)
}

// logs collects a gateway's log records for a test.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// upstream is a Go service standing in for one in another language: it
// counts the requests (the side effects) it gets, per order.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	orders  map[string]int
	keys    map[string][]string // the Idempotency-Key each order arrived with
	headers []http.Header
	handle  func(w http.ResponseWriter, r *http.Request, order string) bool // true: answered
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{orders: map[string]int{}, keys: map[string][]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var in struct {
			Order string `json:"order"`
		}
		_ = json.Unmarshal(body, &in)
		u.mu.Lock()
		if r.Method == http.MethodPost || r.Method == http.MethodPatch {
			u.orders[in.Order]++
			u.keys[in.Order] = append(u.keys[in.Order], r.Header.Get("Idempotency-Key"))
		}
		u.headers = append(u.headers, r.Header.Clone())
		n := u.orders[in.Order]
		handle := u.handle
		u.mu.Unlock()
		if handle != nil && handle(w, r, in.Order) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+in.Order)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"order": in.Order, "run": n, "method": r.Method, "path": r.URL.Path})
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count(order string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.orders[order]
}

func (u *upstream) setHandle(h func(w http.ResponseWriter, r *http.Request, order string) bool) {
	u.mu.Lock()
	u.handle = h
	u.mu.Unlock()
}

// gwEnv is a gateway under test, served by httptest, on the shared Redis
// under a prefix of its own.
type gwEnv struct {
	gw     *Gateway
	srv    *httptest.Server
	logs   *logs
	prefix string
	store  *guard.RedisStore
}

// config fills a configuration template: {redis}, {prefix}, {upstream}.
func config(t *testing.T, tmpl, upstreamURL string) (*Config, string) {
	t.Helper()
	return configAt(t, "test.yaml", tmpl, upstreamURL)
}

// configAt is config for a file at path (relative key files start in its
// directory).
func configAt(t *testing.T, path, tmpl, upstreamURL string) (*Config, string) {
	t.Helper()
	prefix := testenv.Prefix(t)
	text := strings.NewReplacer("{redis}", testenv.RedisAddr(t), "{prefix}", prefix, "{upstream}", upstreamURL).Replace(tmpl)
	cfg, err := Parse(path, []byte(text))
	if err != nil {
		t.Fatalf("config:\n%v\n%s", err, text)
	}
	return cfg, prefix
}

func startGateway(t *testing.T, tmpl, upstreamURL string, opts ...func(*Options)) *gwEnv {
	t.Helper()
	cfg, _ := config(t, tmpl, upstreamURL)
	return startConfigured(t, cfg, opts...)
}

func startConfigured(t *testing.T, cfg *Config, opts ...func(*Options)) *gwEnv {
	t.Helper()
	l := &logs{}
	o := Options{Logger: slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range opts {
		f(&o)
	}
	gw, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		srv.Close()
		_ = gw.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", l.String())
		}
	})
	return &gwEnv{gw: gw, srv: srv, logs: l, prefix: cfg.Redis.Prefix, store: gw.rstore}
}

// reply is one response, read whole.
type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Type
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// post sends one POST (no retries) with the key and header fields given
// as name, value pairs.
func post(t *testing.T, url, key, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

const basicConfig = `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
`
