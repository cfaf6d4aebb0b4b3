package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/httpcore"
	"github.com/idemguard/idemguard/inventory"
)

// Defaults of the configuration (README.md, "Run it in front of any service").
const (
	DefaultListen            = ":8080"
	DefaultConnectTimeout    = 5 * time.Second
	DefaultIdleConnTimeout   = 4 * time.Second
	DefaultMaxIdleConns      = 128
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultClientBodyTimeout = 60 * time.Second // nginx's client_body_timeout
	DefaultTimeout           = 30 * time.Second
	DefaultForwardKeyHeader  = "Idempotency-Key"
	DefaultMaxBody           = httpx.DefaultMaxBody
	DefaultMaxStoredResponse = httpx.DefaultMaxStoredResponse
)

// minStoredResponse is the least max_stored_response: the gateway's own
// stored answers (the upstream-outcome-unknown problem, with a key of up
// to guard.MaxIDLen bytes and the transport's error cut to maxErrText)
// must fit in it, or their retries would get httpx's response-not-kept
// problem instead (problem_size_test.go).
const minStoredResponse = 4 << 10

// UnknownOutcome is what a route does when a request may have reached the
// upstream and no complete answer came back (see the package doc).
type UnknownOutcome string

// The choices for UnknownOutcome.
const (
	// Answer stores a 500 upstream-outcome-unknown problem as the key's
	// result: every retry gets it, and the request is never sent to
	// the upstream again. The default: right for an upstream that knows
	// nothing of idempotency.
	Answer UnknownOutcome = "answer"
	// Resend releases the key (its record keeps the note that it was
	// forwarded) and answers 502 with Retry-After; the retry sends the
	// request again with the same forwarded idempotency key. Only for an
	// upstream that deduplicates on that key.
	Resend UnknownOutcome = "resend"
)

// Config is what the gateway runs, as Load read and checked it. Every
// field is set (defaults filled in).
type Config struct {
	File string // the file it was read from

	Listen      string // address the proxy serves on
	AdminListen string // address of /healthz, /readyz, /metrics; "" = on Listen
	Upstream    *url.URL

	ConnectTimeout  time.Duration // dialling the upstream
	IdleConnTimeout time.Duration // an idle upstream connection is closed after it
	MaxIdleConns    int           // idle upstream connections kept per host; 0: none, each request dials
	ShutdownTimeout time.Duration // in-flight requests get this long to finish
	// ClientBodyTimeout bounds the wait for each read of a request body
	// (between two reads, as nginx's client_body_timeout): a client
	// that sends nothing for that long is cut off (bodytimeout.go).
	ClientBodyTimeout time.Duration
	// ForwardKeyHeader carries the key derived for the upstream
	// (Lease.KeyFor) on every guarded request; "" sends none.
	ForwardKeyHeader string
	// XForwarded is "set" (X-Forwarded-For/-Host/-Proto name this hop's
	// client, the default; a client's Forwarded is not passed on),
	// "append" (keep the chain of a trusted proxy in front: its
	// X-Forwarded-For, to which this hop's client is added, and its
	// Forwarded) or "off" (pass the client's fields, Forwarded too,
	// untouched).
	XForwarded string

	Redis    RedisConfig
	Fallback FallbackConfig
	JWT      *JWTConfig // nil: no route names its caller by a JWT
	Log      LogConfig
	Routes   []Route
}

// RedisConfig says how to reach Redis.
type RedisConfig struct {
	Mode             string // "standalone", "sentinel" or "cluster"
	Addrs            []string
	MasterName       string // sentinel
	Username         string
	Password         string // read from the variable password_env names
	SentinelPassword string // read from sentinel_password_env
	DB               int
	TLS              bool
	Prefix           string
	PoolSize         int
	AcceptEviction   bool
}

// FallbackConfig selects the fallback policy (package fallback).
type FallbackConfig struct {
	Policy         string // "none", "fail-closed", "fail-open" or "secondary"
	PostgresDSN    string // secondary: read from postgres_env
	Schema         string
	Timeout        time.Duration
	OpenTimeout    time.Duration
	FailuresToOpen uint32
}

// LogConfig is the structured log's shape.
type LogConfig struct {
	Level  slog.Level
	Format string // "json" or "text"
	Keys   bool   // log idempotency keys in full (default: a digest)
}

