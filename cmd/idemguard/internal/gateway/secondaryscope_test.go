package gateway

import (
	"context"
	"database/sql"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// secondaryPostgres migrates a PostgreSQL schema of the test's own for
// fallback's secondary policy and names it in IDEMGUARD_TEST_SECONDARY_PG,
// which secondaryConfig's configurations read, and returns it.
func secondaryPostgres(t *testing.T) *sql.DB {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(context.Background(), db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEMGUARD_TEST_SECONDARY_PG", dsn)
	return db
}

// secondaryConfig is the configuration of a gateway in front of a new
// upstream, over Redis rs (its keys under prefix, if any), whose fallback
// keeps keys in the secondaryPostgres while Redis is out (its breaker
// opens on the first failure and stays open).
func secondaryConfig(t *testing.T, rs *testenv.Server, prefix string) (*Config, *upstream) {
	t.Helper()
	up := newUpstream(t)
	redisCfg := `redis: {addrs: ["` + rs.Addr() + `"]}`
	if prefix != "" {
		redisCfg = `redis: {addrs: ["` + rs.Addr() + `"], prefix: "` + prefix + `"}`
	}
	cfg, err := Parse("gw.yaml", []byte(`upstream: `+up.URL+`
`+redisCfg+`
fallback: {policy: secondary, postgres_env: IDEMGUARD_TEST_SECONDARY_PG, timeout: 200ms, failures_to_open: 1, open_timeout: 1h}
defaults: {caller: {header: X-Account-Id}}
routes: [{pattern: POST /orders}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, up
}

// twoServices starts two gateways, each in front of a service of its
// own, with a Redis prefix each but the same fallback PostgreSQL (one
// schema, no fallback.schema), over a Redis of the test's own that it can
// stop.
func twoServices(t *testing.T) (rs *testenv.Server, a, b *gwEnv, upA, upB *upstream) {
	t.Helper()
	rs = testenv.StartRedis(t)
	secondaryPostgres(t)
	start := func(prefix string) (*gwEnv, *upstream) {
		cfg, up := secondaryConfig(t, rs, prefix)
		return startConfigured(t, cfg), up
	}
	a, upA = start("svc-a:")
	b, upB = start("svc-b:")
	return rs, a, b, upA, upB
}

// outage stops Redis and waits until the gateways serve claims from the
// secondary.
func outage(t *testing.T, rs *testenv.Server, envs ...*gwEnv) {
	t.Helper()
	rs.Kill()
	onSecondary(t, envs...)
}

// onSecondary waits until the gateways, Redis down, serve claims from the
// secondary (their breakers open on the first failure).
func onSecondary(t *testing.T, envs ...*gwEnv) {
	t.Helper()
	for _, e := range envs {
		testenv.WaitFor(t, 10*time.Second, "a claim served by the secondary", func() bool {
			return post(t, e.srv.URL+"/orders", "probe-"+time.Now().Format(time.RFC3339Nano), `{"order":"probe"}`,
				"X-Account-Id", "acct9").status == http.StatusCreated
		})
	}
}

// TestSecondaryKeysKeptPerService: two gateways of different services
// (a Redis prefix each) that share a fallback PostgreSQL never answer one
// another's requests during a Redis outage. Gateway B runs caller acct9's
// key shared-K through PostgreSQL; gateway A's request with the same
// caller, key and body is its own, and reaches A's upstream. The keys were kept
// in PostgreSQL by caller, method and route only, so A answered from B's
// record (B's 201, Idempotent-Replayed) and A's upstream never saw it.
func TestSecondaryKeysKeptPerService(t *testing.T) {
	rs, a, b, upA, upB := twoServices(t)
	outage(t, rs, a, b)

	rb := post(t, b.srv.URL+"/orders", "shared-K", `{"order":"k-1"}`, "X-Account-Id", "acct9")
	if rb.status != http.StatusCreated || rb.replayed() {
		t.Fatalf("gateway B: %d (replayed %t), want a fresh 201", rb.status, rb.replayed())
	}
	ra := post(t, a.srv.URL+"/orders", "shared-K", `{"order":"k-1"}`, "X-Account-Id", "acct9")
	if ra.status != http.StatusCreated || ra.replayed() {
		t.Fatalf("gateway A: %d (replayed %t) %s, want a fresh 201 from its own upstream", ra.status, ra.replayed(), ra.body)
	}
	if n, m := upA.count("k-1"), upB.count("k-1"); n != 1 || m != 1 {
		t.Fatalf("service A ran the request %d times, service B %d times; want once each", n, m)
	}
	// Each gateway's own retry is still answered from its own record.
	if r := post(t, a.srv.URL+"/orders", "shared-K", `{"order":"k-1"}`, "X-Account-Id", "acct9"); !r.replayed() || upA.count("k-1") != 1 {
		t.Fatalf("gateway A's retry: %d (replayed %t), upstream ran it %d times; want the stored 201", r.status, r.replayed(), upA.count("k-1"))
	}
	if r := post(t, b.srv.URL+"/orders", "shared-K", `{"order":"k-1"}`, "X-Account-Id", "acct9"); !r.replayed() || upB.count("k-1") != 1 {
		t.Fatalf("gateway B's retry: %d (replayed %t), upstream ran it %d times; want the stored 201", r.status, r.replayed(), upB.count("k-1"))
	}
}

// TestSecondaryStartCheckOwnKeys: the start-up check of a gateway reads
// only its own service's keys in the shared PostgreSQL. Another service's
// keys from an outage made it check every claim against PostgreSQL (one
// more query each) until the last of them expired.
func TestSecondaryStartCheckOwnKeys(t *testing.T) {
	rs, _, b, _, _ := twoServices(t)
	outage(t, rs, b)
	rs.Restart()

	up := newUpstream(t)
	cfg, err := Parse("gw.yaml", []byte(`upstream: `+up.URL+`
redis: {addrs: ["`+rs.Addr()+`"], prefix: "svc-c:"}
fallback: {policy: secondary, postgres_env: IDEMGUARD_TEST_SECONDARY_PG}
defaults: {caller: {header: X-Account-Id}}
routes: [{pattern: POST /orders}]
`))
	if err != nil {
		t.Fatal(err)
	}
	c := startConfigured(t, cfg)
	if until := c.gw.fb.ConsultUntil(); !until.IsZero() {
		t.Fatalf("gateway C checks claims against PostgreSQL until %s: it read service B's keys", until.Format(time.RFC3339))
	}
	// B, started again, still finds its own.
	cfg.Redis.Prefix = "svc-b:"
	if until := startConfigured(t, cfg).gw.fb.ConsultUntil(); until.IsZero() {
		t.Fatal("gateway B started again does not check claims against PostgreSQL: it missed its own keys from the outage")
	}
}

// olderOutage is what olderVersionOutage leaves: key pay-1 run once
// (201) by a gateway of prefix svc-a: during a Redis outage, the gateway
// stopped, its rows in the fallback PostgreSQL put under the bare scope
// an older version wrote them with, Redis still down.
type olderOutage struct {
	rs  *testenv.Server
	db  *sql.DB
	cfg *Config
	up  *upstream
	tag string // svc-a:'s scope tag
	pay func(e *gwEnv) reply
}

func olderVersionOutage(t *testing.T) olderOutage {
	t.Helper()
	o := olderOutage{rs: testenv.StartRedis(t), db: secondaryPostgres(t), tag: SecondaryScopeTag("svc-a:")}
	o.cfg, o.up = secondaryConfig(t, o.rs, "svc-a:")
	o.pay = func(e *gwEnv) reply {
		return post(t, e.srv.URL+"/orders", "pay-1", `{"order":"pay-1"}`, "X-Account-Id", "acct9")
	}
	old := startConfigured(t, o.cfg)
	outage(t, o.rs, old)
	if r := o.pay(old); r.status != http.StatusCreated || o.up.count("pay-1") != 1 {
		t.Fatalf("during the outage: %d, upstream ran it %d times; want 201 once", r.status, o.up.count("pay-1"))
	}
	_ = old.gw.Close()
	// What the older version wrote: the same rows, under the bare scope.
	if _, err := o.db.Exec(`UPDATE idemguard_keys SET scope = substr(scope, char_length($1) + 1) WHERE starts_with(scope, $1)`, o.tag); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestSecondaryOlderVersionRows: rows an older version kept in the
// fallback PostgreSQL (under the bare scope, before the Redis prefix
// reached it) are honoured after an upgrade until they expire: a key it
// ran during an outage is replayed, not run again, both by a claim in
// PostgreSQL during a new outage and by the check of a claim Redis grants.
func TestSecondaryOlderVersionRows(t *testing.T) {
	o := olderVersionOutage(t)
	db, cfg, up, pay, tag, rs := o.db, o.cfg, o.up, o.pay, o.tag, o.rs

	// Upgraded during the outage: the claim goes to PostgreSQL.
	during := startConfigured(t, cfg)
	onSecondary(t, during)
	if r := pay(during); r.status != http.StatusCreated || !r.replayed() || up.count("pay-1") != 1 {
		t.Fatalf("upgraded, Redis still down: %d (replayed %t), upstream ran it %d times; want the stored 201", r.status, r.replayed(), up.count("pay-1"))
	}
	// Upgraded after it: Redis grants the claim, PostgreSQL's row answers it.
	// (The probes' rows gone, only the older version's rows start the check.)
	if _, err := db.Exec(`DELETE FROM idemguard_keys WHERE starts_with(scope, $1)`, tag); err != nil {
		t.Fatal(err)
	}
	rs.Restart()
	if r := pay(startConfigured(t, cfg)); r.status != http.StatusCreated || !r.replayed() || up.count("pay-1") != 1 {
		t.Fatalf("upgraded, Redis back: %d (replayed %t), upstream ran it %d times; want the stored 201", r.status, r.replayed(), up.count("pay-1"))
	}
}

// TestSecondaryScopeForm: the scope SecondaryScope gives begins with its
// prefix's tag, which no other prefix's tag begins with, and matches the
// form PostgreSQL tells an older version's rows by; no scope a gateway
// builds does.
func TestSecondaryScopeForm(t *testing.T) {
	db, _ := testenv.Postgres(t)
	long := strings.Repeat("p", 600)
	prefixes := []string{"idem:", "svc", "svc-b:", `a"b\c:`, "é\x01\xff", "", long, long + "q"}
	tags := map[string]string{}
	for _, p := range prefixes {
		tag := SecondaryScopeTag(p)
		for q, other := range tags {
			if strings.HasPrefix(tag, other) || strings.HasPrefix(other, tag) {
				t.Errorf("tags of %q and %q: %q, %q: one begins the other", p, q, tag, other)
			}
		}
		tags[p] = tag
		for _, scope := range []string{`"acct9" POST /orders`, "POST /orders", strings.Repeat("x", guard.MaxScopeLen)} {
			s := SecondaryScope(p, scope)
			if err := (guard.Key{Scope: s, ID: "k"}).Validate(); err != nil || !strings.HasPrefix(s, tag) {
				t.Errorf("SecondaryScope(%q, %q) = %q: %v", p, scope, s, err)
			}
			var match bool
			if err := db.QueryRow(`SELECT $1 ~ $2`, s, secondaryScopeForm).Scan(&match); err != nil || !match {
				t.Errorf("%q does not match the form (%v)", s, err)
			}
		}
	}
	for _, legacy := range []string{`"acct9" POST /orders`, `"a\":b" POST /x:y`, "POST /orders", "sha256:" + strings.Repeat("0", 64), `"" GET /`} {
		var match bool
		if err := db.QueryRow(`SELECT $1 ~ $2`, legacy, secondaryScopeForm).Scan(&match); err != nil || match {
			t.Errorf("a scope an older version wrote, %q, matches the form (%v)", legacy, err)
		}
	}
}
