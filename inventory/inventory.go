// Package inventory lists what a service deduplicates: every HTTP route
// and every message consumer, with whether it requires an idempotency key,
// where the key comes from, whose keys it keeps apart and for how long.
// Unsafe routes without a guard are flagged as gaps.
//
// The inventory is built from what is registered, never written by hand:
//
//   - HTTP routes come from the router. httpx.Guard's handlers expose the
//     policy they enforce (the Guarded interface), so a walk over a router
//     finds it on each route: the chiwalk and muxwalk subpackages walk chi
//     and gorilla/mux routers; routes of an http.ServeMux are listed when
//     registered through ServeMux, a thin wrapper. A route without a guard
//     is listed too, as a gap when its method is unsafe.
//   - Consumers record themselves: a consumerx.Processor (and so every
//     consumerx adapter) made with consumerx.Options.Inventory adds its
//     group when it is created.
//
// The result is a table (WriteMarkdown), JSON (MarshalJSON) and an
// http.Handler for a debug endpoint (Handler). The package imports only the
// standard library.
//
// # Finding a guard on a route
//
// PolicyOf looks for a Guarded handler among the route's middleware and
// handler. Middleware is a func(http.Handler) http.Handler, which cannot be
// inspected: PolicyOf calls each one once more on a placeholder handler
// (never served) and looks at what it returns, as a router does when the
// route is registered. A handler that wraps another is seen through when it
// has an Unwrap() http.Handler method. A guard hidden inside a handler that
// does neither (auth(idem(h)) passed as one handler) is not seen: the route
// is listed as unguarded, a gap if its method is unsafe. The inventory errs
// on the side of a false gap, never of a false guarantee; register the
// middleware separately (ServeMux.Handle's middleware arguments, chi's
// With or Use) to make the guard visible.
package inventory

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Requirement says whether a route or consumer demands an idempotency key.
type Requirement string

// Requirements.
const (
	// RequireNone: no guard covers the route's method; requests run as
	// often as they come.
	RequireNone Requirement = "none"
	// RequireSoft: a request with a key is deduplicated; one without runs
	// unguarded (httpx.Options.Optional).
	RequireSoft Requirement = "soft"
	// RequireHard: every request or message is deduplicated; a request
	// without a key is refused (400), or gets a computed key.
	RequireHard Requirement = "hard"
)

// KeySource says where a key comes from.
type KeySource string

// Key sources.
const (
	KeyHeader    KeySource = "header"     // a request header (Idempotency-Key)
	KeyBody      KeySource = "body"       // a field of the JSON request body
	KeyComputed  KeySource = "computed"   // derived from the request or message by a function
	KeyMessageID KeySource = "message_id" // the broker's id of the message
)

// Scope says whose keys are kept apart: the same key from two callers of
// a tenant- or user-scoped route is two keys; of a global one, one key.
type Scope string

// Dedup scopes.
const (
	ScopeGlobal Scope = "global" // one namespace for every caller (httpx.Options.SingleCaller, a consumer group)
	ScopeTenant Scope = "tenant" // per account, organisation or client (httpx.Options.Tenant)
	ScopeUser   Scope = "user"   // per user (httpx.Options.Tenant naming a user)
)

// Policy is what a guard enforces.
type Policy struct {
	// Required is RequireSoft or RequireHard for a guard (empty counts as
	// RequireHard). A Guarded handler reporting anything else, RequireNone
	// included, is taken for no guard.
	Required Requirement
	// KeySource is where the key comes from.
	KeySource KeySource
	// Key says more about the key: a header's name, a JSON pointer, what
	// a computed key digests.
	Key string
	// Scope is whose keys are kept apart.
	Scope Scope
	// TTL is how long a completed key is remembered (and replayed).
	TTL time.Duration
	// Methods are the HTTP methods the guard acts on; other methods pass
	// through it untouched. Empty for consumers.
	Methods []string
}

// Guarded is implemented by handlers that enforce an idempotency policy:
// the handlers httpx.Guard returns. A router walk finds a route's policy
// through it.
type Guarded interface {
	IdempotencyPolicy() Policy
}

// Kind is what an Entry lists.
type Kind string

// Kinds of entries.
const (
	KindHTTP     Kind = "http"
	KindConsumer Kind = "consumer"
)

// AnyMethod is the Method of a route that matches every method (a
// ServeMux pattern without a method, a gorilla/mux route without
// Methods).
const AnyMethod = "*"