// Route is one guarded route.
type Route struct {
	Line     int    // where the route starts in the file
	Pattern  string // a ServeMux pattern
	Methods  []string
	Upstream *url.URL // the upstream of this route

	Required          inventory.Requirement // RequireHard or RequireSoft
	Key               KeySpec
	Caller            CallerSpec
	TTL               time.Duration
	Lease             time.Duration
	Wait              time.Duration
	Timeout           time.Duration
	MaxBody           int64
	MaxStoredResponse int
	UnknownOutcome    UnknownOutcome
}

// KeySpec says where a route's key comes from: exactly one of Header,
// Body and Computed.
type KeySpec struct {
	Header          string
	Body            string // a JSON pointer
	Computed        bool
	ComputedHeaders []string
}

// CallerSpec says how a route names the caller: exactly one of Header,
// JWT and Single.
type CallerSpec struct {
	Header string // a header set by the authentication layer in front
	JWT    string // "sub" (issuer and subject) or another claim of the verified JWT
	Single bool
	Scope  inventory.Scope
}

// Load reads and checks the configuration in path (YAML, or JSON, which
// YAML reads too). Every mistake is reported, each with its line and the
// field: the error is a *ConfigError.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse is Load on data read from path: the errors name path's file, and
// relative paths in it (JWT key files) start in path's directory.
func Parse(path string, data []byte) (*Config, error) {
	name := filepath.Base(path)
	d := &decoder{file: name, dir: filepath.Dir(path)}
	syntax := func(err error) error {
		return &ConfigError{Errs: []*FieldError{{File: name, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}}}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntax(err)
	}
	if len(doc.Content) == 0 {
		return nil, &ConfigError{Errs: []*FieldError{{File: name, Msg: errNoDocument.Error()}}}
	}
	// One document: yaml.v3 reads the first and would drop the others
	// (their routes left unguarded) without a word.
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, syntax(err)
		}
		if len(more.Content) > 0 && !emptyDocument(more.Content[0]) {
			d.errorf(more.Content[0], "", "a second YAML document (after ---): the configuration is one document, and the gateway would ignore this one; merge it into the first")
			break
		}
	}
	c := d.config(doc.Content[0])
	if err := d.err(); err != nil {
		return nil, err
	}
	c.File = name
	return c, nil
}

// emptyDocument reports whether n is the content of a document with
// nothing in it (a trailing ---).
func emptyDocument(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == ""
}

var topFields = []string{"listen", "admin_listen", "upstream", "connect_timeout", "idle_conn_timeout",
	"max_idle_conns", "shutdown_timeout", "client_body_timeout", "forward_key_header", "x_forwarded", "redis", "fallback",
	"jwt", "log", "defaults", "routes"}

var routeFields = []string{"pattern", "methods", "upstream", "requirement", "key", "caller", "ttl", "lease",
	"wait", "timeout", "max_body", "max_stored_response", "unknown_outcome"}

// defaultsFields are the route fields a defaults section may set.
var defaultsFields = routeFields[3:]

