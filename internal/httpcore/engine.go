// Package httpcore is the framework-agnostic core of idemguard's HTTP
// middleware: the rules of httpx.Guard (where the key comes from, its
// scope, the fingerprint, claim, replay or run, the answers 400, 401, 409,
// 413, 422 and 503, waiting, the stored-response format and which header
// fields it keeps, completion and release with bounded retries, panics)
// written once over a small view of a request (Request) and of a
// handler's response (Response). httpx binds it to net/http; ginx, echox
// and fiberx to their frameworks. Users configure it through httpx.Options.
//
// It is internal: its API follows what the bindings need and may change
// with them; the bindings' own APIs are the stable ones.
package httpcore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
	"github.com/idemguard/idemguard/inventory"
)

// Defaults for Config (httpx.Options documents them).
const (
	DefaultHeader            = "Idempotency-Key"
	DefaultMaxBody           = 1 << 20
	DefaultMaxStoredResponse = 1 << 20
	DefaultRetryAfter        = time.Second
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Request is what the core reads of a request. Each binding implements it
// over its framework's request without copying it.
type Request interface {
	Method() string
	// Path is the unescaped path, for messages and logs.
	Path() string
	EscapedPath() string
	RawQuery() string
	// Route is the route pattern the router matched ("POST /orders",
	// "/orders/:id"), or "" when none is known.
	Route() string
	// HeaderValues returns the values of the request header field name
	// (canonical), nil when absent.
	HeaderValues(name string) []string
	// ContentLength is the declared body length, -1 when unknown.
	ContentLength() int64
	Context() context.Context
	// ReadBody reads the whole body, at most max bytes (an error wrapping
	// *http.MaxBytesError past it), and leaves it readable again for the
	// handler. w is the response writer, for net/http's own limit.
	ReadBody(w http.ResponseWriter, max int64) ([]byte, error)
	// HTTPRequest returns the request as a *http.Request, for the
	// Options funcs written for net/http (Tenant, Scope, Fingerprint).
	HTTPRequest() *http.Request
}

// Config is httpx.Options resolved for the core: the same fields, with
// the funcs over Request. httpx.Options documents each field.
type Config struct {
	// Name prefixes panics ("httpx.Guard") and log messages ("httpx").
	Name string

	Tenant            func(Request) string
	SingleCaller      bool
	CallerScope       inventory.Scope
	Header            string
	Key               KeySpec
	Methods           []string
	Optional          bool
	Scope             func(Request) string
	Fingerprint       func(Request, []byte) string
	MaxBody           int64
	MaxStoredResponse int
	ReplayHeader      func(name string) bool
	Store5xx          bool
	InFlightStatus    int
	Wait              time.Duration
	UnavailableRetry  time.Duration
	Logger            *slog.Logger
	LogKeys           bool
}

// Engine is a configured core: one per guarded route group, shared by
// its requests.
type Engine struct {
	g       *guard.Guard
	opts    Config
	log     string // log message prefix, "httpx: "
	methods map[string]bool
	runs    adapter.RunTimes
	policy  inventory.Policy
	end     adapter.Ender // completes and releases claims
}

// New checks cfg and fills in its defaults. It panics, as http.Handle does
// on a programmer's error, when g is nil or cfg chooses neither or both of
// Tenant and SingleCaller, with cfg.Name's prefix.
func New(g *guard.Guard, cfg Config) *Engine {
	name := cfg.Name
	if name == "" {
		name = "httpx.Guard"
	}
	pkg, _, _ := strings.Cut(name, ".")
	if g == nil {
		panic(name + ": nil guard")
	}
	switch {
	case cfg.Tenant == nil && !cfg.SingleCaller:
		panic(name + ": choose how keys are scoped by caller: set Options.Tenant (e.g. httpx.TenantFromContext " +
			"or httpx.TenantFromJWT) to keep each caller's keys apart, or Options.SingleCaller for a service with " +
			"one caller; without either, a caller could be replayed another caller's response")
	case cfg.Tenant != nil && cfg.SingleCaller:
		panic(name + ": Options.Tenant and Options.SingleCaller are both set; choose one")
	case cfg.Tenant != nil && cfg.CallerScope != "" && cfg.CallerScope != inventory.ScopeTenant && cfg.CallerScope != inventory.ScopeUser:
		panic(fmt.Sprintf("%s: Options.CallerScope %q with Options.Tenant: want inventory.ScopeTenant or inventory.ScopeUser", name, cfg.CallerScope))
	case cfg.SingleCaller && cfg.CallerScope != "" && cfg.CallerScope != inventory.ScopeGlobal:
		panic(fmt.Sprintf("%s: Options.CallerScope %q with Options.SingleCaller: keys are not kept per caller (inventory.ScopeGlobal)", name, cfg.CallerScope))
	case cfg.Key.kind == inventory.KeyComputed && cfg.Optional:
		panic(name + ": Options.Optional with a ComputedKey: every request gets a computed key, so none runs unguarded; drop Optional")
	}
	m := &Engine{g: g, opts: cfg, log: pkg + ": ", methods: map[string]bool{}}
	m.opts.Name = name
	if m.opts.Header == "" {
		m.opts.Header = DefaultHeader
	}
	m.opts.Header = textproto.CanonicalMIMEHeaderKey(m.opts.Header)
	methods := cfg.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, meth := range methods {
		m.methods[meth] = true
	}
	if m.opts.Scope == nil {
		m.opts.Scope = DefaultScope
	}
	if m.opts.Fingerprint == nil {
		m.opts.Fingerprint = DefaultFingerprint
	}
	if m.opts.MaxBody <= 0 {
		m.opts.MaxBody = DefaultMaxBody
	}
	if m.opts.MaxStoredResponse <= 0 {
		m.opts.MaxStoredResponse = DefaultMaxStoredResponse
	}
	if m.opts.ReplayHeader == nil {
		m.opts.ReplayHeader = DefaultReplayHeader
	}
	if m.opts.InFlightStatus == 0 {
		m.opts.InFlightStatus = http.StatusConflict
	}
	if m.opts.Wait < 0 {
		m.opts.Wait = 0
	}
	if m.opts.UnavailableRetry <= 0 {
		m.opts.UnavailableRetry = DefaultRetryAfter
	}
	if m.opts.Logger == nil {
		m.opts.Logger = slog.Default()
	}
	m.policy = m.makePolicy(methods)
	m.end = adapter.Ender{Guard: g, Logger: m.opts.Logger, Prefix: m.log, LogKeys: m.opts.LogKeys}
	return m
}

// Guard returns the guard the engine claims keys with.
func (m *Engine) Guard() *guard.Guard { return m.g }

// Policy reports what the engine enforces, for the idempotency inventory
// (inventory.Guarded); the caller may keep the result.
func (m *Engine) Policy() inventory.Policy {
	p := m.policy
	p.Methods = slices.Clone(p.Methods)
	return p
}

// makePolicy describes the guard for the inventory.
func (m *Engine) makePolicy(methods []string) inventory.Policy {
	p := inventory.Policy{
		Required:  inventory.RequireHard,
		KeySource: inventory.KeyHeader,
		Key:       m.opts.Key.describe(m.opts.Header),
		Scope:     inventory.ScopeGlobal,
		TTL:       m.g.Options().TTL,
		Methods:   slices.Clone(methods),
	}
	if m.opts.Key.kind != "" {
		p.KeySource = m.opts.Key.kind
	}
	if m.opts.Optional {
		p.Required = inventory.RequireSoft
	}
	if m.opts.Tenant != nil {
		p.Scope = inventory.ScopeTenant
		if m.opts.CallerScope == inventory.ScopeUser {
			p.Scope = inventory.ScopeUser
		}
	}
	return p
}

// DefaultScope is the method, in upper case, and the route pattern the
// router matched (Request.Route), or the escaped path when no pattern is
// known. A pattern that starts with a method (ServeMux's "POST /orders")
// has it replaced by the request's. The case is dropped because a handler
// registered without a method serves "patch" as it serves PATCH: a retry
// spelled otherwise than its first request is under the same key (and
// the fingerprint, which keeps the method as sent, answers 422).
func DefaultScope(r Request) string {
	route := r.Route()
	method := strings.ToUpper(r.Method()) // as is, without allocating, when upper already
	if route == "" {
		route = r.EscapedPath()
	} else if i := strings.IndexAny(route, " \t"); i >= 0 {
		if route[:i] == method && i+1 < len(route) && route[i] == ' ' && route[i+1] != ' ' && route[i+1] != '\t' {
			return route // "POST /orders" for a POST: the scope already, as is
		}
		route = strings.TrimLeft(route[i:], " \t") // drop the pattern's own method
	}
	return method + " " + route
}

// DefaultFingerprint is a SHA-256, in hex, over the method, the escaped
// path and query, the Content-Type and the body.
func DefaultFingerprint(r Request, body []byte) string {
	d := getDigester()
	defer d.put()
	d.field(r.Method())
	d.field(r.EscapedPath())
	d.field(r.RawQuery())
	d.field(first(r.HeaderValues("Content-Type")))
	d.flush()
	d.h.Write(body)
	return d.hex("")
}

// first is the first of vs, or "" (http.Header.Get).
func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// Begin is what the request side decided (Engine.Begin).
type Begin struct {
	// Pass: run the handler unguarded (a method not guarded, or an
	// optional key left out).
	Pass bool
	// Run: the key is this request's; run the handler under Held, kept
	// alive from the claim on (Engine.RunCaptured, RunBuffered), and the
	// run ends it. When neither Pass nor Run is set the request was
	// answered.
	Run         bool
	Held        *guard.Held
	Fingerprint string
	Route       string
}

// Begin makes the request-side decisions: whether the method is guarded,
// the key (answering 400 or 413 itself), the caller's scope (401), the
// fingerprint, the claim (with Wait), and answers a replay, 409, 422 or
// 503 on w itself.
func (m *Engine) Begin(w http.ResponseWriter, r Request) Begin {
	if !m.guards(r.Method()) {
		return Begin{Pass: true}
	}
	route := m.opts.Scope(r)
	id, body, read, ok := m.requestKey(w, r, route)
	if !ok {
		return Begin{} // answered
	}
	if id == "" {
		return Begin{Pass: true} // Optional, and the request has no key
	}
	scope, ok := m.scope(r, route)
	if !ok {
		writeProblem(w, Problem{Type: ProblemCallerUnknown, Status: http.StatusUnauthorized,
			Title: "Caller unknown", Key: id,
			Detail: "idempotency keys are kept per caller, and this request names none; authenticate and retry"})
		return Begin{}
	}
	if !read {
		if body, ok = m.readBody(w, r, id); !ok {
			return Begin{}
		}
	}
	key := guard.Key{Scope: scope, ID: id}
	fingerprint := m.opts.Fingerprint(r, body)
	if outer, ok := r.Context().Value(claimKey{}).(*claimInfo); ok && outer.lease.Key == key && adapter.SameStore(outer.m.g, m.g) {
		// A guard over the same store around this one (a router's and a
		// route's, of one guard.Guard or of two, or the middleware applied
		// twice) holds this very key: the handler runs under that claim,
		// which ends it. Claimed again here, it would be this request's
		// own duplicate, in flight, and its 409 the key's stored answer.
		return Begin{Pass: true}
	}

	// Hold claims even if the client hangs up meanwhile: a claim cut off
	// after the store took it would lock the key for a whole lease. It
	// bounds the call itself (the lease's first deadline), keeps the
	// lease alive from then on, and the writes that end the claim
	// (complete, release) outlive a hang-up too.
	out, held, err := m.g.Hold(r.Context(), key, fingerprint)
	if _, busy := errors.AsType[*guard.InProgressError](err); busy && m.opts.Wait > 0 {
		wout, werr, ok := m.wait(r, key, fingerprint)
		switch {
		case ok:
			out, err = wout, werr
			if err == nil && out.Status == guard.Acquired {
				held = m.g.Keep(r.Context(), out.Lease)
			}
		case errors.Is(r.Context().Err(), context.Canceled):
			unfinished(r) // the client left while waiting; nothing was claimed
			return Begin{}
		default:
			// The request's deadline (a timeout middleware set) passed
			// while waiting: the client is there, and is told the key is
			// still in progress (err), not answered nothing (an empty
			// 200, read as success).
		}
	}
	if err != nil {
		m.rejectClaim(w, key, route, err)
		if !finalRefusal(err) {
			unfinished(r) // 409, 503, or a store error: the request was not run
		}
		return Begin{}
	}
	if out.Status == guard.Replay {
		m.replay(w, r, key, out.Result)
		return Begin{}
	}
	if cerr := r.Context().Err(); cerr != nil {
		// The client left, or the request's deadline passed, before the
		// handler ran: nothing happened yet. A client still there is told
		// to retry.
		m.end.Release(held)
		unfinished(r)
		if !errors.Is(cerr, context.Canceled) {
			m.unavailable(w, key.ID, "the request's deadline passed before it ran; retry later with the same key")
		}
		return Begin{}
	}
	return Begin{Run: true, Held: held, Fingerprint: fingerprint, Route: route}
}

// finalRefusal reports whether a claim refused with err is refused for
// good, every copy of the request answered alike (a key reused, malformed
// or exhausted), rather than not run this time.
func finalRefusal(err error) bool {
	return errors.Is(err, guard.ErrMismatch) || errors.Is(err, guard.ErrExhausted) || errors.Is(err, guard.ErrInvalidKey)
}

// unfinished tells the guarded run of an outer Guard, if r is inside one
// (a router-wide Guard around a route's that keys requests otherwise),
// that this Guard answered r with a "retry later" (in flight, store
// unavailable), a store error or a handler's panic (the key released), or
// not at all (the client left): no final answer, so the outer Guard
// releases its key rather than store it for the TTL.
func unfinished(r Request) {
	if outer, ok := r.Context().Value(claimKey{}).(*claimInfo); ok {
		outer.unfinished = true
	}
}

// guards reports whether requests of method are guarded: a method of
// Options.Methods, spelled in any case. A handler registered without a
// method serves "patch" (as browsers' fetch sends PATCH) as it serves
// PATCH; an exact match would let every copy of such a request run.
func (m *Engine) guards(method string) bool {
	if m.methods[method] {
		return true
	}
	for g := range m.methods {
		if strings.EqualFold(g, method) {
			return true
		}
	}
	return false
}

// requestKey finds the request's key where Options.Key says. It answers
// 400 (or 413, reading a body) itself and reports ok false; id is "" with
// ok true for a request without a key that Optional lets through. read
// reports whether body holds the request body already (body and computed
// keys read it first).
func (m *Engine) requestKey(w http.ResponseWriter, r Request, route string) (id string, body []byte, read, ok bool) {
	switch m.opts.Key.kind {
	case inventory.KeyBody:
		if body, ok = m.readBody(w, r, ""); !ok {
			return "", nil, false, false
		}
		id, err := m.opts.Key.bodyKey(body)
		switch {
		case err == nil:
			return id, body, true, true
		case m.opts.Optional && (errors.Is(err, errNoBodyKey) || errors.Is(err, errNotJSON)):
			return "", body, true, true // no key: run unguarded
		case errors.Is(err, errNoBodyKey):
			writeProblem(w, Problem{Type: ProblemMissingKey, Status: http.StatusBadRequest,
				Title:  "Idempotency key missing",
				Detail: fmt.Sprintf("%s %s requires an idempotency key in the JSON body at %s", r.Method(), r.Path(), m.opts.Key.pointer)})
		default:
			writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
				Title: "Idempotency key malformed", Detail: err.Error()})
		}
		return "", nil, false, false
	case inventory.KeyComputed:
		if len(r.HeaderValues(m.opts.Header)) > 0 {
			id, ok = m.headerKey(w, r)
			return id, nil, false, ok // the client's own key wins
		}
		if body, ok = m.readBody(w, r, ""); !ok {
			return "", nil, false, false
		}
		return m.opts.Key.computedKey(r, route, body), body, true, true
	}
	id, ok = m.headerKey(w, r)
	return id, nil, false, ok
}

