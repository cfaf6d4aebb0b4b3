package httpx

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
	"github.com/idemguard/idemguard/inventory"
)

// Defaults for Options.
const (
	DefaultHeader            = "Idempotency-Key"
	DefaultMaxBody           = 1 << 20 // bytes of request body read and fingerprinted
	DefaultMaxStoredResponse = 1 << 20 // bytes of response body kept for replays
	DefaultRetryAfter        = time.Second
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Options configure Guard. Every field's zero value is its default, except
// that exactly one of Tenant and SingleCaller must be chosen: a Guard that
// would let one caller's key replay another caller's response is built
// only on purpose.
type Options struct {
	// Tenant names the caller a request comes from: the account, user or
	// client an authentication middleware in front of the Guard
	// established. Its value, quoted, prefixes every key's scope, so one
	// caller's key never meets another's: the same key and body from two
	// callers run twice and replay to each its own response.
	//
	// Name the caller, never its credential: a client that refreshes its
	// bearer token between two retries is still the same caller, and its
	// retry must be replayed, not run again. TenantFromContext and
	// TenantFromJWT read what the authentication middleware stored in the
	// request context. A request for which Tenant returns "" is answered
	// 401 (ProblemCallerUnknown), and nothing is stored.
	Tenant func(r *http.Request) string
	// SingleCaller declares that one caller owns every key this Guard
	// sees: an internal service with a single client, or one behind a
	// gateway that already gives each caller keys of its own. Keys are
	// then not scoped by caller, and two callers that send the same key
	// and body get one response. Set it instead of Tenant, never with it.
	SingleCaller bool
	// CallerScope says, for the idempotency inventory, what Tenant names:
	// inventory.ScopeTenant (an account, organisation or client; the
	// default with Tenant) or inventory.ScopeUser (one user, as
	// TenantFromJWT's subject is). It changes nothing else: keys are kept
	// apart by Tenant's value either way. With SingleCaller it is
	// inventory.ScopeGlobal; Guard panics on another choice.
	CallerScope inventory.Scope

	// Header is the request header that carries the key. Default
	// DefaultHeader ("Idempotency-Key").
	Header string
	// Key says where the key comes from: the zero value is Header;
	// KeyFromBody reads a field of the JSON body; ComputedKey derives a
	// key from the request for clients that send none (read its doc for
	// when that is wrong). The choice is per Guard, so per route or route
	// group.
	Key KeySource
	// Methods are the request methods that are guarded; others pass
	// through untouched and never reach the store. Default POST and PATCH.
	Methods []string
	// Optional lets a request without a key through, unguarded. By default
	// a guarded method without a key gets 400. It cannot be set with
	// ComputedKey, which gives every request a key.
	Optional bool
	// Scope names the operation a key belongs to; keys of different scopes
	// never meet. The caller (Tenant) is added to it. Default DefaultScope:
	// method and route pattern.
	Scope func(r *http.Request) string
	// Fingerprint digests the request; the same key with another
	// fingerprint gets 422. body is the whole request body. Default
	// DefaultFingerprint.
	Fingerprint func(r *http.Request, body []byte) string
	// MaxBody is the largest request body accepted, in bytes; a larger one
	// gets 413 before anything is stored. Default DefaultMaxBody (1 MiB).
	MaxBody int64
	// MaxStoredResponse is the largest response body kept for replay, in
	// bytes. A larger response still reaches the client, streamed; the key
	// is completed with a marker, and a replay answers the original status
	// with a problem body saying the response was not kept (the handler
	// does not run again). Default DefaultMaxStoredResponse (1 MiB).
	MaxStoredResponse int
	// ReplayHeader reports whether a response header field (canonical
	// name) that the handler set is stored and replayed. Default
	// DefaultReplayHeader, which leaves out Set-Cookie,
	// Authentication-Info and Proxy-Authentication-Info. Only fields the
	// handler set or changed are ever stored, and never hop-by-hop fields
	// (see DefaultReplayHeader for the whole rule).
	ReplayHeader func(name string) bool
	// Store5xx keeps 5xx responses like any other. By default a 5xx
	// releases the key, so a retry runs the handler again.
	Store5xx bool
	// InFlightStatus is the status for a key whose first request still
	// runs. Default 409 Conflict; some APIs use 429. Its Retry-After says
	// when the first request's response is likely ready: the route's
	// recent run time on this instance, at least 1 s, at most what is left
	// of the first request's lease.
	InFlightStatus int
	// Wait lets a request whose key's first request is still running wait
	// for that request's response, on this instance or another, for up to
	// Wait, and then answer with its replay (or with InFlightStatus when
	// Wait passes first). While it waits it polls the guard: a read of the
	// key's record after 10 ms, then twice as late each time, at most
	// 100 ms apart, and one claim when the record is no longer pending.
	// For a first request that takes 100 ms that is about 4 reads and a
	// claim; each further second of waiting costs about 10 reads. A waiting
	// request holds its connection and a goroutine.
	//
	// Default 0: answer InFlightStatus at once, as Stripe does (409
	// idempotency_key_in_use); its clients, and NewClient, retry after
	// Retry-After. Turn it on when clients do not retry 409 on their own,
	// or answers must come sooner than a retry's second.
	Wait time.Duration
	// UnavailableRetryAfter is the Retry-After sent with 503 when the store
	// cannot be reached. Default DefaultRetryAfter (1 s).
	UnavailableRetryAfter time.Duration
	// Logger hears about handler panics and results that could not be
	// stored. Default slog.Default().
	Logger *slog.Logger
	// LogKeys writes idempotency keys to the log in full ("scope" and "id"
	// attributes). By default a record names a key only by a short digest
	// ("key": 12 hex digits of SHA-256 over scope and id, the same as
	// metrics.KeyDigest), enough to follow one key through the logs but not
	// to replay its response: a key and its route are what fetch a stored
	// response.
	LogKeys bool
}

// Guard returns middleware that runs each keyed request's handler once per
// key within g's retention, and replays its response to repeats.
//
// Guarantees, for requests whose method is in Options.Methods:
//   - the handler runs at most once per (caller, scope, key) while the key
//     is remembered, however many requests carry it, concurrently or not;
//     keys of different callers (Options.Tenant) never meet;
//   - a request rejected before the handler (400, 401, 413, 422, 409,
//     503) stores nothing;
//   - a handler that panics gets the client a 500 and releases the key, so
//     a retry runs it again; a 5xx response does too unless Store5xx;
//   - a completed response is stored even if the client hung up; if it
//     cannot be stored, the client still gets the real response; a store
//     that cannot be reached is retried for up to 2 s, and then the key is
//     released if it can be, so that it is not left pending for a lease;
//   - the response of a guarded request reaches the client only after it
//     was stored, unless the handler flushes or it is larger than
//     MaxStoredResponse (then it streams);
//   - a replay carries the stored status, body and the header fields the
//     handler set (DefaultReplayHeader says which are kept), over the
//     current values of every other field.
//
// Guard panics, as http.Handle does on a programmer's error, when g is nil
// or when Options choose neither or both of Tenant and SingleCaller: a
// Guard that silently shared keys across callers would replay one caller's
// response to another.
//
// Guard uses g's Claim, Extend, Complete and Release directly rather than
// Do, because a 5xx must release the key (Do would record a failure) and a
// panic must become a 500 after the release.
func Guard(g *guard.Guard, opts Options) func(http.Handler) http.Handler {
	if g == nil {
		panic("httpx.Guard: nil guard")
	}
	switch {
	case opts.Tenant == nil && !opts.SingleCaller:
		panic("httpx.Guard: choose how keys are scoped by caller: set Options.Tenant (e.g. httpx.TenantFromContext " +
			"or httpx.TenantFromJWT) to keep each caller's keys apart, or Options.SingleCaller for a service with " +
			"one caller; without either, a caller could be replayed another caller's response")
	case opts.Tenant != nil && opts.SingleCaller:
		panic("httpx.Guard: Options.Tenant and Options.SingleCaller are both set; choose one")
	case opts.Tenant != nil && opts.CallerScope != "" && opts.CallerScope != inventory.ScopeTenant && opts.CallerScope != inventory.ScopeUser:
		panic(fmt.Sprintf("httpx.Guard: Options.CallerScope %q with Options.Tenant: want inventory.ScopeTenant or inventory.ScopeUser", opts.CallerScope))
	case opts.SingleCaller && opts.CallerScope != "" && opts.CallerScope != inventory.ScopeGlobal:
		panic(fmt.Sprintf("httpx.Guard: Options.CallerScope %q with Options.SingleCaller: keys are not kept per caller (inventory.ScopeGlobal)", opts.CallerScope))
	case opts.Key.kind == inventory.KeyComputed && opts.Optional:
		panic("httpx.Guard: Options.Optional with a ComputedKey: every request gets a computed key, so none runs unguarded; drop Optional")
	}
	m := &middleware{g: g, opts: opts, methods: map[string]bool{}}
	if m.opts.Header == "" {
		m.opts.Header = DefaultHeader
	}
	m.opts.Header = textproto.CanonicalMIMEHeaderKey(m.opts.Header)
	methods := opts.Methods
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
	if m.opts.UnavailableRetryAfter <= 0 {
		m.opts.UnavailableRetryAfter = DefaultRetryAfter
	}
	if m.opts.Logger == nil {
		m.opts.Logger = slog.Default()
	}
	m.policy = m.makePolicy(methods)
	return func(next http.Handler) http.Handler {
		return &guardedHandler{m: m, next: next}
	}
}

// guardedHandler is what the middleware Guard returns makes of a handler.
type guardedHandler struct {
	m    *middleware
	next http.Handler
}

func (h *guardedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.m.serve(w, r, h.next) }

// IdempotencyPolicy reports what the guard enforces, for the idempotency
// inventory (inventory.Guarded): how a key is required, where it comes
// from, whose keys are kept apart, the guard's TTL and the methods
// guarded.
func (h *guardedHandler) IdempotencyPolicy() inventory.Policy {
	p := h.m.policy
	p.Methods = slices.Clone(p.Methods)
	return p
}

// Unwrap returns the handler the guard runs.
func (h *guardedHandler) Unwrap() http.Handler { return h.next }

// makePolicy describes the guard for the inventory.
func (m *middleware) makePolicy(methods []string) inventory.Policy {
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

// DefaultScope is the method and the route pattern the router matched
// (r.Pattern, set by ServeMux and by chi for route-level middleware), or the
// escaped path when no pattern is known (chi's r.Use, gorilla/mux).
func DefaultScope(r *http.Request) string {
	route := r.Pattern
	if route == "" {
		route = r.URL.EscapedPath()
	} else if i := strings.IndexAny(route, " \t"); i >= 0 {
		if route[:i] == r.Method && i+1 < len(route) && route[i] == ' ' && route[i+1] != ' ' && route[i+1] != '\t' {
			return route // "POST /orders" for a POST: the scope already, as is
		}
		route = strings.TrimLeft(route[i:], " \t") // drop the pattern's own method
	}
	return r.Method + " " + route
}

// DefaultFingerprint is a SHA-256, in hex, over the method, the escaped
// path and query, the Content-Type and the body.
func DefaultFingerprint(r *http.Request, body []byte) string {
	d := getDigester()
	defer d.put()
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type")} {
		d.field(s)
	}
	d.flush()
	d.h.Write(body)
	return d.hex("")
}

type middleware struct {
	g       *guard.Guard
	opts    Options
	methods map[string]bool
	runs    runTimes
	policy  inventory.Policy
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	route := m.opts.Scope(r)
	id, body, read, ok := m.requestKey(w, r, route)
	if !ok {
		return // answered
	}
	if id == "" {
		next.ServeHTTP(w, r) // Optional, and the request has no key
		return
	}
	scope, ok := m.scope(r, route)
	if !ok {
		writeProblem(w, Problem{Type: ProblemCallerUnknown, Status: http.StatusUnauthorized,
			Title: "Caller unknown", Key: id,
			Detail: "idempotency keys are kept per caller, and this request names none; authenticate and retry"})
		return
	}
	if !read {
		if body, ok = m.readBody(w, r, id); !ok {
			return
		}
	}
	key := guard.Key{Scope: scope, ID: id}
	fingerprint := m.opts.Fingerprint(r, body)

	// Claim even if the client hangs up meanwhile: a claim cut off after
	// the store took it would lock the key for a whole lease. Guard.Claim
	// bounds the call itself (half a lease). The writes that end the
	// claim (complete, release) outlive a hang-up too, on the same
	// context.
	dctx := context.WithoutCancel(r.Context())
	out, err := m.g.Claim(dctx, key, fingerprint)
	if _, busy := errors.AsType[*guard.InProgressError](err); busy && m.opts.Wait > 0 {
		out, err, ok = m.wait(r, key, fingerprint)
		if !ok {
			return // the client left while waiting; nothing was claimed
		}
	}
	if err != nil {
		m.rejectClaim(w, key, route, err)
		return
	}
	if out.Status == guard.Replay {
		m.replay(w, r, key, out.Result)
		return
	}
	if r.Context().Err() != nil {
		// The client left before the handler ran: nothing happened yet.
		m.release(dctx, out.Lease)
		return
	}
	m.run(w, r, dctx, next, out.Lease, fingerprint, route)
}

// requestKey finds the request's key where Options.Key says. It answers
// 400 (or 413, reading a body) itself and reports ok false; id is "" with
// ok true for a request without a key that Optional lets through. read
// reports whether body holds the request body already (body and computed
// keys read it first).
func (m *middleware) requestKey(w http.ResponseWriter, r *http.Request, route string) (id string, body []byte, read, ok bool) {
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
				Detail: fmt.Sprintf("%s %s requires an idempotency key in the JSON body at %s", r.Method, r.URL.Path, m.opts.Key.pointer)})
		default:
			writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
				Title: "Idempotency key malformed", Detail: err.Error()})
		}
		return "", nil, false, false
	case inventory.KeyComputed:
		if len(r.Header.Values(m.opts.Header)) > 0 {
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
func (m *middleware) headerKey(w http.ResponseWriter, r *http.Request) (id string, ok bool) {
	values := r.Header.Values(m.opts.Header)
	switch len(values) {
	case 0:
		if m.opts.Optional {
			return "", true
		}
		writeProblem(w, Problem{Type: ProblemMissingKey, Status: http.StatusBadRequest,
			Title:  "Idempotency key missing",
			Detail: fmt.Sprintf("%s %s requires an %s header", r.Method, r.URL.Path, m.opts.Header)})
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

// readBody reads the whole request body, up to MaxBody, and puts it back
// for the handler. It answers 413 or 400 itself and reports false.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request, id string) ([]byte, bool) {
	if r.ContentLength > m.opts.MaxBody {
		m.tooLarge(w, id)
		return nil, false
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	body, err := m.readAll(w, r)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			m.tooLarge(w, id)
		} else {
			writeProblem(w, Problem{Type: ProblemBodyUnreadable, Status: http.StatusBadRequest,
				Title: "Request body unreadable", Key: id, Detail: err.Error()})
		}
		return nil, false
	}
	held := &heldBody{}
	held.Reset(body)
	r.Body = held
	return body, true
}

// exactRead is the largest declared Content-Length read into a buffer of
// that size at once; a longer body grows its buffer as it arrives, so a
// client that declares a large body and sends nothing holds little.
const exactRead = 32 << 10

// readAll reads r's body, up to MaxBody (an error wrapping
// *http.MaxBytesError past it). A body whose length is declared, and
// small, is read into one buffer of that length (and a byte more, to see
// it end).
func (m *middleware) readAll(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	n := r.ContentLength
	if n < 0 || n > exactRead {
		return io.ReadAll(http.MaxBytesReader(w, r.Body, m.opts.MaxBody))
	}
	buf := make([]byte, n+1)
	k := 0
	for k < len(buf) {
		c, err := r.Body.Read(buf[k:])
		k += c
		if err == io.EOF && k < len(buf) {
			return buf[:k], nil
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
	return io.ReadAll(http.MaxBytesReader(w, rest, m.opts.MaxBody))
}

// tooLarge answers 413.
func (m *middleware) tooLarge(w http.ResponseWriter, id string) {
	writeProblem(w, Problem{Type: ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
		Title: "Request body too large", Key: id,
		Detail: fmt.Sprintf("the body is limited to %d bytes", m.opts.MaxBody)})
}

// heldBody is the request body the handler reads: the bytes the
// middleware read, in one allocation.
type heldBody struct{ bytes.Reader }

// Close does nothing: the body was read already.
func (*heldBody) Close() error { return nil }

// scope is the key's scope: route (Options.Scope), prefixed by the quoted
// caller (Options.Tenant). ok is false when Tenant names no caller. A scope
// the store would refuse (too long, control bytes) is replaced by its
// digest.
func (m *middleware) scope(r *http.Request, route string) (s string, ok bool) {
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
func (m *middleware) rejectClaim(w http.ResponseWriter, key guard.Key, route string, err error) {
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
		m.opts.Logger.Error("httpx: idempotency claim failed", append(m.logKey(key), "err", m.logErr(key, err))...)
		writeProblem(w, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: id, Detail: "the request was not run"})
	}
}

// inFlight answers a request whose key another request holds.
func (m *middleware) inFlight(w http.ResponseWriter, id, route string, leaseLeft time.Duration) {
	writeProblem(w, Problem{Type: ProblemInFlight, Status: m.opts.InFlightStatus,
		Title: "Request with this key in progress", Key: id,
		Detail: "another request with this key has not finished; retry after the delay given"},
		"Retry-After", retryAfter(m.inFlightRetryAfter(route, leaseLeft)))
}

// unavailable answers 503 with Retry-After.
func (m *middleware) unavailable(w http.ResponseWriter, id, detail string) {
	writeProblem(w, Problem{Type: ProblemStoreUnavailable, Status: http.StatusServiceUnavailable,
		Title: "Idempotency store unavailable", Key: id, Detail: detail},
		"Retry-After", retryAfter(m.opts.UnavailableRetryAfter))
}

// replay writes a stored response.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, key guard.Key, result []byte) {
	sr, err := parseResponse(result)
	if err != nil {
		m.opts.Logger.Error("httpx: stored response unreadable",
			append(m.logKey(key), "path", r.URL.Path, "err", m.logErr(key, err))...)
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
		}
		writeProblem(w, Problem{Type: ProblemResponseNotKept, Status: sr.status,
			Title: "Response not kept", Key: id,
			Detail: "the request with this key ran with this status, but its response was not stored: " + why},
			ReplayedHeader, "true")
		return
	}
	sr.setHeader(w.Header())
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
}

