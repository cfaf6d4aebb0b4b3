package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// checkReadyz fetches /readyz from the admin handler.
func checkReadyz(t *testing.T, gw *Gateway) (int, readiness) {
	t.Helper()
	rec := httptest.NewRecorder()
	gw.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var r readiness
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("/readyz body %q: %v", rec.Body.String(), err)
	}
	return rec.Code, r
}

func newPrivateGateway(t *testing.T, addr string, extra string) (*Gateway, error) {
	t.Helper()
	cfg, err := Parse("gw.yaml", []byte(`upstream: http://127.0.0.1:1
redis: {addrs: ["`+addr+`"]`+extra+`}
routes: [{pattern: POST /o, caller: {single: true}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(cfg, Options{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return gw, gw.Prepare(context.Background())
}

// /healthz answers while the process runs; /readyz only while Redis
// answers, holds the scripts and cannot evict records.
func TestReadiness(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "allkeys-lru")

	// An evicting server stops the gateway at start...
	_, err := newPrivateGateway(t, srv.Addr(), "")
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("start on an allkeys-lru server: %v; want an error naming the policy", err)
	}
	// ...unless accepted; /readyz says so.
	gw, err := newPrivateGateway(t, srv.Addr(), ", accept_eviction: true")
	if err != nil {
		t.Fatal(err)
	}
	if code, r := checkReadyz(t, gw); code != http.StatusOK || !strings.Contains(r.Checks["eviction"], "accepted") {
		t.Fatalf("accepted eviction: %d %+v", code, r)
	}

	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	gw, err = newPrivateGateway(t, srv.Addr(), "")
	if err != nil {
		t.Fatal(err)
	}
	code, r := checkReadyz(t, gw)
	if code != http.StatusOK || !r.Ready || r.Checks["redis"] != "ok" || r.Checks["scripts"] != "ok" || r.Checks["eviction"] != "ok (noeviction)" {
		t.Fatalf("ready: %d %+v", code, r)
	}
	rec := httptest.NewRecorder()
	gw.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/healthz %d", rec.Code)
	}

	// The policy changed at run time: not ready.
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if code, r := checkReadyz(t, gw); code != http.StatusServiceUnavailable || !strings.Contains(r.Checks["eviction"], "volatile-lru") {
		t.Fatalf("volatile-lru: %d %+v; want 503 naming the policy", code, r)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}

	// Scripts lost (a restart, SCRIPT FLUSH): loaded again.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if code, r := checkReadyz(t, gw); code != http.StatusOK || !strings.Contains(r.Checks["scripts"], "loaded again") {
		t.Fatalf("after SCRIPT FLUSH: %d %+v", code, r)
	}
	if code, r := checkReadyz(t, gw); code != http.StatusOK || r.Checks["scripts"] != "ok" {
		t.Fatalf("after the reload: %d %+v", code, r)
	}

	// Shutting down: not ready, whatever Redis says.
	gw.stopping.Store(true)
	if code, r := checkReadyz(t, gw); code != http.StatusServiceUnavailable || r.Checks["serving"] != "shutting down" {
		t.Fatalf("stopping: %d %+v", code, r)
	}
	gw.stopping.Store(false)

	// Redis gone.
	srv.Kill()
	if code, r := checkReadyz(t, gw); code != http.StatusServiceUnavailable || !strings.HasPrefix(r.Checks["redis"], "unreachable") {
		t.Fatalf("Redis killed: %d %+v", code, r)
	}
	rec = httptest.NewRecorder()
	gw.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if b, _ := io.ReadAll(rec.Body); rec.Code != http.StatusOK || string(b) != "ok\n" {
		t.Fatalf("/healthz with Redis down: %d %q; liveness does not depend on Redis", rec.Code, b)
	}
}

// TestReadyzOnCluster: /readyz on a Cluster asks every master at once
// whether it has the scripts. The answers were folded into one bool
// without a lock (a data race: a master's "missing" could be lost, and
// its scripts were then not loaded again).
func TestReadyzOnCluster(t *testing.T) {
	addrs := strings.Join(testenv.List(t, testenv.EnvCluster), `", "`)
	gw, err := newPrivateGateway(t, addrs, `, mode: cluster, prefix: "`+testenv.Prefix(t)+`"`)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if code, r := checkReadyz(t, gw); code != http.StatusOK || r.Checks["scripts"] != "ok" {
			t.Fatalf("readyz on a Cluster: %d %+v", code, r)
		}
	}
}