func (d *decoder) config(root *yaml.Node) *Config {
	c := &Config{
		Listen: DefaultListen, ConnectTimeout: DefaultConnectTimeout, IdleConnTimeout: DefaultIdleConnTimeout,
		MaxIdleConns: DefaultMaxIdleConns, ShutdownTimeout: DefaultShutdownTimeout, ClientBodyTimeout: DefaultClientBodyTimeout,
		ForwardKeyHeader: DefaultForwardKeyHeader, XForwarded: "set",
		Log: LogConfig{Level: slog.LevelInfo, Format: "json"},
	}
	f := d.mapping(root, "", topFields...)
	if v, ok := f["listen"]; ok {
		c.Listen, _ = d.addr(v)
	}
	if v, ok := f["admin_listen"]; ok {
		c.AdminListen, _ = d.addr(v)
	}
	if v, ok := f["upstream"]; ok {
		c.Upstream = d.upstream(v)
	} else {
		d.errorf(root, "upstream", "missing: the URL of the service the gateway forwards to (e.g. http://127.0.0.1:9000)")
	}
	if v, ok := f["connect_timeout"]; ok {
		c.ConnectTimeout, _ = d.duration(v, time.Millisecond, time.Hour)
	}
	if v, ok := f["idle_conn_timeout"]; ok {
		c.IdleConnTimeout, _ = d.duration(v, time.Millisecond, time.Hour)
	}
	if v, ok := f["max_idle_conns"]; ok {
		n, _ := d.integer(v, 0, 100000)
		c.MaxIdleConns = int(n)
	}
	if v, ok := f["shutdown_timeout"]; ok {
		c.ShutdownTimeout, _ = d.duration(v, 0, time.Hour)
	}
	if v, ok := f["client_body_timeout"]; ok {
		c.ClientBodyTimeout, _ = d.duration(v, time.Millisecond, time.Hour)
	}
	if v, ok := f["forward_key_header"]; ok {
		if s, ok := d.scalar(v); ok {
			c.ForwardKeyHeader = d.headerName(v, s, true)
			if ownedFields[textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(c.ForwardKeyHeader, "_", "-"))] {
				// The gateway sets the derived key in this field of every
				// request it forwards, over what the client sent.
				d.errorf(v.val, "forward_key_header", "%s carries the request itself (its framing, its caller's credentials): "+
					"name a field of its own for the derived key (the default, %s)", c.ForwardKeyHeader, DefaultForwardKeyHeader)
			}
		}
	}
	if v, ok := f["x_forwarded"]; ok {
		c.XForwarded, _ = d.enum(v, "set", "append", "off")
	}
	if v, ok := f["redis"]; ok {
		c.Redis = d.redis(v)
	} else {
		d.errorf(root, "redis", "missing: where the idempotency records are kept (redis: {addrs: [127.0.0.1:6379]})")
	}
	c.Fallback = FallbackConfig{Policy: "fail-closed"}
	if v, ok := f["fallback"]; ok {
		c.Fallback = d.fallback(v)
	}
	if v, ok := f["jwt"]; ok {
		c.JWT = d.jwt(v)
		if h, k := c.JWT.Header, c.ForwardKeyHeader; h != "" && k != "" && (sameField(h, k) || sameField(k, h)) {
			node := v.val
			if kv, ok := f["forward_key_header"]; ok {
				node = kv.val
			}
			d.errorf(node, "forward_key_header", "%s is also jwt.header: the upstream would get the derived key "+
				"where the caller's token was", k)
		}
	}
	if v, ok := f["log"]; ok {
		c.Log = d.logConfig(v)
	}
	tmpl := routeTemplate{src: map[string]*yaml.Node{}}
	tmpl.r = Route{Required: inventory.RequireHard, Key: KeySpec{Header: httpx.DefaultHeader},
		TTL: guard.DefaultTTL, Lease: guard.DefaultLease, Timeout: DefaultTimeout,
		MaxBody: DefaultMaxBody, MaxStoredResponse: DefaultMaxStoredResponse, UnknownOutcome: Answer}
	if v, ok := f["defaults"]; ok {
		d.routeFields(&tmpl, d.mapping(v.val, "defaults", defaultsFields...))
	}
	v, ok := f["routes"]
	if !ok {
		d.errorf(root, "routes", "missing: the routes to guard (routes: [{pattern: \"POST /orders\", ...}])")
		return c
	}
	n := resolve(v.val)
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "routes", "want a list of routes, got %s", kindName(n))
		return c
	}
	if len(n.Content) == 0 {
		d.errorf(n, "routes", "empty: list at least one route to guard")
	}
	for i, item := range n.Content {
		path := fmt.Sprintf("routes[%d]", i)
		rt := tmpl.clone()
		rt.r.Line = item.Line
		rf := d.mapping(item, path, routeFields...)
		d.routeFields(&rt, rf)
		if pf, ok := rf["pattern"]; ok {
			rt.r.Pattern, _ = d.str(pf)
			rt.src["pattern"] = pf.val
		} else {
			d.errorf(item, path+".pattern", "missing: the ServeMux pattern of the route (e.g. \"POST /orders\")")
		}
		if uf, ok := rf["upstream"]; ok {
			rt.r.Upstream = d.upstream(uf)
		} else {
			rt.r.Upstream = c.Upstream
		}
		var methodNodes []*yaml.Node
		if mf, ok := rf["methods"]; ok {
			rt.r.Methods, methodNodes, _ = d.list(mf)
			rt.src["methods"] = mf.val
		}
		d.checkRoute(&rt, path, item, methodNodes, c.JWT != nil)
		// Compared as the gateway clears the field before it sets the
		// key: in any spelling, "_" for "-" (sameField).
		if h := rt.r.Caller.Header; h != "" && c.ForwardKeyHeader != "" && (sameField(h, c.ForwardKeyHeader) || sameField(c.ForwardKeyHeader, h)) {
			d.errorf(rt.src["caller"], path+".caller.header", "%s is also forward_key_header: the upstream would read the derived key "+
				"where it reads the caller", h)
		}
		if rt.r.UnknownOutcome == Resend && c.ForwardKeyHeader == "" {
			// A resend is safe only because the upstream deduplicates on
			// the derived key; without it, it would run the effect again.
			node := rt.src["unknown_outcome"]
			d.errorf(node, path+".unknown_outcome", "resend needs the derived key sent to the upstream, which deduplicates on it; "+
				"forward_key_header is empty (set it, or use answer)")
		}
		c.Routes = append(c.Routes, rt.r)
	}
	d.checkPatterns(c, n)
	d.checkHostScopes(c, n)
	return c
}

