package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"gopkg.in/yaml.v3"
)

// JWTConfig says how the gateway verifies the JWT that names a caller.
type JWTConfig struct {
	Header     string   // the field carrying "Bearer <token>"; default Authorization
	Issuer     string   // required "iss", if set
	Audience   string   // required in "aud", if set
	Algorithms []string // accepted "alg" values; default: those the keys can verify
	Leeway     time.Duration
	Keys       []JWTKey
}

// JWTKey is one verification key.
type JWTKey struct {
	ID  string // matched against the token's "kid", if set
	Key any    // *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey or []byte (HMAC)
}

// algorithmsFor lists the algorithms a key verifies.
func algorithmsFor(key any) []string {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return []string{"ES256"}
		case elliptic.P384():
			return []string{"ES384"}
		case elliptic.P521():
			return []string{"ES512"}
		}
	case ed25519.PublicKey:
		return []string{"EdDSA"}
	case []byte:
		return []string{"HS256", "HS384", "HS512"}
	}
	return nil
}

var knownAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA", "HS256", "HS384", "HS512"}

func (d *decoder) jwt(f field) *JWTConfig {
	m := d.mapping(f.val, f.path, "header", "issuer", "audience", "algorithms", "leeway", "keys")
	c := &JWTConfig{Header: "Authorization"}
	if v, ok := m["header"]; ok {
		if s, ok := d.str(v); ok {
			c.Header = d.headerName(v, s, false)
		}
	}
	if v, ok := m["issuer"]; ok {
		c.Issuer, _ = d.str(v)
	}
	if v, ok := m["audience"]; ok {
		c.Audience, _ = d.str(v)
	}
	if v, ok := m["leeway"]; ok {
		c.Leeway, _ = d.duration(v, 0, time.Hour)
	}
	v, ok := m["keys"]
	if !ok {
		d.errorf(f.val, f.path+".keys", "missing: the keys that verify the tokens (file: a PEM public key, or secret_env: a variable holding an HMAC secret)")
	} else if n := resolve(v.val); n.Kind != yaml.SequenceNode {
		d.errorf(n, v.path, "want a list of keys, got %s", kindName(n))
	} else {
		for i, item := range n.Content {
			path := fmt.Sprintf("%s[%d]", v.path, i)
			km := d.mapping(item, path, "id", "file", "secret_env")
			var k JWTKey
			if iv, ok := km["id"]; ok {
				k.ID, _ = d.str(iv)
			}
			fv, hasFile := km["file"]
			sv, hasSecret := km["secret_env"]
			switch {
			case hasFile == hasSecret:
				d.errorf(item, path, "choose exactly one of file (a PEM public key or certificate) and secret_env (a variable holding an HMAC secret)")
				continue
			case hasFile:
				name, ok := d.str(fv)
				if !ok {
					continue
				}
				if !filepath.IsAbs(name) {
					name = filepath.Join(d.dir, name)
				}
				key, err := readPublicKey(name)
				if err != nil {
					d.errorf(fv.val, fv.path, "%v", err)
					continue
				}
				k.Key = key
			default:
				secret := d.env(sv)
				if secret == "" {
					continue
				}
				if len(secret) < 32 {
					d.errorf(sv.val, sv.path, "the HMAC secret in %s is %d bytes; use at least 32", sv.val.Value, len(secret))
					continue
				}
				k.Key = []byte(secret)
			}
			c.Keys = append(c.Keys, k)
		}
		if len(n.Content) == 0 {
			d.errorf(n, v.path, "empty: list at least one key")
		}
	}
	if v, ok := m["algorithms"]; ok {
		algs, nodes, _ := d.list(v)
		for i, a := range algs {
			if !slices.Contains(knownAlgorithms, a) {
				d.errorf(nodes[i], fmt.Sprintf("%s[%d]", v.path, i), "%q is not a JWT algorithm this gateway verifies (%s); \"none\" never is",
					a, strings.Join(knownAlgorithms, ", "))
				continue
			}
			usable := false
			for _, k := range c.Keys {
				usable = usable || slices.Contains(algorithmsFor(k.Key), a)
			}
			if !usable && len(c.Keys) > 0 {
				d.errorf(nodes[i], fmt.Sprintf("%s[%d]", v.path, i), "no key listed verifies %s", a)
			}
			c.Algorithms = append(c.Algorithms, a)
		}
	} else {
		for _, k := range c.Keys {
			for _, a := range algorithmsFor(k.Key) {
				if !slices.Contains(c.Algorithms, a) {
					c.Algorithms = append(c.Algorithms, a)
				}
			}
		}
	}
	return c
}