// Entry is one row of the inventory: an HTTP route and method, or a
// consumer group and message type. Entries are comparable values.
type Entry struct {
	Kind Kind
	// Handler is the route pattern ("/orders/{id}") or the consumer group.
	Handler string
	// Method is the HTTP method (AnyMethod for every method) or the
	// message type.
	Method string
	// Required, KeySource, Key, Scope and TTL are the policy that applies
	// to this method; KeySource, Key, Scope and TTL are empty when
	// Required is RequireNone.
	Required  Requirement
	KeySource KeySource
	Key       string
	Scope     Scope
	TTL       time.Duration
	// Gap is true for a route whose method is unsafe (Options.UnsafeMethods)
	// and that no guard covers.
	Gap bool
	// Router names where the entry was found: "chi", "gorilla/mux",
	// "ServeMux", or "consumerx".
	Router string
	// Note explains an entry that needs it, e.g. the unsafe methods an
	// any-method route leaves unguarded.
	Note string

	// Of an AnyMethod row, as registered: the unsafe methods it leaves
	// unguarded (comma-separated) and whether a guard covers some. Gap and
	// Note are worked out from them in Entries, once the methods that
	// other rows of the pattern serve are known.
	open    string
	covered bool
	// node is Route.Node: only rows of one node settle each other.
	node any
	// expanded marks the row of a method an any-method route's guard acts
	// on: a route of its own for that method in the node takes it.
	expanded bool
}

// Options configure an Inventory. The zero value is ready to use.
type Options struct {
	// UnsafeMethods are the methods a route must guard; a route with one
	// of them and no guard covering it is a gap. Default POST and PATCH,
	// the methods that are not idempotent by definition (RFC 9110
	// section 9.2.2). Add PUT and DELETE when your handlers for them have
	// effects a repeat would double (a PUT that appends, a DELETE that
	// refunds). Methods are taken in any case, without surrounding
	// spaces; a list with none (nil, or only empty strings) is the
	// default.
	UnsafeMethods []string
}

// Inventory collects entries. It is safe for concurrent use: consumers
// that are created lazily (watermillx with a group per router handler)
// may add themselves while it is served.
type Inventory struct {
	unsafe map[string]bool

	mu      sync.Mutex
	entries []Entry
	seen    map[Entry]bool
}

// New returns an empty Inventory.
func New(opts Options) *Inventory {
	inv := &Inventory{unsafe: map[string]bool{}, seen: map[Entry]bool{}}
	for _, m := range opts.UnsafeMethods {
		if m = strings.ToUpper(strings.TrimSpace(m)); m != "" {
			inv.unsafe[m] = true
		}
	}
	if len(inv.unsafe) == 0 {
		inv.unsafe[http.MethodPost], inv.unsafe[http.MethodPatch] = true, true
	}
	return inv
}

// Route is one route of a router, as a walk finds it.
type Route struct {
	// Router names the router, for Entry.Router.
	Router string
	// Method is the route's HTTP method, or AnyMethod ("" counts as
	// AnyMethod).
	Method string
	// Pattern is the route's path pattern.
	Pattern string
	// Handler is the route's handler.
	Handler http.Handler
	// Middleware applies to the route, outermost first (chi's, or those
	// given to ServeMux.Handle).
	Middleware []func(http.Handler) http.Handler
	// Node identifies the registration whose methods a request for
	// Pattern is served from: a comparable value, such as a pointer. A
	// method's own row settles an any-method row of the same pattern,
	// leaving that method out of its gaps, only when both have the same
	// Router and Node: chiwalk's node is the router whose tree holds the
	// pattern (a catch-all on a router above a mounted one, or on another
	// router, still serves the method unguarded; chi refuses "patch" with
	// 405), muxwalk's the route itself (the first gorilla/mux route that
	// matches serves, in the method's exact case), ServeMux's each
	// registration (a "patch" request passes "PATCH /x" by for "/x"). Nil
	// is one node per Router name.
	Node any
}