// headerKey reads the key from Options.Header. It answers 400 itself and
// reports false; id is "" with ok true for a request without the header
// that Optional lets through.
func (m *Engine) headerKey(w http.ResponseWriter, r Request) (id string, ok bool) {
	values := r.HeaderValues(m.opts.Header)
	switch len(values) {
	case 0:
		if m.opts.Optional {
			return "", true
		}
		writeProblem(w, Problem{Type: ProblemMissingKey, Status: http.StatusBadRequest,
			Title:  "Idempotency key missing",
			Detail: fmt.Sprintf("%s %s requires an %s header", r.Method(), r.Path(), m.opts.Header)})
		return "", false
	case 1:
	default:
		writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
			Title:  "Idempotency key malformed",
			Detail: fmt.Sprintf("%d %s fields; send exactly one", len(values), m.opts.Header)})
		return "", false
	}
	id, err := ParseKey(values[0])
	if err != nil {
		writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
			Title: "Idempotency key malformed", Detail: err.Error()})
		return "", false
	}
	return id, true
}

// readBody reads the whole request body, up to MaxBody, and leaves it
// readable for the handler (Request.ReadBody). It answers 413 or 400
// itself and reports false.
func (m *Engine) readBody(w http.ResponseWriter, r Request, id string) ([]byte, bool) {
	if r.ContentLength() > m.opts.MaxBody {
		m.tooLarge(w, id, m.opts.MaxBody)
		return nil, false
	}
	body, err := r.ReadBody(w, m.opts.MaxBody)
	if err != nil {
		if mb, ok := errors.AsType[*http.MaxBytesError](err); ok {
			// MaxBody's, or a lower one put on the body before the
			// guard (http.MaxBytesHandler): the limit that stopped it.
			m.tooLarge(w, id, mb.Limit)
		} else if errors.Is(err, ErrBodyTooLarge) {
			writeProblem(w, Problem{Type: ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
				Title: "Request body too large", Key: id, Detail: err.Error()})
		} else {
			writeProblem(w, Problem{Type: ProblemBodyUnreadable, Status: http.StatusBadRequest,
				Title: "Request body unreadable", Key: id, Detail: err.Error()})
		}
		return nil, false
	}
	return body, true
}

