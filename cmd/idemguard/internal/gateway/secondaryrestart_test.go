package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryKeysSurviveRestart: with fallback policy secondary, a key a
// gateway ran through PostgreSQL during a Redis outage is not run again by
// a gateway started after it (a restart, a deploy, another replica) once
// Redis is back: the retry is answered from PostgreSQL. The switch-back
// check of package fallback lives in the process that wrote to the
// secondary, so without a check at start the new gateway claimed the key
// in Redis, which had never seen it, and the upstream ran it twice.
func TestSecondaryKeysSurviveRestart(t *testing.T) {
	rs := testenv.StartRedis(t)
	secondaryPostgres(t)
	cfg, up := secondaryConfig(t, rs, "")
	start := func() (*Gateway, *httptest.Server) {
		gw, err := New(cfg, Options{Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := gw.Prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
		return gw, httptest.NewServer(gw.Handler())
	}
	post := func(srv *httptest.Server, key, order string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"order":"`+order+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", "acct_1")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	gw1, srv1 := start()
	rs.Kill() // the outage: the breaker opens on the first failure
	testenv.WaitFor(t, 10*time.Second, "a claim served by the secondary", func() bool {
		return post(srv1, "probe-"+time.Now().Format(time.RFC3339Nano), "probe") == http.StatusCreated
	})
	if code := post(srv1, "pay-1", "pay-1"); code != http.StatusCreated {
		t.Fatalf("during the outage: %d, want 201 from the secondary", code)
	}
	srv1.Close()
	_ = gw1.Close()

	rs.Restart() // Redis is back (and has never seen pay-1)
	gw2, srv2 := start()
	t.Cleanup(func() {
		srv2.Close()
		_ = gw2.Close()
	})
	if code := post(srv2, "pay-1", "pay-1"); code != http.StatusCreated {
		t.Fatalf("retry after the restart: %d, want the stored 201", code)
	}
	if n := up.count("pay-1"); n != 1 {
		t.Fatalf("the upstream ran pay-1 %d times, want 1: a gateway started after the outage ran it again", n)
	}
}

// TestSecondaryUnreadableAtStart: a gateway that cannot read its fallback
// PostgreSQL at start cannot know whether it holds keys from an outage, so
// it runs no fresh key Redis grants until PostgreSQL answers the check (503,
// nothing forwarded), rather than risk running one a second time, and says
// it is not ready.
func TestSecondaryUnreadableAtStart(t *testing.T) {
	t.Setenv("IDEMGUARD_TEST_SECONDARY_PG", "postgres://u@127.0.0.1:1/db?sslmode=disable")
	up := newUpstream(t)
	env := startGateway(t, `upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
fallback: {policy: secondary, postgres_env: IDEMGUARD_TEST_SECONDARY_PG}
defaults: {caller: {header: X-Account-Id}}
routes: [{pattern: POST /orders}]
`, up.URL)
	req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/orders", strings.NewReader(`{"order":"o-1"}`))
	req.Header.Set("X-Account-Id", "acct_1")
	req.Header.Set("Idempotency-Key", "o-1")
	resp, err := env.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || up.count("o-1") != 0 {
		t.Fatalf("got %d, upstream ran it %d times; want 503 and 0 while the secondary cannot say whether it holds the key", resp.StatusCode, up.count("o-1"))
	}
	// Not ready meanwhile: a load balancer would keep sending it traffic
	// it answers 503 to.
	if code, res := checkReadyz(t, env.gw); code == http.StatusOK {
		t.Errorf("/readyz 200 (%+v) while every guarded request is answered 503 (the secondary cannot be read to check Redis's claims)", res)
	}
}
