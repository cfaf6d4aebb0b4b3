package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/idemguard/idemguard/httpx"
)

// writePublicKey writes key's public half as PEM in dir.
func writePublicKey(t *testing.T, dir, name string, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The caller named by a verified JWT: a refreshed token (new iat, exp,
// jti) is the same caller, so its retry is replayed; another subject is
// another caller, whose same key runs on its own; a token that does not
// verify names no one.
func TestJWTCaller(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	dir := t.TempDir()
	writePublicKey(t, dir, "auth.pem", &rsaKey.PublicKey)
	writePublicKey(t, dir, "ec.pem", &ecKey.PublicKey)
	t.Setenv("TEST_JWT_SECRET", strings.Repeat("s3cret", 8))

	u := newUpstream(t)
	cfg, _ := configAt(t, filepath.Join(dir, "gateway.yaml"), `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
jwt:
  issuer: https://auth.example
  audience: orders
  keys:
    - file: auth.pem
      id: rsa-1
    - file: ec.pem
    - secret_env: TEST_JWT_SECRET
routes:
  - pattern: POST /orders
    caller: {jwt: sub}
  - pattern: POST /org-orders
    caller: {jwt: org}
`, u.URL)
	e := startConfigured(t, cfg)
	now := time.Now()
	claims := func(sub string, iat time.Time, extra ...any) jwt.MapClaims {
		c := jwt.MapClaims{"iss": "https://auth.example", "aud": "orders", "sub": sub,
			"iat": iat.Unix(), "exp": iat.Add(time.Hour).Unix(), "jti": iat.String()}
		for i := 0; i+1 < len(extra); i += 2 {
			c[extra[i].(string)] = extra[i+1]
		}
		return c
	}
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	url := e.srv.URL + "/orders"

	alice1 := sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("alice", now))
	alice2 := sign(t, jwt.SigningMethodES256, ecKey, "", claims("alice", now.Add(time.Minute))) // refreshed, by another key
	bob := sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("s3cret", 8)), "", claims("bob", now))

	first := post(t, url, "k-jwt", `{"order":"j1"}`, bearer(alice1)...)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("alice: %d %q", first.status, first.body)
	}
	refreshed := post(t, url, "k-jwt", `{"order":"j1"}`, bearer(alice2)...)
	if refreshed.status != http.StatusCreated || !refreshed.replayed() || refreshed.body != first.body {
		t.Fatalf("alice with a refreshed token: %d replayed=%v %q; want the replay", refreshed.status, refreshed.replayed(), refreshed.body)
	}
	if r := post(t, url, "k-jwt", `{"order":"j1"}`, bearer(bob)...); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("bob, same key: %d replayed=%v; want his own run", r.status, r.replayed())
	}
	if n := u.count("j1"); n != 2 {
		t.Fatalf("upstream ran %d times; want 2 (alice once, bob once)", n)
	}

	bad := map[string]string{
		"signed by an unknown key": sign(t, jwt.SigningMethodRS256, other, "", claims("alice", now)),
		"unknown kid":              sign(t, jwt.SigningMethodRS256, other, "rsa-9", claims("alice", now)),
		"expired":                  sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("alice", now.Add(-3*time.Hour))),
		"another issuer":           sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("alice", now, "iss", "https://evil.example")),
		"another audience":         sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("alice", now, "aud", "billing")),
		"no exp":                   sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", jwt.MapClaims{"iss": "https://auth.example", "aud": "orders", "sub": "alice"}),
		"alg none":                 noneToken(t, claims("alice", now)),
		"not a token":              "garbage",
	}
	for name, tok := range bad {
		r := post(t, url, "k-jwt", `{"order":"j1"}`, bearer(tok)...)
		if r.status != http.StatusUnauthorized || r.problemType() != httpx.ProblemCallerUnknown {
			t.Errorf("%s: %d %q; want 401 caller-unknown", name, r.status, r.body)
		}
	}
	if r := post(t, url, "k-jwt", `{"order":"j1"}`); r.status != http.StatusUnauthorized {
		t.Errorf("no token: %d", r.status)
	}
	if n := u.count("j1"); n != 2 {
		t.Fatalf("refused requests reached the upstream: %d runs", n)
	}
	if strings.Contains(e.logs.String(), alice1[:20]) {
		t.Errorf("a token reached the log")
	}

	// A claim other than sub names the caller: the org, across users.
	orgURL := e.srv.URL + "/org-orders"
	a := sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("alice", now, "org", "acme"))
	b := sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims("bob", now, "org", "acme"))
	if r := post(t, orgURL, "k-org", `{"order":"j2"}`, bearer(a)...); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("org, alice: %d", r.status)
	}
	if r := post(t, orgURL, "k-org", `{"order":"j2"}`, bearer(b)...); !r.replayed() {
		t.Fatalf("org, bob: %d replayed=%v; want alice's answer (same org)", r.status, r.replayed())
	}
}

// noneToken is a token with alg "none", which must never verify.
func noneToken(t *testing.T, claims jwt.MapClaims) string {
	tok := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
	s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A numeric claim names a caller exactly: two tenants whose ids differ
// beyond float64's 53 bits (64-bit ids, as many issuers mint) are two
// callers, and one's answer is never replayed to the other.
func TestJWTLargeNumericClaim(t *testing.T) {
	secret := strings.Repeat("s3cret", 8)
	t.Setenv("TEST_JWT_SECRET", secret)
	u := newUpstream(t)
	e := startGateway(t, `
upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
jwt:
  keys: [{secret_env: TEST_JWT_SECRET}]
routes:
  - pattern: POST /orders
    caller: {jwt: tenant_id}
`, u.URL)
	now := time.Now()
	token := func(tenant string) []string {
		tok := sign(t, jwt.SigningMethodHS256, []byte(secret), "", jwt.MapClaims{"sub": "svc",
			"tenant_id": json.Number(tenant), "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
		return []string{"Authorization", "Bearer " + tok}
	}
	url := e.srv.URL + "/orders"
	for _, tenant := range []string{"9007199254740992", "9007199254740993"} {
		r := post(t, url, "k-big", `{"order":"big1"}`, token(tenant)...)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("tenant %s: %d replayed=%v %q; want its own run", tenant, r.status, r.replayed(), r.body)
		}
	}
	if n := u.count("big1"); n != 2 {
		t.Fatalf("upstream ran %d times for two tenants' same key, want 2", n)
	}
	// Other numbers keep the names they had as float64s.
	name := claimTenant("tenant_id")
	for _, n := range []string{"42.0", "4.2e1"} {
		if got, want := name(jwt.MapClaims{"tenant_id": json.Number(n)}), name(jwt.MapClaims{"tenant_id": float64(42)}); got != want {
			t.Errorf("tenant_id %s names %s, want %s", n, got, want)
		}
	}
}