// AddRoute lists a route: guarded by the policy PolicyOf finds on it, or
// unguarded. An any-method route with a guard gives a row for each
// method the guard covers and one for the others.
//
// AddRoute panics when rt.Node's type is not comparable.
func (inv *Inventory) AddRoute(rt Route) {
	if rt.Node != nil && !reflect.TypeOf(rt.Node).Comparable() {
		panic(fmt.Sprintf("inventory.AddRoute: Route.Node of type %T is not comparable", rt.Node))
	}
	p, guarded := PolicyOf(rt.Handler, rt.Middleware...)
	switch p.Required {
	case "", RequireSoft, RequireHard:
	default: // a guard that requires no key, or what this package does not know, vouches for nothing
		guarded = false
	}
	method := strings.ToUpper(rt.Method)
	if method == "" {
		method = AnyMethod
	}
	base := Entry{Kind: KindHTTP, Handler: rt.Pattern, Router: rt.Router, node: rt.Node}
	if method != AnyMethod {
		e := base
		e.Method = method
		if guarded && covers(p, method) {
			e.setPolicy(p)
		} else {
			e.Required = RequireNone
			e.Gap = inv.unsafe[method]
			if guarded && !safe[method] {
				e.Note = "the route's guard does not act on " + method
			}
		}
		inv.add(e)
		return
	}
	var open []string // unsafe methods no guard covers
	for m := range inv.unsafe {
		if !guarded || !covers(p, m) {
			open = append(open, m)
		}
	}
	slices.Sort(open)
	if guarded && len(p.Methods) == 0 { // a guard on every method: one row says it
		e := base
		e.Method = AnyMethod
		e.setPolicy(p)
		inv.add(e)
		return
	}
	if guarded {
		// As Entry.Method: the method upper-cased (the guard's Methods
		// match in any case), each once.
		methods := make([]string, len(p.Methods))
		for i, m := range p.Methods {
			methods[i] = strings.ToUpper(m)
		}
		slices.Sort(methods)
		methods = slices.Compact(methods)
		for _, m := range methods {
			e := base
			e.Method = m
			e.setPolicy(p)
			e.expanded = true
			inv.add(e)
		}
	}
	e := base
	e.Method = AnyMethod
	e.Required = RequireNone
	e.open, e.covered = strings.Join(open, ","), guarded
	inv.add(e)
}

// settle works out Gap and Note of the AnyMethod rows in entries: the
// unsafe methods such a route leaves unguarded, less those another row of
// the same pattern, router and node serves (Route.Node: within a node a
// method's own registration wins over the catch-all). It returns the
// entries without the rows a catch-all's guard gives for a method the
// node registers on its own (the guard never sees that method), nor the
// rows that are then equal to an earlier one (two routers' "GET /healthz").
func settle(entries []Entry) []Entry {
	type route struct {
		kind            Kind
		handler, router string
		node            any
	}
	// The methods of a pattern registered on their own, in upper case. Not
	// the rows a catch-all's guard gives: a subrouter mounted by two
	// routers is one node, and its catch-all guarded through one router is
	// not through the other.
	dedicated := map[route]map[string]bool{}
	for _, e := range entries {
		if e.Method != AnyMethod && !e.expanded {
			r := route{e.Kind, e.Handler, e.Router, e.node}
			if dedicated[r] == nil {
				dedicated[r] = map[string]bool{}
			}
			dedicated[r][strings.ToUpper(e.Method)] = true
		}
	}
	taken := make([]bool, len(entries))
	for i, e := range entries {
		r := route{e.Kind, e.Handler, e.Router, e.node}
		taken[i] = e.expanded && dedicated[r][strings.ToUpper(e.Method)]
		entries[i].open, entries[i].covered, entries[i].node, entries[i].expanded = "", false, nil, false // settled: an Entry compares with one built by hand
		if e.Method != AnyMethod || e.Kind != KindHTTP {
			continue
		}
		served := dedicated[route{e.Kind, e.Handler, e.Router, e.node}]
		var open []string
		for m := range strings.SplitSeq(e.open, ",") {
			if m != "" && !served[m] {
				open = append(open, m)
			}
		}
		what := "every method"
		if e.covered || len(served) > 0 {
			what = "other methods"
		}
		entries[i].Gap = len(open) > 0
		switch {
		case len(open) > 0:
			entries[i].Note = what + ", unguarded: " + strings.Join(open, ", ")
		case what == "other methods":
			entries[i].Note = what
		default:
			entries[i].Note = ""
		}
	}
	seen := make(map[Entry]bool, len(entries))
	out := entries[:0]
	for i, e := range entries {
		if !taken[i] && !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	return out
}

// AddConsumer lists a consumer group deduplicated by p. consumerx calls it
// for a Processor made with Options.Inventory.
func (inv *Inventory) AddConsumer(group, messageType string, p Policy) {
	e := Entry{Kind: KindConsumer, Handler: group, Method: messageType, Router: "consumerx"}
	e.setPolicy(p)
	inv.add(e)
}

func (e *Entry) setPolicy(p Policy) {
	e.Required = cmp.Or(p.Required, RequireHard)
	e.KeySource, e.Key, e.Scope, e.TTL = p.KeySource, p.Key, p.Scope, p.TTL
}

// safe are the methods RFC 9110 section 9.2.1 calls safe: a guard that
// leaves them alone is what is expected, not worth a note.
var safe = map[string]bool{"GET": true, "HEAD": true, "OPTIONS": true, "TRACE": true}

// covers reports whether p's guard acts on method (a guard with no
// methods listed acts on every method).
func covers(p Policy, method string) bool {
	return len(p.Methods) == 0 || slices.ContainsFunc(p.Methods, func(m string) bool { return strings.EqualFold(m, method) })
}

// add appends e unless an equal entry is there: walking a router twice,
// or several consumers of one group, list each row once.
func (inv *Inventory) add(e Entry) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.seen[e] {
		return
	}
	inv.seen[e] = true
	inv.entries = append(inv.entries, e)
}

