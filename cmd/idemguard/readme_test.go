package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/gateway"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
)

// readmeGatewayConfig returns the YAML block of the README's "Run it in
// front of any service" section, written to a file of its own, with the
// variable it names set.
func readmeGatewayConfig(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Run it in front of any service\n")
	if !ok {
		t.Fatal(`README.md has no "## Run it in front of any service" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	_, block, ok := strings.Cut(section, "\n```yaml\n")
	if !ok {
		t.Fatal("the README's gateway section has no ```yaml block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("the README's gateway YAML block is not closed")
	}
	t.Setenv("GATEWAY_JWT_SECRET", strings.Repeat("s", 32)) // the section's command sets it
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(block+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The README's gateway configuration is read by the gateway's own loader
// without a mistake, and says what the README says it does.
func TestReadmeGatewayConfig(t *testing.T) {
	cfg, err := gateway.Load(readmeGatewayConfig(t))
	if err != nil {
		t.Fatalf("the README's configuration does not load:\n%v", err)
	}
	if cfg.Listen != ":8080" || cfg.AdminListen != "127.0.0.1:9090" || cfg.Upstream.String() != "http://127.0.0.1:9000" ||
		cfg.Redis.Mode != "standalone" || len(cfg.Redis.Addrs) != 1 || cfg.Fallback.Policy != "fail-closed" || cfg.JWT == nil {
		t.Errorf("top level: %+v", cfg)
	}
	type want struct {
		pattern  string
		methods  string
		required inventory.Requirement
		key      gateway.KeySpec
		caller   gateway.CallerSpec
	}
	header := gateway.CallerSpec{Header: "X-Account-Id", Scope: inventory.ScopeTenant}
	wants := []want{
		{"POST /orders", "POST", inventory.RequireHard, gateway.KeySpec{Header: "Idempotency-Key"}, header},
		{"POST /payments/{id}/capture", "POST", inventory.RequireHard, gateway.KeySpec{Header: "Idempotency-Key"},
			gateway.CallerSpec{JWT: "sub", Scope: inventory.ScopeUser}},
		{"POST /webhooks/stripe", "POST", inventory.RequireHard, gateway.KeySpec{Body: "/id"},
			gateway.CallerSpec{Single: true, Scope: inventory.ScopeGlobal}},
		{"POST /carts/{id}/checkout", "POST", inventory.RequireHard, gateway.KeySpec{Computed: true}, header},
		{"/carts/{id}/items", "POST,PATCH", inventory.RequireSoft, gateway.KeySpec{Header: "Idempotency-Key"}, header},
	}
	if len(cfg.Routes) != len(wants) {
		t.Fatalf("%d routes, want %d", len(cfg.Routes), len(wants))
	}
	for i, w := range wants {
		r := cfg.Routes[i]
		if r.Pattern != w.pattern || strings.Join(r.Methods, ",") != w.methods || r.Required != w.required ||
			r.Key.Header != w.key.Header || r.Key.Body != w.key.Body || r.Key.Computed != w.key.Computed || r.Caller != w.caller {
			t.Errorf("route %d: %+v\nwant %+v", i, r, w)
		}
		if r.TTL != 24*time.Hour || r.Lease != 30*time.Second || r.Timeout != 30*time.Second || r.Wait != 5*time.Second ||
			r.MaxBody != 1<<20 || r.MaxStoredResponse != 1<<20 || r.UnknownOutcome != gateway.Answer {
			t.Errorf("route %d: the defaults section was not applied: %+v", i, r)
		}
	}

	// The defaults the README's list gives: ttl 24h, lease 30s, timeout
	// 30s, max_body and max_stored_response 1 MiB, wait 0.
	path := filepath.Join(t.TempDir(), "minimal.yaml")
	minimal := "upstream: http://127.0.0.1:9000\nredis: {addrs: [\"127.0.0.1:6379\"]}\nroutes: [{pattern: POST /orders, caller: {single: true}}]\n"
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = gateway.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Routes[0]; r.TTL != 24*time.Hour || r.Lease != 30*time.Second || r.Timeout != 30*time.Second || r.Wait != 0 ||
		r.MaxBody != 1<<20 || r.MaxStoredResponse != 1<<20 || r.Required != inventory.RequireHard || r.Key.Header != "Idempotency-Key" {
		t.Errorf("defaults differ from the README's: %+v", r)
	}
	if cfg.Fallback.Policy != "fail-closed" || cfg.Log.Format != "json" || cfg.Log.Keys || cfg.ForwardKeyHeader != "Idempotency-Key" ||
		cfg.XForwarded != "set" || cfg.ClientBodyTimeout != 60*time.Second {
		t.Errorf("defaults differ from the README's: %+v", cfg)
	}
}

// `idemguard serve --config FILE --print-inventory` on the README's
// configuration prints its routes (and connects to nothing).
func TestReadmeGatewayInventory(t *testing.T) {
	path := readmeGatewayConfig(t)
	code, out, stderr := cli(t, "serve", "--config", path, "--print-inventory")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"| /orders | POST | hard | header | tenant | Idempotency-Key | 24h |  |",
		"| /payments/{id}/capture | POST | hard | header | user | Idempotency-Key | 24h |  |",
		"| /webhooks/stripe | POST | hard | body | global | /id | 24h |  |",
		"| /carts/{id}/checkout | POST | hard | computed | tenant |",
		"| /carts/{id}/items | POST | soft | header | tenant | Idempotency-Key | 24h |  |",
		"| /carts/{id}/items | PATCH | soft | header | tenant | Idempotency-Key | 24h |  |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the inventory lacks %q:\n%s", want, out)
		}
	}

	code, out, stderr = cli(t, "serve", "--config", path, "--print-inventory", "--format", "json")
	if code != 0 {
		t.Fatalf("json: exit %d: %s", code, stderr)
	}
	var doc struct {
		Entries []struct {
			Handler  string `json:"handler"`
			Method   string `json:"method"`
			Required string `json:"idempotency_required"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	guarded := 0
	for _, e := range doc.Entries {
		if e.Required == "hard" || e.Required == "soft" {
			guarded++
		}
	}
	if guarded != 6 {
		t.Errorf("%d guarded entries, want 6 (five routes, one of them POST and PATCH): %s", guarded, out)
	}
}

// Every `serve` command of the README's gateway section sets the variables
// the section's configuration names (secret_env, password_env, ...): the
// whole configuration is checked before anything, --print-inventory
// included, so a command without them fails as the README shows it.
func TestReadmeGatewayCommandsSetTheirVariables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Run it in front of any service\n")
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	_, sh, ok := strings.Cut(section, "\n```sh\n")
	if !ok {
		t.Fatal("the README's gateway section has no ```sh block")
	}
	sh, _, _ = strings.Cut(sh, "\n```\n")
	_, yaml, _ := strings.Cut(section, "\n```yaml\n")
	yaml, _, _ = strings.Cut(yaml, "\n```\n")
	vars := regexp.MustCompile(`\b[a-z_]*_env: ([A-Z_][A-Z0-9_]*)`).FindAllStringSubmatch(yaml, -1)
	if len(vars) == 0 {
		t.Fatal("the README's configuration names no variable: this test checks nothing")
	}
	commands := 0
	for _, line := range strings.Split(sh, "\n") {
		if !strings.Contains(line, " serve ") {
			continue
		}
		commands++
		cmd, _, _ := strings.Cut(line, "#")
		for _, v := range vars {
			if !strings.Contains(cmd, v[1]+"=") {
				t.Errorf("the README's command %q does not set %s, which its configuration needs", strings.TrimSpace(cmd), v[1])
			}
		}
	}
	if commands == 0 {
		t.Fatal("the README's gateway section has no serve command")
	}
}

// The README's "Looking at a key": a key httpx stored is found by
// `inspect` under the scope the README spells ("caller" METHOD /pattern),
// and so is one stored with SingleCaller (METHOD /pattern).
func TestReadmeInspectScopes(t *testing.T) {
	addr, prefix, g := keysFixture(t)
	type accountKey struct{}
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	tenant := httpx.Guard(g, httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})
	mux.Handle("POST /charges/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant(ok).ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, "acct_42")))
	}))
	mux.Handle("POST /refunds", httpx.Guard(g, httpx.Options{SingleCaller: true})(ok))
	for _, path := range []string{"/charges/7", "/refunds"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "key-1")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", path, rec.Code, rec.Body)
		}
	}
	for _, scope := range []string{`"acct_42" POST /charges/{id}`, "POST /refunds"} {
		code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, scope, "key-1")
		if code != 0 || !strings.Contains(out, "state        completed") {
			t.Errorf("inspect %q key-1: exit %d: %s %s", scope, code, out, stderr)
		}
	}
}
