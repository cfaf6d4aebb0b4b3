package httpx_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Claims shapes of the JWT libraries TenantFromJWT reads, as their
// middlewares store them.

// golangJWTClaims has golang-jwt/jwt v5's Claims getters.
type golangJWTClaims struct{ iss, sub string }

func (c golangJWTClaims) GetSubject() (string, error) { return c.sub, nil }
func (c golangJWTClaims) GetIssuer() (string, error)  { return c.iss, nil }

// jwxV2Token has lestrrat-go/jwx v2's jwt.Token accessors.
type jwxV2Token struct{ iss, sub string }

func (t jwxV2Token) Subject() string { return t.sub }
func (t jwxV2Token) Issuer() string  { return t.iss }

// jwxV3Token has lestrrat-go/jwx v3's.
type jwxV3Token struct{ iss, sub string }

func (t jwxV3Token) Subject() (string, bool) { return t.sub, t.sub != "" }
func (t jwxV3Token) Issuer() (string, bool)  { return t.iss, t.iss != "" }

type ctxKey string

// user is what a session middleware might store.
type user struct{ Account, Token string }

// construction is one way the README and the examples build a Guard that
// keeps callers apart: its Tenant option, and an authentication
// middleware that turns a bearer token into what that option reads. Each
// middleware knows three tokens: two of alice's (the second a refresh of
// the first) and one of bob's; any other request passes through with no
// identity, as an optional-auth middleware would let it.
type construction struct {
	name   string
	tenant func(*http.Request) string
	auth   func(token string) (key, value any, ok bool)
}

var tokens = map[string]string{"alice-1": "alice", "alice-2": "alice", "bob-1": "bob"}

func constructions() []construction {
	account := func(tok string) (string, bool) { a, ok := tokens[tok]; return a, ok }
	return []construction{
		{"TenantFromContext string", httpx.TenantFromContext[string](ctxKey("account"), nil),
			func(tok string) (any, any, bool) { a, ok := account(tok); return ctxKey("account"), a, ok }},
		{"TenantFromContext struct", httpx.TenantFromContext(ctxKey("user"), func(u *user) string { return u.Account }),
			func(tok string) (any, any, bool) {
				a, ok := account(tok)
				return ctxKey("user"), &user{Account: a, Token: tok}, ok
			}},
		{"TenantFromJWT map claims", httpx.TenantFromJWT(ctxKey("claims")),
			func(tok string) (any, any, bool) {
				a, ok := account(tok)
				return ctxKey("claims"), map[string]any{"iss": "https://auth.example", "sub": a, "jti": tok}, ok
			}},
		{"TenantFromJWT golang-jwt", httpx.TenantFromJWT(ctxKey("claims")),
			func(tok string) (any, any, bool) {
				a, ok := account(tok)
				return ctxKey("claims"), golangJWTClaims{iss: "https://auth.example", sub: a}, ok
			}},
		{"TenantFromJWT jwx v2", httpx.TenantFromJWT(ctxKey("claims")),
			func(tok string) (any, any, bool) {
				a, ok := account(tok)
				return ctxKey("claims"), jwxV2Token{iss: "https://auth.example", sub: a}, ok
			}},
		{"TenantFromJWT jwx v3", httpx.TenantFromJWT(ctxKey("claims")),
			func(tok string) (any, any, bool) {
				a, ok := account(tok)
				return ctxKey("claims"), jwxV3Token{iss: "https://auth.example", sub: a}, ok
			}},
		{"Tenant func", func(r *http.Request) string { v, _ := r.Context().Value(ctxKey("acct")).(string); return v },
			func(tok string) (any, any, bool) { a, ok := account(tok); return ctxKey("acct"), a, ok }},
	}
}

// authMiddleware is c's authentication middleware.
func (c construction) authMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k, v, ok := c.auth(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")); ok {
			r = r.WithContext(context.WithValue(r.Context(), k, v))
		}
		next.ServeHTTP(w, r)
	})
}

// routers mounts a guarded POST /pay the ways the examples do.
var callerRouters = []struct {
	name  string
	build func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler
}{
	{"ServeMux", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		m := http.NewServeMux()
		m.Handle("POST /pay", mw(h))
		return m
	}},
	{"chi", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		r := chi.NewRouter()
		r.With(mw).Post("/pay", h.ServeHTTP)
		return r
	}},
	{"gorilla/mux", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		r := mux.NewRouter()
		r.Use(mux.MiddlewareFunc(mw))
		r.Handle("/pay", h).Methods("POST")
		return r
	}},
}