// routeTemplate is a route being read, with the node each field was set at
// (in defaults or in the route), for the errors of checks that span fields.
type routeTemplate struct {
	r   Route
	src map[string]*yaml.Node
}

func (t routeTemplate) clone() routeTemplate {
	c := routeTemplate{r: t.r, src: make(map[string]*yaml.Node, len(t.src))}
	for k, v := range t.src {
		c.src[k] = v
	}
	c.r.Key.ComputedHeaders = slices.Clone(t.r.Key.ComputedHeaders)
	return c
}

// routeFields reads the fields a route and defaults share into t.
func (d *decoder) routeFields(t *routeTemplate, f map[string]field) {
	r := &t.r
	if v, ok := f["requirement"]; ok {
		if s, ok := d.enum(v, "hard", "soft"); ok {
			r.Required = inventory.Requirement(s)
			t.src["requirement"] = v.val
		}
	}
	if v, ok := f["key"]; ok {
		r.Key = d.key(v)
		t.src["key"] = v.val
	}
	if v, ok := f["caller"]; ok {
		r.Caller = d.caller(v)
		t.src["caller"] = v.val
	}
	if v, ok := f["ttl"]; ok {
		r.TTL, _ = d.duration(v, time.Second, 366*24*time.Hour)
		t.src["ttl"] = v.val
	}
	if v, ok := f["lease"]; ok {
		r.Lease, _ = d.duration(v, time.Second, 24*time.Hour)
		t.src["lease"] = v.val
	}
	if v, ok := f["wait"]; ok {
		r.Wait, _ = d.duration(v, 0, time.Hour)
	}
	if v, ok := f["timeout"]; ok {
		r.Timeout, _ = d.duration(v, time.Millisecond, 24*time.Hour)
		t.src["timeout"] = v.val
	}
	if v, ok := f["max_body"]; ok {
		r.MaxBody, _ = d.size(v, 1, 1<<30)
	}
	if v, ok := f["max_stored_response"]; ok {
		n, ok := d.size(v, 1, 1<<30)
		if ok && n < minStoredResponse {
			// The gateway's own answers go through the same limit, and
			// one larger than it is not kept: a retry would get "not
			// kept" for the outcome-unknown problem it is promised.
			d.errorf(v.val, v.path, "%d bytes is less than the gateway's own answers need (%d): the upstream-outcome-unknown "+
				"problem every retry is to get is kept under this limit; raise it to at least %dKiB", n, minStoredResponse, minStoredResponse>>10)
			n = 0
		}
		r.MaxStoredResponse = int(n)
	}
	if v, ok := f["unknown_outcome"]; ok {
		if s, ok := d.enum(v, string(Answer), string(Resend)); ok {
			r.UnknownOutcome = UnknownOutcome(s)
			t.src["unknown_outcome"] = v.val
		}
	}
}