// ReadHTTPBody is Request.ReadBody for a *http.Request (net/http, Gin,
// Echo): it reads r's body, up to max bytes (an error wrapping
// *http.MaxBytesError past it), and puts what it read back as r.Body. A
// body whose length is declared, and small, is read into one buffer of
// that length (and a byte more, to see it end); one of at most
// heldBodyInline bytes shares its allocation with the new r.Body.
func ReadHTTPBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if n := r.ContentLength; n >= 0 && n < heldBodyInline {
		held := &heldSmallBody{}
		body, err := readAll(w, r, max, held.inline[:])
		if err != nil {
			return nil, err
		}
		held.Reset(body)
		r.Body = held
		return body, nil
	}
	body, err := readAll(w, r, max, nil)
	if err != nil {
		return nil, err
	}
	held := &heldBody{}
	held.Reset(body)
	r.Body = held
	return body, nil
}

// exactRead is the largest declared Content-Length read into a buffer of
// that size at once; a longer body grows its buffer as it arrives, so a
// client that declares a large body and sends nothing holds little.
const exactRead = 32 << 10

// readAll reads r's body, up to max bytes. A declared length of less than
// len(inline) is read into inline.
func readAll(w http.ResponseWriter, r *http.Request, max int64, inline []byte) ([]byte, error) {
	n := r.ContentLength
	if n < 0 || n > exactRead {
		return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	}
	var buf []byte
	if n < int64(len(inline)) {
		buf = inline[:n+1]
	} else {
		buf = make([]byte, n+1)
	}
	k := 0
	for k < len(buf) {
		c, err := r.Body.Read(buf[k:])
		k += c
		if err == io.EOF && k < len(buf) {
			return buf[:k:k], nil
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	// More than declared (a request not from net/http's server, which
	// holds the body to its length): read on under the limit.
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
	return io.ReadAll(http.MaxBytesReader(w, rest, max))
}

// ErrBodyTooLarge is what an adapter's Request.ReadBody wraps when its
// framework's own body limiter, before the guard, stopped the read (Echo's
// BodyLimit on a chunked body): the core answers 413, as for a body over
// MaxBody, not 400, with the error's text as the problem's detail.
var ErrBodyTooLarge = errors.New("the request body is over a limit set before the guard")

// tooLarge answers 413 for a body past limit.
func (m *Engine) tooLarge(w http.ResponseWriter, id string, limit int64) {
	writeProblem(w, Problem{Type: ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
		Title: "Request body too large", Key: id,
		Detail: fmt.Sprintf("the body is limited to %d bytes", limit)})
}

// heldBody is the request body the handler reads: the bytes the
// middleware read.
type heldBody struct{ bytes.Reader }

// heldSmallBody is a heldBody in one allocation with its bytes, for a
// body declared shorter than heldBodyInline (one byte more is read, to
// see it end): most API requests.
type heldSmallBody struct {
	heldBody
	inline [heldBodyInline]byte
}

const heldBodyInline = 256

// Close does nothing: the body was read already.
func (*heldBody) Close() error { return nil }

// scope is the key's scope: route (Options.Scope), prefixed by the quoted
// caller (Options.Tenant). ok is false when Tenant names no caller. A scope
// the store would refuse (too long, control bytes) is replaced by its
// digest.
func (m *Engine) scope(r Request, route string) (s string, ok bool) {
	s = route
	if m.opts.Tenant != nil {
		caller := m.opts.Tenant(r)
		if caller == "" {
			return "", false
		}
		s = strconv.Quote(caller) + " " + s
	}
	if (guard.Key{Scope: s, ID: "-"}).Validate() != nil {
		sum := sha256.Sum256([]byte(s))
		s = "sha256:" + hex.EncodeToString(sum[:])
	}
	return s, true
}

// rejectClaim answers a claim that did not give the key to this request.
func (m *Engine) rejectClaim(w http.ResponseWriter, key guard.Key, route string, err error) {
	id := key.ID
	if inProgress, ok := errors.AsType[*guard.InProgressError](err); ok {
		m.inFlight(w, id, route, inProgress.RetryAfter)
		return
	}
	switch {
	case errors.Is(err, guard.ErrMismatch):
		writeProblem(w, Problem{Type: ProblemKeyMismatch, Status: http.StatusUnprocessableEntity,
			Title: "Idempotency key reused", Key: id,
			Detail: "this key was used with a different request; use a new key for a new request"})
	case errors.Is(err, guard.ErrExhausted):
		writeProblem(w, Problem{Type: ProblemExhausted, Status: http.StatusInternalServerError,
			Title: "Idempotency key attempts exhausted", Key: id,
			Detail: "the request with this key was abandoned too often and will not run again"})
	case errors.Is(err, guard.ErrInvalidKey):
		writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
			Title: "Idempotency key malformed", Key: id, Detail: m.logErr(key, err)})
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		m.unavailable(w, id, "the request was not run; retry later with the same key")
	default:
		m.opts.Logger.Error(m.log+"idempotency claim failed", append(m.logKey(key), "err", m.logErr(key, err))...)
		writeProblem(w, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: id, Detail: "the request was not run"})
	}
}

