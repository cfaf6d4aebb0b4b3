package httpx

import (
	"fmt"
	"net/http"
	"reflect"
	"strconv"
)

// TenantFromContext returns an Options.Tenant func that names the caller by
// the value an authentication middleware, running before the Guard, stored
// in the request context under key (the account, user or client it
// authenticated). name turns that value into the caller's name, e.g. its
// account id; a nil name uses the value itself when it is a string or a
// fmt.Stringer.
//
// The name must identify the caller, not its credential: a client that
// refreshes its token between two retries is the same caller, and its
// retry must be replayed, not run again. A request without a value under
// key, or whose value is not a T, gets "" (the Guard then answers 401 and
// stores nothing).
func TenantFromContext[T any](key any, name func(T) string) func(r *http.Request) string {
	if key == nil {
		panic("httpx.TenantFromContext: nil context key")
	}
	return func(r *http.Request) string {
		v, ok := r.Context().Value(key).(T)
		if !ok {
			return ""
		}
		if name != nil {
			return name(v)
		}
		switch s := any(v).(type) {
		case string:
			return s
		case fmt.Stringer:
			return s.String()
		}
		// A string of a type of its own (type AccountID string).
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.String {
			return rv.String()
		}
		return ""
	}
}

// TenantFromJWT returns an Options.Tenant func that names the caller by
// the issuer and subject ("iss" and "sub") of the JWT claims an
// authentication middleware verified and stored in the request context
// under key. It reads the claims only: it never looks at the Authorization
// header and never parses or verifies a token, so a caller whose token is
// refreshed between retries keeps its name, and an unverified token names
// no one.
//
// It understands the claims shapes of the common Go JWT libraries:
//   - values with GetSubject() (string, error) and GetIssuer() (string,
//     error): golang-jwt/jwt v5's Claims (jwt.MapClaims, *jwt.RegisteredClaims
//     and structs that embed it);
//   - values with Subject() string and Issuer() string: lestrrat-go/jwx v2's
//     jwt.Token (what go-chi/jwtauth stores);
//   - values with Subject() (string, bool) and Issuer() (string, bool):
//     lestrrat-go/jwx v3's jwt.Token;
//   - map[string]any with "sub" and "iss" strings.
//
// For other shapes (golang-jwt's *jwt.Token, auth0's
// *validator.ValidatedClaims) use TenantFromContext with a func that reads
// the subject. A request without claims, or with an empty subject, gets ""
// (the Guard then answers 401 and stores nothing). The name is the quoted
// issuer and subject: a subject is unique only within its issuer.
func TenantFromJWT(key any) func(r *http.Request) string {
	if key == nil {
		panic("httpx.TenantFromJWT: nil context key")
	}
	return func(r *http.Request) string {
		iss, sub := jwtSubject(r.Context().Value(key))
		if sub == "" {
			return ""
		}
		return strconv.Quote(iss) + " " + strconv.Quote(sub)
	}
}

// jwtSubject reads the issuer and subject of claims in one of the shapes
// TenantFromJWT lists; sub is "" for anything else.
func jwtSubject(claims any) (iss, sub string) {
	switch c := claims.(type) {
	case interface {
		GetSubject() (string, error)
		GetIssuer() (string, error)
	}:
		s, err := c.GetSubject()
		if err != nil {
			return "", ""
		}
		i, err := c.GetIssuer()
		if err != nil {
			return "", ""
		}
		return i, s
	case interface {
		Subject() string
		Issuer() string
	}:
		return c.Issuer(), c.Subject()
	case interface {
		Subject() (string, bool)
		Issuer() (string, bool)
	}:
		s, _ := c.Subject()
		i, _ := c.Issuer()
		return i, s
	case map[string]any:
		s, _ := c["sub"].(string)
		i, _ := c["iss"].(string)
		return i, s
	}
	return "", ""
}