func (d *decoder) key(f field) KeySpec {
	m := d.mapping(f.val, f.path, "header", "body", "computed", "headers")
	var k KeySpec
	n := 0
	if v, ok := m["header"]; ok {
		n++
		if s, ok := d.str(v); ok {
			k.Header = d.headerName(v, s, false)
		}
	}
	if v, ok := m["body"]; ok {
		n++
		if s, ok := d.str(v); ok {
			if err := checkPointer(s); err != nil {
				d.errorf(v.val, v.path, "%v", err)
			}
			k.Body = s
		}
	}
	if v, ok := m["computed"]; ok {
		n++
		if b, ok := d.boolean(v); ok && !b {
			d.errorf(v.val, v.path, "computed: false chooses no key source; choose header, body or computed: true")
		}
		k.Computed = true
	}
	if v, ok := m["headers"]; ok {
		if _, ok := m["computed"]; !ok {
			d.errorf(v.key, v.path, "headers belongs to a computed key (computed: true)")
		}
		names, nodes, _ := d.list(v)
		for i, s := range names {
			k.ComputedHeaders = append(k.ComputedHeaders,
				d.headerName(field{val: nodes[i], path: fmt.Sprintf("%s[%d]", v.path, i)}, s, false))
		}
	}
	if n != 1 && resolve(f.val).Kind == yaml.MappingNode {
		d.errorf(f.val, f.path, "choose exactly one key source: header (a header name), body (a JSON pointer) or computed: true")
	}
	return k
}

func (d *decoder) caller(f field) CallerSpec {
	m := d.mapping(f.val, f.path, "header", "jwt", "single", "scope")
	var c CallerSpec
	n := 0
	if v, ok := m["header"]; ok {
		n++
		if s, ok := d.str(v); ok {
			c.Header = d.headerName(v, s, false)
		}
		c.Scope = inventory.ScopeTenant
	}
	if v, ok := m["jwt"]; ok {
		n++
		if s, ok := d.str(v); ok {
			c.JWT = s
		}
		c.Scope = inventory.ScopeTenant
		if c.JWT == "sub" {
			c.Scope = inventory.ScopeUser
		}
	}
	if v, ok := m["single"]; ok {
		n++
		if b, ok := d.boolean(v); ok && !b {
			d.errorf(v.val, v.path, "single: false names no caller; choose header, jwt or single: true")
		}
		c.Single = true
		c.Scope = inventory.ScopeGlobal
	}
	if n != 1 && resolve(f.val).Kind == yaml.MappingNode {
		d.errorf(f.val, f.path, "choose exactly one way to name the caller: header (set by the authentication layer in front), "+
			"jwt (a claim of the verified token: sub, or another claim) or single: true (one caller owns every key)")
	}
	if v, ok := m["scope"]; ok {
		s, ok := d.enum(v, "tenant", "user")
		switch {
		case !ok:
		case c.Single:
			d.errorf(v.val, v.path, "a single caller's keys are global; scope applies to header and jwt callers")
		default:
			c.Scope = inventory.Scope(s)
		}
	}
	return c
}

// checkRoute checks what spans a route's fields.
func (d *decoder) checkRoute(t *routeTemplate, path string, item *yaml.Node, methodNodes []*yaml.Node, haveJWT bool) {
	r := &t.r
	at := func(name string) *yaml.Node {
		if n := t.src[name]; n != nil {
			return n
		}
		return item
	}
	if r.Pattern != "" {
		method, rest, err := splitPattern(r.Pattern)
		host, _, _ := strings.Cut(rest, "/")
		switch {
		case err != nil:
			d.errorf(at("pattern"), path+".pattern", "%v", err)
			r.Pattern = "" // reported; not checked again against the others
		case neverMatches(host):
			// ServeMux matches a request's host without its port, and the
			// gateway loosens it (no trailing dot): such a route would
			// never match, and its requests would pass through unguarded.
			d.errorf(at("pattern"), path+".pattern", "the host %q never matches: requests' hosts are matched without a port or a trailing dot", host)
			r.Pattern = ""
		case method != "" && len(r.Methods) > 0 && (len(r.Methods) != 1 || r.Methods[0] != method):
			d.errorf(at("methods"), path+".methods", "the pattern %q serves %s only; drop methods or the pattern's method", r.Pattern, method)
		case method != "" && len(r.Methods) == 0:
			r.Methods = []string{method}
		case len(r.Methods) == 0:
			r.Methods = []string{http.MethodPost, http.MethodPatch}
		}
	}
	for i, m := range r.Methods {
		// methods' own entry, or the pattern the method was taken from.
		node, field := at("pattern"), path+".pattern"
		if i < len(methodNodes) {
			node, field = methodNodes[i], fmt.Sprintf("%s.methods[%d]", path, i)
		}
		if !validMethod(m) {
			d.errorf(node, field, "%q is not an HTTP method (upper case, e.g. POST)", m)
		} else if m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace {
			d.errorf(node, field, "%s is a safe method: it is passed through, never guarded", m)
		}
	}
	c := r.Caller
	switch {
	case c.Header == "" && c.JWT == "" && !c.Single:
		if t.src["caller"] == nil {
			d.errorf(item, path+".caller", "missing: name the caller (here or in defaults): header (set by the authentication layer in front), "+
				"jwt (a claim of the verified token) or single: true; keys are kept per caller")
		}
	case c.JWT != "" && !haveJWT:
		d.errorf(at("caller"), path+".caller.jwt", "needs the jwt section (the keys that verify the token)")
	}
	// The answer must be kept for as long as one attempt may hold the key
	// (timeout, and lease for a gateway that died holding it): a client's
	// retry comes after its own attempt gave up, and one that finds the
	// key forgotten is forwarded again.
	for _, o := range []struct {
		name string
		d    time.Duration
	}{{"lease", r.Lease}, {"timeout", r.Timeout}} {
		if r.TTL == 0 || r.TTL >= o.d { // 0: ttl did not read, reported
			continue
		}
		where := "the default"
		if n := t.src[o.name]; n != nil {
			where = fmt.Sprintf("line %d", n.Line)
		}
		d.errorf(at("ttl"), path+".ttl", "%v is shorter than the %s (%v, %s): an answer must be kept at least as long as "+
			"one attempt may hold its key, or a client's retry after a slow or lost attempt finds the key forgotten and is "+
			"forwarded again; raise ttl or lower %s", r.TTL, o.name, o.d, where, o.name)
		break
	}
	if r.Key.Computed && r.Required == inventory.RequireSoft {
		d.errorf(at("requirement"), path+".requirement", "soft has no meaning with a computed key (every request gets one); use hard")
	}
}