// inFlight answers a request whose key another request holds.
func (m *Engine) inFlight(w http.ResponseWriter, id, route string, leaseLeft time.Duration) {
	writeProblem(w, Problem{Type: ProblemInFlight, Status: m.opts.InFlightStatus,
		Title: "Request with this key in progress", Key: id,
		Detail: "another request with this key has not finished; retry after the delay given"},
		"Retry-After", retryAfter(m.inFlightRetryAfter(route, leaseLeft)))
}

// unavailable answers 503 with Retry-After: UnavailableRetry, or until
// the probe of an open circuit breaker under the store (fallback).
func (m *Engine) unavailable(w http.ResponseWriter, id, detail string) {
	writeProblem(w, Problem{Type: ProblemStoreUnavailable, Status: http.StatusServiceUnavailable,
		Title: "Idempotency store unavailable", Key: id, Detail: detail},
		"Retry-After", retryAfter(adapter.UnavailableDelay(m.g, m.opts.UnavailableRetry)))
}

// replay writes a stored response.
func (m *Engine) replay(w http.ResponseWriter, r Request, key guard.Key, result []byte) {
	sr, err := parseResponse(result)
	if err != nil {
		m.opts.Logger.Error(m.log+"stored response unreadable",
			append(m.logKey(key), "path", r.Path(), "err", m.logErr(key, err))...)
		writeProblem(w, Problem{Type: ProblemCorruptResponse, Status: http.StatusInternalServerError,
			Title: "Stored response unreadable", Key: key.ID,
			Detail: "the request with this key ran, but its stored response cannot be read"})
		return
	}
	writeStored(w, key.ID, sr)
}