// run calls the handler under lease and stores or releases the outcome.
// dctx is the request's context without its cancellation, for the writes
// that end the claim.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, dctx context.Context, next http.Handler, lease guard.Lease, fingerprint, route string) {
	ctx, stop := m.g.KeepAlive(r.Context(), lease)
	// The capture, the claim the handler's context carries and that
	// context: one allocation.
	run := &guardedRun{}
	c := &run.c
	c.w, c.max = w, m.opts.MaxStoredResponse
	if h := w.Header(); len(h) > 0 {
		c.before = h.Clone()
	}
	c.buf = *bytes.NewBuffer(c.small[:0])
	run.info = claimInfo{lease: lease, fingerprint: fingerprint, route: route, c: c, m: m}
	run.ctx = runContext{Context: ctx, info: &run.info}
	returned := false
	defer func() {
		if returned {
			return
		}
		p := recover()
		stop()
		m.release(dctx, lease)
		if p == nil {
			return // runtime.Goexit: let it go on
		}
		if p == http.ErrAbortHandler {
			panic(p) // the handler's way to cut the response off; net/http handles it
		}
		m.opts.Logger.Error("httpx: handler panicked; idempotency key released",
			append(m.logKey(lease.Key), "path", r.URL.Path, "panic", p)...)
		if c.committed || c.hijacked {
			panic(http.ErrAbortHandler) // part of the response is out: cut it off
		}
		resetHeader(w.Header(), c.before)
		writeProblem(w, Problem{Type: ProblemHandlerPanic, Status: http.StatusInternalServerError,
			Title: "Internal server error", Key: lease.Key.ID,
			Detail: "the handler failed; the key was released, retry with the same key"})
	}()
	start := time.Now()
	next.ServeHTTP(c, r.WithContext(&run.ctx))
	returned = true
	m.runs.observe(route, time.Since(start))
	stop()
	m.finish(r, dctx, c, lease)
}