// readPublicKey reads a PEM public key (PUBLIC KEY, RSA PUBLIC KEY) or
// certificate (its key) from a file.
func readPublicKey(name string) (any, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s holds no PEM block", name)
	}
	var key any
	switch block.Type {
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			key = cert.PublicKey
		}
	default:
		return nil, fmt.Errorf("%s: a %q PEM block; want a public key (PUBLIC KEY, RSA PUBLIC KEY) or a CERTIFICATE, never a private key", name, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if algorithmsFor(key) == nil {
		return nil, fmt.Errorf("%s: a %T key verifies no JWT algorithm", name, key)
	}
	return key, nil
}

// claimsKey is the context key of the verified claims (jwt.MapClaims).
type claimsKey struct{}

// verifier checks the JWT of a request and puts its claims in the context.
type verifier struct {
	cfg    *JWTConfig
	parser *jwt.Parser
	header string
}

func newVerifier(cfg *JWTConfig) *verifier {
	// JSON numbers as json.Number: a float64 would name two callers whose
	// ids differ beyond its 53 bits (64-bit ids) as one (claimTenant).
	opts := []jwt.ParserOption{jwt.WithValidMethods(cfg.Algorithms), jwt.WithExpirationRequired(), jwt.WithLeeway(cfg.Leeway),
		jwt.WithJSONNumber()}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	return &verifier{cfg: cfg, parser: jwt.NewParser(opts...), header: textproto.CanonicalMIMEHeaderKey(cfg.Header)}
}

// errNoToken: the request carries no bearer token.
var errNoToken = errors.New("no bearer token")

// verify returns the claims of r's token, verified.
func (v *verifier) verify(r *http.Request) (jwt.MapClaims, error) {
	h := r.Header.Get(v.header)
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return nil, errNoToken
	}
	claims := jwt.MapClaims{}
	_, err := v.parser.ParseWithClaims(strings.TrimSpace(token), claims, v.keyFunc)
	if err != nil {
		return nil, err
	}
	return claims, nil
}

// keyFunc picks the keys that may have signed t: those with its kid when
// it names one the configuration knows, and whose type its algorithm uses.
func (v *verifier) keyFunc(t *jwt.Token) (any, error) {
	alg, _ := t.Header["alg"].(string)
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	byID := false
	if kid != "" {
		for _, k := range v.cfg.Keys {
			if k.ID == kid && slices.Contains(algorithmsFor(k.Key), alg) {
				set.Keys = append(set.Keys, k.Key)
				byID = true
			}
		}
	}
	if !byID {
		for _, k := range v.cfg.Keys {
			if (k.ID == "" || kid == "") && slices.Contains(algorithmsFor(k.Key), alg) {
				set.Keys = append(set.Keys, k.Key)
			}
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no configured key verifies alg %q kid %q", alg, kid)
	}
	return set, nil
}

// middleware verifies the request's token, if any, and stores its claims
// for the route's Tenant func. A request without a valid token goes on
// without claims: a guarded method then gets 401 from httpx (the caller is
// unknown), and other methods reach the upstream, which authenticates
// them itself. The token is never logged nor used as the caller's name.
func (v *verifier) middleware(log func(r *http.Request, err error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claims, err := v.verify(r)
			if err != nil {
				if !errors.Is(err, errNoToken) && log != nil {
					log(r, err)
				}
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, claims)))
		})
	}
}

// claimTenant names the caller by claim of the verified token, with its
// issuer: a value is unique only within its issuer.
func claimTenant(claim string) func(jwt.MapClaims) string {
	return func(c jwt.MapClaims) string {
		var val string
		switch x := c[claim].(type) {
		case string:
			val = x
		case float64:
			val = strconv.FormatFloat(x, 'f', -1, 64)
		case json.Number:
			// An integer by its digits, exactly; other numbers as before
			// (a float64's shortest form: 42.0 names "42").
			val = x.String()
			if !isDigits(strings.TrimPrefix(val, "-")) {
				if f, err := x.Float64(); err == nil {
					val = strconv.FormatFloat(f, 'f', -1, 64)
				}
			}
		}
		if val == "" {
			return ""
		}
		iss, _ := c["iss"].(string)
		return strconv.Quote(iss) + " " + strconv.Quote(val)
	}
}

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