// writeStored writes sr as a replay: its header fields over w's, its
// status and body, and Idempotent-Replayed: true.
func writeStored(w http.ResponseWriter, id string, sr responseView) {
	if sr.notKept != 0 {
		why := "it was larger than the server keeps"
		if sr.notKept&notKeptHijacked != 0 {
			why = "the handler took over the connection"
		} else if sr.notKept&notKeptStreamed != 0 {
			why = "its body was streamed (a streamed body is sent, not kept)"
		} else if sr.notKept&notKeptCutShort != 0 {
			why = "its body fell short of its Content-Length, and it was cut off"
		} else if sr.notKept&notKeptBypassed != 0 {
			why = "it went out around the guard (an internal redirect, or a timeout middleware outside it answered while the handler ran on)"
		}
		writeProblem(w, Problem{Type: ProblemResponseNotKept, Status: sr.status,
			Title: "Response not kept", Key: id,
			Detail: "the request with this key ran with this status, but its response was not stored: " + why},
			ReplayedHeader, "true")
		return
	}
	sr.setHeader(w.Header())
	w.WriteHeader(sr.status)
	if len(sr.body) > 0 {
		// Not an empty write: Gin sends its header on any write, which a
		// first run's bodyless answer left to after the guard (an outer
		// middleware's field set after c.Next, Gin's default 404 text).
		_, _ = w.Write(sr.body)
	}
}