// guardedRun is what one guarded run of the handler needs, allocated
// together: the writer it writes to, its claim, and its context.
type guardedRun struct {
	c    capture
	info claimInfo
	ctx  runContext
}

// runContext is the guarded handler's context: the lease's (KeepAlive),
// carrying the claim (ClaimFrom, CommitResponse) as context.WithValue
// would, without its two allocations.
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
// for a 5xx) and then lets the held response go to the client.
func (m *middleware) finish(r *http.Request, dctx context.Context, c *capture, lease guard.Lease) {
	if !c.wroteHeader && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
	status := c.status
	var result []byte
	switch {
	case c.release:
		// CommitResponse answered without committing: nothing is final.
		m.release(dctx, lease)
		c.commit()
		return
	case c.stored != nil:
		result = c.stored // the bytes CommitResponse committed
	case c.hijacked:
		if status < 200 {
			status = http.StatusOK
		}
		result = encodeResponse(storedResponse{status: status, notKept: notKeptHijacked})
	case status >= 500 && !m.opts.Store5xx:
		m.release(dctx, lease)
		c.commit()
		return
	case c.tooLarge:
		result = encodeResponse(storedResponse{status: status, notKept: notKeptTooLarge})
	default:
		result = m.encodeHandlerResponse(status, c.before, c.header, c.buf.Bytes())
	}
	m.complete(r, dctx, lease, result)
	if !c.hijacked {
		c.commit()
	}
}