// TestCallersIndependent: under every construction the README shows, two
// callers sending the same key and body each get their own run and
// response; a caller whose token was refreshed between two retries is
// replayed, not run again; a request that names no caller gets 401 and
// stores nothing.
func TestCallersIndependent(t *testing.T) {
	for _, c := range constructions() {
		for _, rt := range callerRouters {
			t.Run(c.name+"/"+rt.name, func(t *testing.T) {
				e := newEnv(t, guard.Options{})
				h := &orders{}
				mw := httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), Tenant: c.tenant})
				srv, cl := serve(t, c.authMiddleware(rt.build(mw, h)))
				url := srv.URL + "/pay"
				bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

				alice := do(t, cl, "POST", url, `{"amount":10}`, with(key("k-1"), bearer("alice-1"))...)
				bob := do(t, cl, "POST", url, `{"amount":10}`, with(key("k-1"), bearer("bob-1"))...)
				if alice.status != http.StatusCreated || bob.status != http.StatusCreated {
					t.Fatalf("alice %d, bob %d", alice.status, bob.status)
				}
				if bob.replayed() || bytes.Equal(bob.body, alice.body) {
					t.Fatalf("bob got alice's response: replayed %v, %q", bob.replayed(), bob.body)
				}
				refreshed := do(t, cl, "POST", url, `{"amount":10}`, with(key("k-1"), bearer("alice-2"))...)
				if !refreshed.replayed() || !bytes.Equal(refreshed.body, alice.body) {
					t.Fatalf("alice with a refreshed token: replayed %v, %q; want her first response", refreshed.replayed(), refreshed.body)
				}
				bob2 := do(t, cl, "POST", url, `{"amount":10}`, with(key("k-1"), bearer("bob-1"))...)
				if !bob2.replayed() || !bytes.Equal(bob2.body, bob.body) {
					t.Fatalf("bob's repeat: replayed %v, %q", bob2.replayed(), bob2.body)
				}
				for _, anon := range [][]string{key("k-1"), with(key("k-1"), bearer("expired-token"))} {
					r := do(t, cl, "POST", url, `{"amount":10}`, anon...)
					if r.status != http.StatusUnauthorized || r.problem(t).Type != httpx.ProblemCallerUnknown {
						t.Fatalf("no caller: %d %s", r.status, r.body)
					}
				}
				if n := h.runs.Load(); n != 2 {
					t.Fatalf("handler ran %d times, want 2 (alice, bob)", n)
				}
				if n := e.records(t); n != 2 {
					t.Fatalf("%d records, want 2", n)
				}
			})
		}
	}
}

// TestSingleCallerShares: SingleCaller is the documented opt-in that does
// not scope keys: two callers with the same key share one response. It is
// reached only by saying so.
func TestSingleCallerShares(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, cl := serve(t, httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(h))
	a := do(t, cl, "POST", srv.URL+"/pay", "x", with(key("s-1"), []string{"Authorization", "Bearer alice-1"})...)
	b := do(t, cl, "POST", srv.URL+"/pay", "x", with(key("s-1"), []string{"Authorization", "Bearer bob-1"})...)
	if !b.replayed() || !bytes.Equal(a.body, b.body) || h.runs.Load() != 1 {
		t.Fatalf("SingleCaller: second caller replayed %v, runs %d", b.replayed(), h.runs.Load())
	}
}

// TestGuardRequiresCallerChoice: a Guard that would share keys across
// callers without saying so cannot be built: Guard panics, naming the
// options to choose from.
func TestGuardRequiresCallerChoice(t *testing.T) {
	e := newEnv(t, guard.Options{})
	panics := func(name string, f func()) (msg string) {
		t.Helper()
		defer func() {
			p := recover()
			if p == nil {
				t.Fatalf("%s: no panic", name)
			}
			msg, _ = p.(string)
		}()
		f()
		return ""
	}
	msg := panics("no choice", func() { httpx.Guard(e.g, httpx.Options{}) })
	for _, want := range []string{"Options.Tenant", "Options.SingleCaller", "another caller's response"} {
		if !strings.Contains(msg, want) {
			t.Errorf("panic %q does not mention %q", msg, want)
		}
	}
	msg = panics("both", func() {
		httpx.Guard(e.g, httpx.Options{SingleCaller: true, Tenant: func(*http.Request) string { return "x" }})
	})
	if !strings.Contains(msg, "both") {
		t.Errorf("panic %q", msg)
	}
	panics("nil guard", func() { httpx.Guard(nil, httpx.Options{SingleCaller: true}) })
	panics("nil context key", func() { httpx.TenantFromJWT(nil) })
	// Either choice alone builds.
	httpx.Guard(e.g, httpx.Options{SingleCaller: true})
	httpx.Guard(e.g, httpx.Options{Tenant: httpx.TenantFromJWT(ctxKey("c"))})
}

// TestTenantFromJWTShapes: the claims shapes named in the doc give
// "iss" "sub"; anything else, a failing getter, or no subject gives "".
func TestTenantFromJWTShapes(t *testing.T) {
	tenant := httpx.TenantFromJWT(ctxKey("claims"))
	cases := []struct {
		claims any
		want   string
	}{
		{map[string]any{"iss": "i", "sub": "s"}, `"i" "s"`},
		{map[string]any{"sub": "s"}, `"" "s"`},
		{golangJWTClaims{"i", "s"}, `"i" "s"`},
		{jwxV2Token{"i", "s"}, `"i" "s"`},
		{jwxV3Token{"i", "s"}, `"i" "s"`},
		{map[string]any{"iss": "i"}, ""},
		{map[string]any{"sub": 7}, ""},
		{"Bearer eyJhbGciOi...", ""}, // a raw token is never parsed
		{failingClaims{}, ""},
		{nil, ""},
	}
	for _, c := range cases {
		r, _ := http.NewRequest("POST", "/", nil)
		if c.claims != nil {
			r = r.WithContext(context.WithValue(r.Context(), ctxKey("claims"), c.claims))
		}
		if got := tenant(r); got != c.want {
			t.Errorf("%#v: %q, want %q", c.claims, got, c.want)
		}
	}
	// Two issuers with the same subject are two callers.
	r1, _ := http.NewRequest("POST", "/", nil)
	r2 := r1.WithContext(context.WithValue(r1.Context(), ctxKey("claims"), map[string]any{"iss": "a", "sub": "s"}))
	r1 = r1.WithContext(context.WithValue(r1.Context(), ctxKey("claims"), map[string]any{"iss": "b", "sub": "s"}))
	if tenant(r1) == tenant(r2) {
		t.Error("two issuers' subject s name one caller")
	}
}

type failingClaims struct{}

func (failingClaims) GetSubject() (string, error) { return "", errors.New("malformed sub") }
func (failingClaims) GetIssuer() (string, error)  { return "i", nil }