// Result is a guarded handler's response as its binding saw it, once the
// handler returned.
type Result struct {
	Status int
	// Before is the response header when the handler was called (outer
	// middleware's fields); Header the header with the status (what goes
	// out). Fields in Header equal to Before's are not the handler's and
	// are not stored.
	Before, Header http.Header
	Body           []byte
	TooLarge       bool // the body was over MaxStoredResponse: keep a marker
	CutShort       bool // the body fell short of its Content-Length, so net/http cut the response off: keep a marker
	Bypassed       bool // the response went out around the binding (Gin's HandleContext): keep a marker
	// Abandoned: the framework answered the client around the handler
	// while it ran on (Fiber's timeout middleware outside the guard):
	// the effect may have happened, whatever the status. Keep a marker
	// with the timeout's 408, never release.
	Abandoned bool
	Streamed  bool   // the body goes out as a stream after the answer is stored (Fiber's SendStream): keep a marker
	Hijacked  bool   // the handler took the connection: keep a marker, send nothing
	Stored    []byte // CommitResponse committed these bytes: store them as they are
	Release   bool   // CommitResponse answered without committing: release, store nothing
	// Untyped: the response went out without a Content-Type (net/http
	// sniffed none: the handler flushed before its body, set the field to
	// nil, or removed outer middleware's from a response without a body;
	// fasthttp sent no default type), so a replay sends none either.
	Untyped bool

	// fields is Header as a list, when the binding kept it so (a Capture
	// snapshots the header at WriteHeader without a map); Header is then
	// nil.
	fields []snapField
	// trailers are the trailer fields the handler set (Capture.trailers:
	// a declared name, or one with http.TrailerPrefix), stored for replays
	// under http.TrailerPrefix.
	trailers []snapField
}

// Response is a binding's hold on a guarded handler's response: the
// capture (net/http, Gin, Echo) or the framework's buffered response
// (Fiber).
type Response interface {
	// Result is the handler's response; a handler that wrote nothing
	// answered 200.
	Result() Result
	// Send lets the held response go to the client, once it is stored.
	Send()
	// Abandon is called after the handler panicked. cut reports that part
	// of the response already went out (it is then cut off); otherwise
	// the response header is back to what outer middleware set, and w is
	// where the 500 is written.
	Abandon() (w http.ResponseWriter, cut bool)
}

// RunCaptured runs a handler that writes to an http.ResponseWriter (the
// Begin was Run): call gets the run's context, which carries the claim
// (ClaimFrom), and the capture to write to. The capture holds the
// response back until it is stored.
func (m *Engine) RunCaptured(w http.ResponseWriter, r Request, b Begin, call func(ctx context.Context, c *Capture)) {
	// The capture, the claim the handler's context carries and that
	// context: one allocation.
	run := &capturedRun{}
	c := &run.c
	c.init(w, m.opts.MaxStoredResponse, r.HTTPRequest().ProtoMajor >= 2)
	run.info = claimInfo{lease: b.Held.Lease(), fingerprint: b.Fingerprint, route: b.Route, c: c, m: m}
	run.ctx.info = &run.info
	m.execute(r, b, c, &run.ctx, func() { call(&run.ctx, c) })
}

// RunBuffered runs a handler whose framework builds the response in memory
// and sends it after the handler returned (Fiber): call gets the run's
// context; resp reads the response it built.
func (m *Engine) RunBuffered(r Request, b Begin, resp Response, call func(ctx context.Context)) {
	run := &bufferedRun{}
	run.info = claimInfo{lease: b.Held.Lease(), fingerprint: b.Fingerprint, route: b.Route, m: m}
	run.ctx.info = &run.info
	m.execute(r, b, resp, &run.ctx, func() { call(&run.ctx) })
}