// complete stores result for lease, retrying while the store cannot be
// reached (settle). If it still cannot, it releases the key if it can, so
// the next request with it is not told 409 until the lease ends: with a
// SQL backstop under the guard, that request then finds the committed
// response; without one, it runs the handler again, as it would have once
// the lease ran out.
func (m *middleware) complete(r *http.Request, dctx context.Context, lease guard.Lease, result []byte) {
	err := settle(dctx, settleBudget, func(ctx context.Context) error { return m.g.Complete(ctx, lease, result) })
	if err == nil {
		return
	}
	if errors.Is(err, guard.ErrUnavailable) && m.lastRelease(dctx, lease) == nil {
		m.opts.Logger.Warn("httpx: response not stored (store unreachable); idempotency key released",
			append(m.logKey(lease.Key), "path", r.URL.Path, "err", m.logErr(lease.Key, err))...)
		return
	}
	// The handler ran; the client gets its real response anyway.
	m.opts.Logger.Error("httpx: response not stored; a retry with this key may run the handler again",
		append(m.logKey(lease.Key), "path", r.URL.Path, "err", m.logErr(lease.Key, err))...)
}

// lastRelease tries once more, briefly, to free a key whose completion
// could not be stored.
func (m *middleware) lastRelease(ctx context.Context, lease guard.Lease) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return m.g.Release(ctx, lease)
}

// release undoes the claim, retrying while the store cannot be reached
// (settle). dctx is the request's context without its cancellation: the
// key is released even if the client is gone.
func (m *middleware) release(dctx context.Context, lease guard.Lease) {
	if err := settle(dctx, settleBudget, func(ctx context.Context) error { return m.g.Release(ctx, lease) }); err != nil {
		m.opts.Logger.Warn("httpx: idempotency key not released; it frees when its lease ends",
			append(m.logKey(lease.Key), "err", m.logErr(lease.Key, err))...)
	}
}

type claimKey struct{}

// claimInfo is what a guarded handler's context carries: its claim, and
// for CommitResponse the capture it writes to and the middleware.
type claimInfo struct {
	lease       guard.Lease
	fingerprint string
	route       string // Options.Scope of the request
	c           *capture
	m           *middleware
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