// checkPatterns registers every route on a ServeMux, as the gateway will,
// and reports patterns it refuses or that conflict.
func (d *decoder) checkPatterns(c *Config, routes *yaml.Node) {
	mux, loose := http.NewServeMux(), http.NewServeMux()
	type seen struct {
		pattern string
		line    int
		index   int
	}
	var ok []seen
	for i, r := range c.Routes {
		if r.Pattern == "" {
			continue
		}
		node := routes.Content[i]
		for j := 0; j+1 < len(node.Content); j += 2 {
			if node.Content[j].Value == "pattern" {
				node = node.Content[j+1]
				break
			}
		}
		if msg := tryHandle(mux, r.Pattern); msg != "" {
			other := ""
			for _, s := range ok {
				m := http.NewServeMux()
				tryHandle(m, s.pattern)
				if tryHandle(m, r.Pattern) != "" {
					other = fmt.Sprintf(" (routes[%d], line %d)", s.index, s.line)
					break
				}
			}
			if other != "" {
				d.errorf(node, fmt.Sprintf("routes[%d].pattern", i), "%q conflicts with an earlier route%s: two routes would match the same requests", r.Pattern, other)
			} else {
				d.errorf(node, fmt.Sprintf("routes[%d].pattern", i), "%s", msg)
			}
			continue
		}
		// Variants (variants.go): two routes whose patterns loosen alike
		// would both own the requests of either.
		if tryHandle(loose, loosePattern(r.Pattern)) != "" {
			other := ""
			for _, s := range ok {
				m := http.NewServeMux()
				tryHandle(m, loosePattern(s.pattern))
				if tryHandle(m, loosePattern(r.Pattern)) != "" {
					other = fmt.Sprintf(" %q (routes[%d], line %d)", s.pattern, s.index, s.line)
					break
				}
			}
			d.errorf(node, fmt.Sprintf("routes[%d].pattern", i), "%q and an earlier route%s differ only in case, a trailing slash or ;parameters: "+
				"the gateway guards such path variants by the route they loosen to, and a request would belong to both", r.Pattern, other)
			continue
		}
		ok = append(ok, seen{r.Pattern, node.Line, i})
	}
}

// tryHandle registers pattern on mux (for h, or a handler that answers
// 404) and returns ServeMux's complaint, or "".
func tryHandle(mux *http.ServeMux, pattern string, h ...http.Handler) (msg string) {
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprint(p)
			if i := strings.Index(msg, " (registered at "); i >= 0 {
				msg = msg[:i]
			}
		}
	}()
	var handler http.Handler = http.NotFoundHandler()
	if len(h) > 0 {
		handler = h[0]
	}
	mux.Handle(pattern, handler)
	return ""
}