// capturedRun is what one captured run of the handler needs, allocated
// together: the writer it writes to, its claim, and its context.
type capturedRun struct {
	c    Capture
	info claimInfo
	ctx  runContext
}

// bufferedRun is capturedRun without the capture.
type bufferedRun struct {
	info claimInfo
	ctx  runContext
}

// execute calls the handler (invoke) under the held lease, kept alive,
// and stores or releases the outcome; the handler's context ends when
// that write returns. A panic releases the key and answers 500 (or cuts
// the response off when part of it is out), unless CommitResponse
// committed the effect before it: that response is then stored and sent
// (stored only, after runtime.Goexit or http.ErrAbortHandler).
func (m *Engine) execute(r Request, b Begin, resp Response, rc *runContext, invoke func()) {
	held := b.Held
	lease := held.Lease()
	rc.Context = held.Context()
	returned, finished := false, false
	defer func() {
		if finished {
			return
		}
		if returned {
			// finish panicked before its write (a Logger, an encoder):
			// the lease runs out rather than being kept alive for ever.
			held.Stop()
			return
		}
		p := recover()
		if stored := committedBytes(rc.info.c, resp); stored != nil {
			// CommitResponse committed the effect with its response
			// before the panic: that response is the key's answer, and
			// the client's, not a 500 that reads as a failed request.
			switch p {
			case nil:
				// runtime.Goexit: let it go on. net/http then closes the
				// connection without a response (a flush now would send
				// one cut off); the retry gets the replay.
				m.opts.Logger.Error(m.log+"handler exited (runtime.Goexit) after CommitResponse; its committed response is stored, not answered",
					append(m.logKey(lease.Key), "path", r.Path())...)
				m.end.Complete(held, stored, "path", r.Path())
				return
			case http.ErrAbortHandler:
				m.opts.Logger.Error(m.log+"handler aborted (http.ErrAbortHandler) after CommitResponse; its committed response is stored and the connection cut",
					append(m.logKey(lease.Key), "path", r.Path())...)
				m.end.Complete(held, stored, "path", r.Path())
				panic(p) // as the handler asked
			}
			m.opts.Logger.Error(m.log+"handler panicked after CommitResponse; its committed response is stored and sent",
				append(m.logKey(lease.Key), "path", r.Path(), "panic", p)...)
			m.end.Complete(held, stored, "path", r.Path())
			resp.Send()
			return
		}
		m.end.Release(held)
		unfinished(r) // released: the handler's run is no final answer
		if p == nil {
			return // runtime.Goexit: let it go on
		}
		if p == http.ErrAbortHandler {
			panic(p) // the handler's way to cut the response off; net/http handles it
		}
		m.opts.Logger.Error(m.log+"handler panicked; idempotency key released",
			append(m.logKey(lease.Key), "path", r.Path(), "panic", p)...)
		w, cut := resp.Abandon()
		if cut {
			panic(http.ErrAbortHandler) // part of the response is out: cut it off
		}
		writeProblem(w, Problem{Type: ProblemHandlerPanic, Status: http.StatusInternalServerError,
			Title: "Internal server error", Key: lease.Key.ID,
			Detail: "the handler failed; the key was released, retry with the same key"})
	}()
	start := time.Now()
	invoke()
	returned = true
	m.runs.Observe(b.Route, time.Since(start))
	m.finish(r, held, resp, rc.info)
	finished = true
}

// CommittedResponse is a Response that knows what CommitResponse
// committed (Fiber's buffered response): the bytes, nil when nothing was.
type CommittedResponse interface{ Committed() []byte }

// committedBytes is what CommitResponse committed in a run, on the
// capture c (net/http, Gin, Echo) or on resp (Fiber).
func committedBytes(c *Capture, resp Response) []byte {
	if c != nil {
		return c.stored
	}
	if cr, ok := resp.(CommittedResponse); ok {
		return cr.Committed()
	}
	return nil
}

// runContext is the guarded handler's context: the held lease's
// (guard.Held.Context), carrying the claim (ClaimFrom, CommitResponse) as
// context.WithValue would, without its two allocations.
type runContext struct {
	context.Context
	info *claimInfo
}

// Value returns the claim for claimKey and asks the lease's context for
// any other key.
func (c *runContext) Value(key any) any {
	if _, ok := key.(claimKey); ok {
		return c.info
	}
	return c.Context.Value(key)
}