// Entries returns the entries: HTTP routes by pattern and method, then
// consumers by group and message type.
func (inv *Inventory) Entries() []Entry {
	inv.mu.Lock()
	out := slices.Clone(inv.entries)
	inv.mu.Unlock()
	out = settle(out)
	slices.SortStableFunc(out, func(a, b Entry) int {
		return cmp.Or(
			cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)),
			cmp.Compare(a.Handler, b.Handler),
			cmp.Compare(methodOrder(a.Method), methodOrder(b.Method)),
			cmp.Compare(a.Method, b.Method),
			cmp.Compare(a.Router, b.Router),
		)
	})
	return out
}

// Gaps returns the entries that are gaps, in the order of Entries.
func (inv *Inventory) Gaps() []Entry {
	var out []Entry
	for _, e := range inv.Entries() {
		if e.Gap {
			out = append(out, e)
		}
	}
	return out
}

func kindOrder(k Kind) int {
	if k == KindHTTP {
		return 0
	}
	return 1
}

// methodOrder puts the usual methods in their usual order, others after.
func methodOrder(m string) int {
	order := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", AnyMethod}
	if i := slices.Index(order, m); i >= 0 {
		return i
	}
	return len(order)
}

// PolicyOf returns the policy of the first guard (outermost) among
// middleware, applied outermost first, and h: a Guarded value, found on h
// or on what it wraps (Unwrap() http.Handler), or on what a middleware
// returns when it wraps a placeholder handler. ok is false when there is
// none. Each middleware is called once, on a placeholder that is never
// served; a middleware that panics when called is taken for no guard.
func PolicyOf(h http.Handler, middleware ...func(http.Handler) http.Handler) (p Policy, ok bool) {
	for _, mw := range middleware {
		if mw == nil {
			continue
		}
		if p, ok := probe(mw); ok {
			return p, true
		}
	}
	return handlerPolicy(h)
}

// handlerPolicy looks for a Guarded value on h and on what it unwraps to.
func handlerPolicy(h http.Handler) (Policy, bool) {
	for range 64 { // a wrapper that unwraps to itself must not hang the walk
		if h == nil {
			return Policy{}, false
		}
		if g, ok := h.(Guarded); ok {
			return g.IdempotencyPolicy(), true
		}
		u, ok := h.(interface{ Unwrap() http.Handler })
		if !ok {
			return Policy{}, false
		}
		h = u.Unwrap()
	}
	return Policy{}, false
}

// placeholder is the handler middleware is probed with.
var placeholder = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "inventory placeholder", http.StatusInternalServerError)
})

func probe(mw func(http.Handler) http.Handler) (p Policy, ok bool) {
	defer func() {
		if recover() != nil {
			p, ok = Policy{}, false
		}
	}()
	return handlerPolicy(mw(placeholder))
}

// columns are the table's columns; the first five are the seeds' own.
var columns = []string{"path/handler", "method/type", "idempotency_required", "key_source", "dedup_scope", "key", "ttl", "gap"}