// splitPattern returns a ServeMux pattern's method ("" when none) and the
// rest, after checking that ServeMux takes it.
func splitPattern(p string) (method, rest string, err error) {
	if msg := tryHandle(http.NewServeMux(), p); msg != "" {
		return "", "", fmt.Errorf("not a ServeMux pattern: %s", strings.TrimPrefix(msg, "http: "))
	}
	p = strings.TrimLeft(p, " \t")
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		return p[:i], strings.TrimLeft(p[i:], " \t"), nil
	}
	return "", p, nil
}

// neverMatches reports whether a pattern's host is one no request's host
// is matched as: with a trailing dot, or with a port (host:port, or
// [ipv6]:port; an IPv6 literal alone, ::1, has colons of its own).
func neverMatches(host string) bool {
	return strings.HasSuffix(host, ".") || strings.Contains(host, "]:") ||
		!strings.HasPrefix(host, "[") && strings.Count(host, ":") == 1
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// headerName checks a header field name and returns it canonical. "" is
// allowed only when empty is true.
func (d *decoder) headerName(f field, s string, empty bool) string {
	s = strings.TrimSpace(s)
	if s == "" && empty {
		return ""
	}
	for _, c := range []byte(s) {
		if !isTokenChar(c) {
			d.errorf(f.val, f.path, "%q is not a header field name", s)
			return ""
		}
	}
	if s == "" {
		d.errorf(f.val, f.path, "empty")
	}
	return textproto.CanonicalMIMEHeaderKey(s)
}

// ownedFields are the request fields forward_key_header may not name:
// the message's framing and the caller's credentials, which the upstream
// must get as the client sent them.
var ownedFields = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Content-Encoding": true, "Transfer-Encoding": true,
	"Connection": true, "Te": true, "Trailer": true, "Upgrade": true, "Expect": true,
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true,
}

func isTokenChar(c byte) bool {
	return c > ' ' && c < 0x7f && !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, rune(c))
}

// checkPointer checks an RFC 6901 JSON pointer as httpx.KeyFromBody does.
func checkPointer(p string) error {
	_, err := httpcore.ParseKeyFromBody(p)
	return err
}

func (d *decoder) addr(f field) (string, bool) {
	s, ok := d.str(f)
	if !ok {
		return "", false
	}
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		d.errorf(f.val, f.path, "want host:port (\":8080\", \"127.0.0.1:8080\"), got %q", s)
		return "", false
	}
	return s, true
}