// finish stores the handler's response (or a marker, or releases the key
// for a status that releases it, or a 101) and then lets the held response
// go to the client.
func (m *Engine) finish(r Request, held *guard.Held, resp Response, info *claimInfo) {
	res := resp.Result()
	status := res.Status
	var result []byte
	switch {
	case (res.Release || info.unfinished) && res.Stored == nil:
		// CommitResponse answered without committing, or a Guard inside
		// this one answered "retry later" (unfinished): nothing is final.
		// (One that committed stays the answer, whatever a later call
		// refused.) A Guard around this one hears it too: the inner
		// answer is not final for its key either.
		if info.unfinished {
			unfinished(r)
		}
		m.end.Release(held)
		resp.Send()
		return
	case status == http.StatusSwitchingProtocols, res.Hijacked && status == 0 && asksUpgrade(r):
		// The handler switched protocols (a WebSocket): no answer a
		// replay could repeat, and no final answer to the key. Like a
		// 5xx, it is released, so that an upgrade with the key runs the
		// handler again, once the session ended. A handler that takes
		// the connection of a request to upgrade without a status
		// writes its 101 on it (gorilla/websocket,
		// httputil.ReverseProxy).
		m.end.Release(held)
		if !res.Hijacked {
			resp.Send()
		}
		return
	case res.Stored != nil:
		result = res.Stored // the bytes CommitResponse committed
	case res.Hijacked:
		if status < 200 {
			// The handler took the connection without a status (a
			// middleware that sheds load by closing it, or one that
			// writes its own answer on it): what the client got, if
			// anything, is not known. A 500, as fiberx keeps for a
			// connection closed under the response, not a success the
			// client may never have had.
			status = http.StatusInternalServerError
		}
		result = encodeResponse(storedResponse{status: status, notKept: notKeptHijacked})
	case res.Abandoned:
		result = encodeResponse(storedResponse{status: http.StatusRequestTimeout, notKept: notKeptBypassed})
	case m.releases(status), status < 200, status > 999:
		// A status no client takes for a final answer (fasthttp sends a
		// 1xx the handler set as its response; net/http panics on one
		// below 100 or above 999) is not one a replay could repeat, nor
		// one the record format keeps: like a 101, it is released.
		m.end.Release(held)
		resp.Send()
		return
	case res.TooLarge:
		result = encodeResponse(storedResponse{status: status, notKept: notKeptTooLarge})
	case res.Bypassed:
		result = encodeResponse(storedResponse{status: status, notKept: notKeptBypassed})
	case res.CutShort && r.Method() != http.MethodHead:
		// The client got a response cut off, not an answer to replay;
		// the handler ran all the same, and is not run again.
		result = encodeResponse(storedResponse{status: status, notKept: notKeptCutShort})
	case res.Streamed:
		result = encodeResponse(storedResponse{status: status, notKept: notKeptStreamed})
	default:
		fields := res.fields
		if fields == nil {
			var scratch [16]snapField
			fields = fieldsOf(res.Header, scratch[:])
		}
		result = m.encodeHandlerResponse(status, res.Before, fields, res.trailers, res.Body, res.Untyped)
	}
	m.end.Complete(held, result, "path", r.Path())
	if !res.Hijacked {
		resp.Send()
	}
}

// releases reports whether a response with status releases the key
// rather than being stored: a 5xx, and the statuses that say the request
// was not done and ask for it again (408 Request Timeout, 429 Too Many
// Requests, 499 client closed request: grpcx's DeadlineExceeded,
// ResourceExhausted and Canceled), unless Options.Store5xx. Stored, one
// of these would answer the retry it asks for, under the same key, for
// the whole TTL.
func (m *Engine) releases(status int) bool {
	if m.opts.Store5xx {
		return false
	}
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, statusClientClosed:
		return true
	}
	return status >= 500
}

// statusClientClosed is nginx's 499 (the client closed the request), the
// HTTP status of gRPC's Canceled.
const statusClientClosed = 499

// asksUpgrade reports whether r asks to switch protocols: an Upgrade
// field, and "upgrade" among the Connection field's options (RFC 9110
// section 7.8).
func asksUpgrade(r Request) bool {
	if len(r.HeaderValues("Upgrade")) == 0 {
		return false
	}
	for _, v := range r.HeaderValues("Connection") {
		for opt := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(opt), "upgrade") {
				return true
			}
		}
	}
	return false
}

type claimKey struct{}

// claimInfo is what a guarded handler's context carries: its claim, and
// for CommitResponse the capture it writes to and the middleware.
type claimInfo struct {
	lease       guard.Lease
	fingerprint string
	route       string // Options.Scope of the request
	c           *Capture
	m           *Engine
	// unfinished: a Guard inside this run answered the request with a
	// "retry later" or not at all (unfinished); release, store nothing.
	unfinished bool
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint: what a handler passes to downstream writes
// (lease.Fence). A handler that commits a SQL backstop row should do it
// through CommitResponse, which stores the response the client receives.
// ok is false outside a guarded run (a safe method, an optional key).
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(*claimInfo)
	if !ok {
		return guard.Lease{}, "", false
	}
	return c.lease, c.fingerprint, true
}

// ConfigOf resolves an httpx.Options (opts) into a Config whose panics
// name name ("ginx.Guard"). Package httpx sets it when it is initialised,
// so a binding that imports httpx can use it; httpcore cannot name
// httpx.Options without an import cycle.
var ConfigOf func(opts any, name string) Config
