package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/inventory"
)

const validBase = `listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
redis:
  addrs: [127.0.0.1:6379]
`

// Each mistake is reported with its line and the field's path, all of
// them at once, and nothing else is.
func TestConfigErrorsNameLineAndField(t *testing.T) {
	cases := []struct {
		name string
		text string
		want []string // "line:field: message part", one per mistake, in order
	}{
		{"unknown field, with a hint", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    tll: 1h
`, []string{"8:5: routes[0].tll: unknown field (did you mean \"ttl\"?)"}},
		{"bad duration", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    ttl: 24
`, []string{`8:10: routes[0].ttl: want a duration with its unit`}},
		{"lease below a second", validBase + `defaults:
  caller: {single: true}
  lease: 10ms
routes:
  - pattern: POST /orders
`, []string{"7:10: defaults.lease: 10ms is out of range"}},
		{"client_body_timeout zero", validBase + `client_body_timeout: 0s
routes:
  - pattern: POST /orders
    caller: {single: true}
`, []string{"5:22: client_body_timeout: 0s is out of range"}},
		{"ttl shorter than the lease", validBase + `defaults:
  caller: {single: true}
  ttl: 10s
routes:
  - pattern: POST /orders
    lease: 1m
    timeout: 5s
`, []string{"7:8: routes[0].ttl: 10s is shorter than the lease (1m0s, line 10)"}},
		{"ttl shorter than the timeout", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    ttl: 20s
    lease: 10s
`, []string{"8:10: routes[0].ttl: 20s is shorter than the timeout (30s, the default)"}},
		{"no caller", validBase + `routes:
  - pattern: POST /orders
`, []string{"6:5: routes[0].caller: missing: name the caller"}},
		{"two key sources", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    key: {header: Idempotency-Key, body: /id}
`, []string{"8:10: routes[0].key: choose exactly one key source"}},
		{"bad JSON pointer", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    key: {body: order_id}
`, []string{`8:17: routes[0].key.body: JSON pointer "order_id" does not start with "/"`}},
		{"soft with computed", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
    key: {computed: true}
    requirement: soft
`, []string{"9:18: routes[0].requirement: soft has no meaning with a computed key"}},
		{"jwt caller without jwt section", validBase + `routes:
  - pattern: POST /orders
    caller: {jwt: sub}
`, []string{"7:13: routes[0].caller.jwt: needs the jwt section"}},
		{"bad pattern", validBase + `routes:
  - pattern: POST orders
    caller: {single: true}
`, []string{"6:14: routes[0].pattern: not a ServeMux pattern"}},
		{"conflicting patterns", validBase + `defaults:
  caller: {single: true}
routes:
  - pattern: POST /orders/{id}
  - pattern: POST /orders/{name}
`, []string{`9:14: routes[1].pattern: "POST /orders/{name}" conflicts with an earlier route (routes[0], line 8)`}},
		{"methods against the pattern", validBase + `routes:
  - pattern: POST /orders
    methods: [PATCH]
    caller: {single: true}
`, []string{"7:14: routes[0].methods: the pattern \"POST /orders\" serves POST only"}},
		{"safe method guarded", validBase + `routes:
  - pattern: /orders
    methods: [POST, GET]
    caller: {single: true}
`, []string{"7:21: routes[0].methods[1]: GET is a safe method"}},
		{"upstream not http", `upstream: ftp://x
redis: {addrs: [127.0.0.1:6379]}
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{`1:11: upstream: want an http:// or https:// URL`}},
		{"missing sections", `listen: ":8080"
`, []string{"1:1: upstream: missing", "1:1: redis: missing", "1:1: routes: missing"}},
		{"redis: several addresses without a mode", `upstream: http://u
redis:
  addrs: [a:1, b:2]
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{"3:10: redis.addrs: 2 addresses: set mode"}},
		{"sentinel without master", `upstream: http://u
redis:
  mode: sentinel
  addrs: [a:26379, b:26379]
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{"3:3: redis.master_name: missing"}},
		{"unset secret", `upstream: http://u
redis: {addrs: [a:1], password_env: IDEMGUARD_TEST_SURELY_UNSET}
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{"2:37: redis.password_env: the environment variable IDEMGUARD_TEST_SURELY_UNSET is not set"}},
		{"fallback secondary without postgres", `upstream: http://u
redis: {addrs: [a:1]}
fallback: {policy: secondary}
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{"3:11: fallback.postgres_env: missing"}},
		{"fallback fields its policy does not read", `upstream: http://u
redis: {addrs: [a:1]}
fallback: {policy: none, timeout: 2s, open_timeout: 5s, failures_to_open: 2, schema: billing}
routes: [{pattern: POST /o, caller: {single: true}}]
`, []string{"3:26: fallback.timeout: has no effect under policy: none",
			"3:39: fallback.open_timeout: has no effect under policy: none",
			"3:57: fallback.failures_to_open: has no effect under policy: none",
			"3:78: fallback.schema: belongs to policy: secondary"}},
		{"durations and sizes too large to hold", validBase + `routes:
  - pattern: POST /a
    caller: {single: true}
    ttl: 9999999h
    max_body: 99999999999GiB
`, []string{`8:10: routes[0].ttl: "9999999h" is out of range: want 1s to 8784h0m0s`,
			`9:15: routes[0].max_body: "99999999999GiB" is out of range: want`}},
		{"set twice", validBase + `routes:
  - pattern: POST /a
    caller: {single: true}
    ttl: 1h
    ttl: 2h
`, []string{"9:5: routes[0].ttl: set twice (line 8 first)"}},
		{"bad size and enum", validBase + `routes:
  - pattern: POST /a
    caller: {single: true}
    max_body: 1 parsec
    unknown_outcome: retry
`, []string{`8:15: routes[0].max_body: want a size in bytes`, `9:22: routes[0].unknown_outcome: "retry" is not one of answer, resend`}},
		{"jwt: missing key file, unknown algorithm", validBase + `jwt:
  algorithms: [RS256, none]
  keys:
    - file: /nonexistent/key.pem
routes:
  - pattern: POST /a
    caller: {jwt: sub}
`, []string{`6:23: jwt.algorithms[1]: "none" is not a JWT algorithm`, `8:13: jwt.keys[0].file: open /nonexistent/key.pem`}},
		{"a safe method in the pattern", validBase + `routes:
  - pattern: GET /orders
    caller: {single: true}
`, []string{"6:14: routes[0].pattern: GET is a safe method: it is passed through, never guarded"}},
		{"a host with a port or a trailing dot", validBase + `routes:
  - pattern: POST api.example.com:8443/orders
    caller: {single: true}
  - pattern: api.example.com./carts
    caller: {single: true}
  - pattern: POST [::1]:8443/refunds
    caller: {single: true}
  - pattern: POST ::1/payouts
    caller: {single: true}
`, []string{`6:14: routes[0].pattern: the host "api.example.com:8443" never matches: requests' hosts are matched without a port or a trailing dot`,
			`8:14: routes[1].pattern: the host "api.example.com." never matches: requests' hosts are matched without a port or a trailing dot`,
			`10:14: routes[2].pattern: the host "[::1]:8443" never matches: requests' hosts are matched without a port or a trailing dot`}},
		{"a method in lower case in the pattern", validBase + `routes:
  - pattern: post /orders
    caller: {single: true}
`, []string{`6:14: routes[0].pattern: "post" is not an HTTP method (upper case, e.g. POST)`}},
		{"resend without a forwarded key", validBase + `forward_key_header: ""
defaults:
  unknown_outcome: resend
routes:
  - pattern: POST /orders
    caller: {single: true}
`, []string{"7:20: routes[0].unknown_outcome: resend needs the derived key sent to the upstream"}},
		{"the derived key in a field the request needs", validBase + `forward_key_header: authorization
routes:
  - pattern: POST /orders
    caller: {single: true}
`, []string{"5:21: forward_key_header: Authorization carries the request itself"}},
		{"the derived key where the caller is read", validBase + `forward_key_header: X-Account-Id
defaults:
  caller: {header: x-account-id}
routes:
  - pattern: POST /orders
`, []string{"7:11: routes[0].caller.header: X-Account-Id is also forward_key_header"}},
		{"the derived key where the caller is read, spelt apart", validBase + `forward_key_header: X-Account-Id
defaults:
  caller: {header: X_Account_Id}
routes:
  - pattern: POST /orders
  - pattern: POST /refunds
    caller: {header: x-account_id}
`, []string{"7:11: routes[0].caller.header: X_account_id is also forward_key_header",
			"11:13: routes[1].caller.header: X-Account_id is also forward_key_header"}},
		{"the derived key where the token is read", validBase + `forward_key_header: X-Auth_Token
jwt:
  header: X_Auth-Token
  keys:
    - file: /nonexistent/key.pem
routes:
  - pattern: POST /orders
    caller: {jwt: sub}
`, []string{"5:21: forward_key_header: X-Auth_token is also jwt.header", "9:13: jwt.keys[0].file: open /nonexistent/key.pem"}},
		{"the derived key where the caller is read, spelt apart both ways", validBase + `forward_key_header: X-Account_Id
routes:
  - pattern: POST /orders
    caller: {header: X_Account-Id}
`, []string{"8:13: routes[0].caller.header: X_account-Id is also forward_key_header"}},
		{"the derived key in a field the request needs, spelt apart", validBase + `forward_key_header: content_type
routes:
  - pattern: POST /orders
    caller: {single: true}
`, []string{"5:21: forward_key_header: Content_type carries the request itself"}},
		{"two hosts' routes to one upstream", validBase + `defaults:
  caller: {single: true}
routes:
  - pattern: POST api.example.com/orders
  - pattern: /Orders
    methods: [PUT, POST]
  - pattern: POST b.example.com/orders
    upstream: http://127.0.0.1:9001
  - pattern: POST c.example.com/orders
    upstream: HTTP://127.0.0.1:9001/
  - pattern: POST d.example.com/orders
    upstream: http://127.0.0.1:9002
  - pattern: POST e.example.com/orders
    upstream: http://localhost
  - pattern: POST f.example.com/orders
    upstream: http://LocalHost:80
`, []string{`9:14: routes[1].pattern: "/Orders" and routes[0] "POST api.example.com/orders" (line 8) take the same POST requests to the same upstream`,
			`13:14: routes[3].pattern: "POST c.example.com/orders" and routes[2] "POST b.example.com/orders" (line 11) take the same POST requests`,
			`19:14: routes[6].pattern: "POST f.example.com/orders" and routes[5] "POST e.example.com/orders" (line 17) take the same POST requests`}},
		{"two routes to one server's path under different prefixes", validBase + `defaults:
  caller: {single: true}
routes:
  - pattern: POST /orders
    upstream: http://127.0.0.1:9000/api/
  - pattern: POST /api/orders
  - pattern: /v2/orders/{id}
    methods: [POST]
  - pattern: POST /orders/{x}
    upstream: http://127.0.0.1:9000/v2
  - pattern: POST /x/{path...}
    upstream: http://127.0.0.1:9000/v3
`, []string{`10:14: routes[1].pattern: "POST /api/orders" and routes[0] "POST /orders" (line 8) take the same POST requests to the same upstream server`,
			`13:14: routes[3].pattern: "POST /orders/{x}" and routes[2] "/v2/orders/{id}" (line 11) take the same POST requests`}},
		{"a second YAML document", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
---
routes:
  - pattern: POST /payments
    caller: {single: true}
`, []string{"9:1: a second YAML document"}},
		{"a second YAML document after an empty one", validBase + `routes:
  - pattern: POST /orders
    caller: {single: true}
---
---
routes: []
`, []string{"10:1: a second YAML document"}},
		{"YAML syntax", "routes: [\n", []string{"line 1: did not find expected node content"}},
		{"empty file", "", []string{"the file is empty"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("gw.yaml", []byte(c.text))
			ce, ok := errors.AsType[*ConfigError](err)
			if !ok {
				t.Fatalf("err %v (%T), want a *ConfigError", err, err)
			}
			if len(ce.Errs) != len(c.want) {
				t.Fatalf("%d mistakes reported, want %d:\n%v", len(ce.Errs), len(c.want), err)
			}
			for i, w := range c.want {
				got := ce.Errs[i].Error()
				if !strings.HasPrefix(got, "gw.yaml:") || !strings.Contains(got, w) {
					t.Errorf("mistake %d:\n got  %s\n want gw.yaml:%s...", i, got, w)
				}
			}
		})
	}
}

// JSON is read too, with its lines; defaults fill what a route leaves out.
func TestConfigJSONAndDefaults(t *testing.T) {
	text := `{
	"upstream": "http://127.0.0.1:9000/api",
	"redis": {"addrs": ["127.0.0.1:6379"]},
	"defaults": {"caller": {"header": "x-account-id"}, "ttl": "1h", "wait": "2s"},
	"routes": [
		{"pattern": "POST /orders"},
		{"pattern": "/payments/{id}", "key": {"body": "/payment_id"}, "caller": {"jwt": "sub"}, "ttl": "48h"}
	]
}`
	if _, err := Parse("gw.json", []byte(text)); err == nil || !strings.Contains(err.Error(), "gw.json:7:") {
		t.Fatalf("a jwt caller without the jwt section: %v; want an error on line 7", err)
	}
	text = strings.Replace(text, `"caller": {"jwt": "sub"}, `, "", 1)
	cfg, err := Parse("gw.json", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Routes[0], cfg.Routes[1]
	if a.Caller.Header != "X-Account-Id" || a.Caller.Scope != inventory.ScopeTenant || a.TTL != time.Hour || a.Wait != 2*time.Second ||
		a.Key.Header != "Idempotency-Key" || a.Required != inventory.RequireHard || a.UnknownOutcome != Answer ||
		len(a.Methods) != 1 || a.Methods[0] != "POST" || a.Upstream.String() != "http://127.0.0.1:9000/api" {
		t.Errorf("route 0: %+v", a)
	}
	if b.TTL != 48*time.Hour || b.Key.Body != "/payment_id" || len(b.Methods) != 2 || b.Caller.Header != "X-Account-Id" || b.Line != 7 {
		t.Errorf("route 1: %+v", b)
	}
	if cfg.Listen != DefaultListen || cfg.Fallback.Policy != "fail-closed" || cfg.Redis.Mode != "standalone" {
		t.Errorf("top level: %+v", cfg)
	}
}