func (d *decoder) upstream(f field) *url.URL {
	s, ok := d.str(f)
	if !ok {
		return nil
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		d.errorf(f.val, f.path, "not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		d.errorf(f.val, f.path, "want an http:// or https:// URL, got %q", s)
	case u.Host == "":
		d.errorf(f.val, f.path, "%q names no host", s)
	case u.User != nil:
		d.errorf(f.val, f.path, "credentials in the upstream URL are not supported")
	case u.RawQuery != "" || u.Fragment != "":
		d.errorf(f.val, f.path, "the upstream URL may have a path prefix but no query or fragment")
	default:
		return u
	}
	return nil
}

func (d *decoder) env(f field) string {
	name, ok := d.str(f)
	if !ok {
		return ""
	}
	v := os.Getenv(name)
	if v == "" {
		d.errorf(f.val, f.path, "the environment variable %s is not set", name)
	}
	return v
}

func (d *decoder) redis(f field) RedisConfig {
	m := d.mapping(f.val, f.path, "addrs", "mode", "master_name", "username", "password_env",
		"sentinel_password_env", "db", "tls", "prefix", "pool_size", "accept_eviction")
	r := RedisConfig{Prefix: guard.DefaultPrefix}
	v, ok := m["addrs"]
	if !ok {
		d.errorf(f.val, f.path+".addrs", "missing: the Redis addresses (host:port; a Sentinel's or a Cluster's nodes)")
	} else {
		addrs, nodes, _ := d.list(v)
		for i, a := range addrs {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				d.errorf(nodes[i], fmt.Sprintf("%s[%d]", v.path, i), "want host:port, got %q", a)
			}
		}
		r.Addrs = addrs
	}
	r.Mode = "standalone"
	if mv, ok := m["mode"]; ok {
		r.Mode, _ = d.enum(mv, "standalone", "sentinel", "cluster")
		if r.Mode == "standalone" && len(r.Addrs) > 1 {
			d.errorf(v.val, v.path, "a standalone server has one address; for several set mode: cluster or sentinel")
		}
	} else if len(r.Addrs) > 1 {
		d.errorf(v.val, v.path, "%d addresses: set mode (cluster or sentinel) to say what they are", len(r.Addrs))
	}
	if mv, ok := m["master_name"]; ok {
		r.MasterName, _ = d.str(mv)
		if r.Mode != "sentinel" {
			d.errorf(mv.key, mv.path, "belongs to mode: sentinel")
		}
	} else if r.Mode == "sentinel" {
		d.errorf(f.val, f.path+".master_name", "missing: the name of the master the Sentinels watch")
	}
	if mv, ok := m["username"]; ok {
		r.Username, _ = d.str(mv)
	}
	if mv, ok := m["password_env"]; ok {
		r.Password = d.env(mv)
	}
	if mv, ok := m["sentinel_password_env"]; ok {
		r.SentinelPassword = d.env(mv)
	}
	if mv, ok := m["db"]; ok {
		n, _ := d.integer(mv, 0, 15)
		r.DB = int(n)
		if n != 0 && r.Mode == "cluster" {
			d.errorf(mv.val, mv.path, "a Cluster has database 0 only")
		}
	}
	if mv, ok := m["tls"]; ok {
		r.TLS, _ = d.boolean(mv)
	}
	if mv, ok := m["prefix"]; ok {
		r.Prefix, _ = d.str(mv)
	}
	if mv, ok := m["pool_size"]; ok {
		n, _ := d.integer(mv, 0, 10000)
		r.PoolSize = int(n)
	}
	if mv, ok := m["accept_eviction"]; ok {
		r.AcceptEviction, _ = d.boolean(mv)
	}
	return r
}

func (d *decoder) fallback(f field) FallbackConfig {
	m := d.mapping(f.val, f.path, "policy", "postgres_env", "schema", "timeout", "open_timeout", "failures_to_open")
	c := FallbackConfig{Policy: "fail-closed"}
	if v, ok := m["policy"]; ok {
		c.Policy, _ = d.enum(v, "none", "fail-closed", "fail-open", "secondary")
	}
	if v, ok := m["postgres_env"]; ok {
		c.PostgresDSN = d.env(v)
		if c.Policy != "secondary" {
			d.errorf(v.key, v.path, "belongs to policy: secondary")
		}
	} else if c.Policy == "secondary" {
		d.errorf(f.val, f.path+".postgres_env", "missing: policy secondary keeps keys in PostgreSQL; name the variable holding its URL")
	}
	if v, ok := m["schema"]; ok {
		c.Schema, _ = d.str(v)
		if c.Policy != "secondary" {
			d.errorf(v.key, v.path, "belongs to policy: secondary")
		}
	}
	// The breaker's settings: a value the policy would not read is refused
	// rather than ignored, so an operator who meant to bound Redis's calls
	// hears that nothing does.
	breaker := func(v field) {
		if c.Policy == "none" {
			d.errorf(v.key, v.path, "has no effect under policy: none (it sets the breaker of the other policies)")
		}
	}
	if v, ok := m["timeout"]; ok {
		c.Timeout, _ = d.duration(v, time.Millisecond, time.Minute)
		breaker(v)
	}
	if v, ok := m["open_timeout"]; ok {
		c.OpenTimeout, _ = d.duration(v, time.Millisecond, time.Hour)
		breaker(v)
	}
	if v, ok := m["failures_to_open"]; ok {
		n, _ := d.integer(v, 1, 1000)
		c.FailuresToOpen = uint32(n)
		breaker(v)
	}
	return c
}

func (d *decoder) logConfig(f field) LogConfig {
	m := d.mapping(f.val, f.path, "level", "format", "keys")
	c := LogConfig{Level: slog.LevelInfo, Format: "json"}
	if v, ok := m["level"]; ok {
		if s, ok := d.enum(v, "debug", "info", "warn", "error"); ok {
			_ = c.Level.UnmarshalText([]byte(s))
		}
	}
	if v, ok := m["format"]; ok {
		c.Format, _ = d.enum(v, "json", "text")
	}
	if v, ok := m["keys"]; ok {
		c.Keys, _ = d.boolean(v)
	}
	return c
}