// WriteMarkdown writes the inventory as a Markdown table, one row per
// entry in the order of Entries, and a line counting the gaps.
func (inv *Inventory) WriteMarkdown(w io.Writer) error {
	entries := inv.Entries()
	var b strings.Builder
	b.WriteString("| " + strings.Join(columns, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(columns)) + "\n")
	gaps := 0
	for _, e := range entries {
		handler := e.Handler
		if e.Kind == KindConsumer {
			handler = "consumer group " + handler
		}
		gap := ""
		if e.Gap {
			gaps++
			gap = "**gap**"
		}
		if e.Note != "" {
			gap = strings.TrimSpace(gap + " " + e.Note)
		}
		cells := []string{handler, e.Method, string(e.Required), dash(string(e.KeySource)), dash(string(e.Scope)),
			dash(e.Key), dash(FormatTTL(e.TTL)), gap}
		for i, c := range cells {
			cells[i] = escapeCell(c)
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	switch gaps {
	case 0:
		b.WriteString("\nNo gaps: every unsafe route has an idempotency guard.\n")
	case 1:
		b.WriteString("\n1 gap: an unsafe route without an idempotency guard.\n")
	default:
		fmt.Fprintf(&b, "\n%d gaps: unsafe routes without an idempotency guard.\n", gaps)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// escapeCell keeps a value inside its table cell, and its characters
// what they look like: whitespace runs become one space, and what a
// terminal or viewer would act on rather than show (control characters,
// bidirectional overrides, bytes that are not UTF-8) is written as a Go
// escape (\x1b, \u202e, \xff).
func escapeCell(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.Join(strings.Fields(s), " ")
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

// FormatTTL writes d without zero units ("24h", "10m", "1h30m", "1.5s"); ""
// for zero.
func FormatTTL(d time.Duration) string {
	if d == 0 {
		return ""
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// jsonEntry is an Entry as JSON: the seeds' column names where they have
// one.
type jsonEntry struct {
	Kind       Kind        `json:"kind"`
	Handler    string      `json:"handler"`
	Method     string      `json:"method"`
	Required   Requirement `json:"idempotency_required"`
	KeySource  KeySource   `json:"key_source,omitempty"`
	Key        string      `json:"key,omitempty"`
	Scope      Scope       `json:"dedup_scope,omitempty"`
	TTL        string      `json:"ttl,omitempty"`
	TTLSeconds float64     `json:"ttl_seconds,omitempty"`
	Gap        bool        `json:"gap"`
	Router     string      `json:"router,omitempty"`
	Note       string      `json:"note,omitempty"`
}

// MarshalJSON renders the inventory as {"entries": [...], "gaps": n}, each
// entry with the fields kind, handler (route pattern or consumer group),
// method (HTTP method or message type), idempotency_required, key_source,
// key, dedup_scope, ttl ("24h"), ttl_seconds, gap, router and note; empty
// fields are left out, except gap.
func (inv *Inventory) MarshalJSON() ([]byte, error) {
	entries := inv.Entries()
	doc := struct {
		Entries []jsonEntry `json:"entries"`
		Gaps    int         `json:"gaps"`
	}{Entries: make([]jsonEntry, 0, len(entries))}
	for _, e := range entries {
		if e.Gap {
			doc.Gaps++
		}
		doc.Entries = append(doc.Entries, jsonEntry{Kind: e.Kind, Handler: e.Handler, Method: e.Method,
			Required: e.Required, KeySource: e.KeySource, Key: e.Key, Scope: e.Scope,
			TTL: FormatTTL(e.TTL), TTLSeconds: e.TTL.Seconds(), Gap: e.Gap, Router: e.Router, Note: e.Note})
	}
	return json.Marshal(doc)
}

// Handler serves the inventory, for a debug endpoint: the Markdown table
// (text/markdown), or JSON when the query has format=json or the request
// accepts application/json and not text/markdown. It answers GET and HEAD
// only (405 otherwise), and is read at each request, so consumers added
// later are shown. Mount it where only operators reach it: it names every
// route and how it is guarded.
func (inv *Inventory) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		if wantsJSON(r) {
			body, err := inv.MarshalJSON()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(body, '\n'))
			return
		}
		w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
		_ = inv.WriteMarkdown(w)
	})
}

func wantsJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "markdown", "md":
		return false
	}
	accept := r.Header.Get("Accept")
	return strings.Contains(accept, "application/json") && !strings.Contains(accept, "text/markdown")
}
