package httpx

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/httpcore"
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
	// Methods are the request methods that are guarded, in any case
	// ("patch", as browsers' fetch sends PATCH, is guarded as PATCH,
	// under PATCH's default scope); others pass through untouched and never
	// reach the store. Default POST and PATCH.
	Methods []string
	// Optional lets a request without a key through, unguarded. By default
	// a guarded method without a key gets 400. It cannot be set with
	// ComputedKey, which gives every request a key.
	Optional bool
	// Scope names the operation a key belongs to; keys of different scopes
	// never meet. The caller (Tenant) is added to it. Default DefaultScope:
	// method and route pattern. Neither it nor DefaultFingerprint holds the
	// host, since clients reach one service under several names (a port,
	// an alias) and a retry under another must replay: a router that picks
	// a host's handler outside the pattern it reports (gorilla/mux's
	// Host(), a host switch in front of chi) needs the host in Scope,
	// r.Host + " " + DefaultScope(r), or the same key and body on another
	// host is answered with the first host's response.
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
	// does not run again). So is a response whose body falls short of the
	// Content-Length it declared, which net/http cuts off. Default
	// DefaultMaxStoredResponse (1 MiB).
	MaxStoredResponse int
	// ReplayHeader reports whether a response header field (canonical
	// name) that the handler set (or removed) is stored and replayed.
	// Default DefaultReplayHeader, which leaves out Set-Cookie,
	// Authentication-Info and Proxy-Authentication-Info. Only fields the
	// handler set, changed or removed are ever stored, and never
	// hop-by-hop fields (see DefaultReplayHeader for the whole rule).
	ReplayHeader func(name string) bool
	// Store5xx keeps 5xx responses like any other. By default a 5xx
	// releases the key, so a retry runs the handler again; so do the
	// statuses that say the request was not done and ask for it again:
	// 408 Request Timeout, 429 Too Many Requests and 499 (client closed
	// request), as grpcx's DefaultRelease releases DeadlineExceeded,
	// ResourceExhausted and Canceled. Store5xx keeps those too.
	Store5xx bool
	// InFlightStatus is the status for a key whose first request still
	// runs. Default 409 Conflict; some APIs use 429 (NewClient knows the
	// answer by its problem type, ProblemInFlight, whatever its status,
	// and asks again without counting attempts). Its Retry-After says
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
	// cannot be reached. Default DefaultRetryAfter (1 s). While the
	// circuit breaker of a fallback.Store under the guard is open, the 503
	// says when it lets its first probe through, if that is later.
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
//     a retry runs it again (unless CommitResponse committed its effect
//     before the panic: that response is then stored and sent, or stored
//     and the connection cut for http.ErrAbortHandler); a 5xx, 408, 429
//     or 499 response does too unless Store5xx,
//     also one written after the handler's effect (say, because a call
//     made with the request's context failed when the client hung up):
//     once the effect has happened, answer its outcome; and so does the
//     503 of an http.TimeoutHandler between the Guard and the handler,
//     written while the handler runs on, so that each retry runs it again
//     beside the first: put TimeoutHandler outside the Guard;
//   - a handler that switches protocols (a WebSocket: it answered 101, or
//     took the connection of a request asking to upgrade without writing
//     a status) stores nothing and releases the key when it returns: a
//     request with the key in the meantime gets a 409, one after it runs
//     the handler again;
//     informational responses (103 Early Hints) go out at once and are
//     never stored;
//   - a completed response is stored even if the client hung up; if it
//     cannot be stored, the client still gets the real response; a store
//     that cannot be reached is retried for up to 2 s, and then the key is
//     released if it can be, so that it is not left pending for a lease;
//   - the response of a guarded request reaches the client only after it
//     was stored, unless the handler flushes or it is larger than
//     MaxStoredResponse (then it streams);
//   - a replay carries the stored status, body and the header fields the
//     handler set or removed (DefaultReplayHeader says which are kept),
//     over the current values of every other field.
//
// Guard panics, as http.Handle does on a programmer's error, when g is nil
// or when Options choose neither or both of Tenant and SingleCaller: a
// Guard that silently shared keys across callers would replay one caller's
// response to another.
//
// Guard holds the claim with g's Hold (and Wait and Keep), ending it with
// the Held's Complete or Release, rather than Do, because a 5xx must
// release the key (Do would record a failure) and a panic must become a
// 500 after the release.
func Guard(g *guard.Guard, opts Options) func(http.Handler) http.Handler {
	m := httpcore.New(g, opts.config("httpx.Guard"))
	return func(next http.Handler) http.Handler {
		return &guardedHandler{m: m, next: next}
	}
}

// The framework bindings (ginx, echox, fiberx) resolve the Options their
// users give them through httpcore.ConfigOf, which is config.
func init() {
	httpcore.ConfigOf = func(opts any, name string) httpcore.Config { return opts.(Options).config(name) }
}

// config resolves opts for the shared core of httpx.Guard and the
// framework bindings: name prefixes its panics ("ginx.Guard"). The funcs
// written for net/http (Tenant, Scope, Fingerprint) get the request as a
// *http.Request.
func (opts Options) config(name string) httpcore.Config {
	c := httpcore.Config{
		Name:              name,
		SingleCaller:      opts.SingleCaller,
		CallerScope:       opts.CallerScope,
		Header:            opts.Header,
		Key:               opts.Key.spec,
		Methods:           opts.Methods,
		Optional:          opts.Optional,
		MaxBody:           opts.MaxBody,
		MaxStoredResponse: opts.MaxStoredResponse,
		ReplayHeader:      opts.ReplayHeader,
		Store5xx:          opts.Store5xx,
		InFlightStatus:    opts.InFlightStatus,
		Wait:              opts.Wait,
		UnavailableRetry:  opts.UnavailableRetryAfter,
		Logger:            opts.Logger,
		LogKeys:           opts.LogKeys,
	}
	if t := opts.Tenant; t != nil {
		c.Tenant = func(r httpcore.Request) string { return t(r.HTTPRequest()) }
	}
	if s := opts.Scope; s != nil {
		c.Scope = func(r httpcore.Request) string { return s(r.HTTPRequest()) }
	}
	if f := opts.Fingerprint; f != nil {
		c.Fingerprint = func(r httpcore.Request, body []byte) string { return f(r.HTTPRequest(), body) }
	}
	return c
}

// guardedHandler is what the middleware Guard returns makes of a handler.
type guardedHandler struct {
	m    *httpcore.Engine
	next http.Handler
}

func (h *guardedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.m.ServeHTTP(w, r, h.next)
}

// IdempotencyPolicy reports what the guard enforces, for the idempotency
// inventory (inventory.Guarded): how a key is required, where it comes
// from, whose keys are kept apart, the guard's TTL and the methods
// guarded.
func (h *guardedHandler) IdempotencyPolicy() inventory.Policy { return h.m.Policy() }

// Unwrap returns the handler the guard runs.
func (h *guardedHandler) Unwrap() http.Handler { return h.next }

// DefaultScope is the method, in upper case, and the route pattern the router matched
// (r.Pattern, set by ServeMux and by chi for route-level middleware), or the
// escaped path when no pattern is known (chi's r.Use, gorilla/mux).
func DefaultScope(r *http.Request) string { return httpcore.DefaultScope(httpcore.NetRequest{R: r}) }

// DefaultFingerprint is a SHA-256, in hex, over the method, the escaped
// path and query, the Content-Type and the body.
func DefaultFingerprint(r *http.Request, body []byte) string {
	return httpcore.DefaultFingerprint(httpcore.NetRequest{R: r}, body)
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint: what a handler passes to downstream writes
// (lease.Fence). A handler that commits a SQL backstop row should do it
// through CommitResponse, which stores the response the client receives.
// ok is false outside a guarded run (a safe method, an optional key). It
// works the same inside the handlers of ginx, echox and fiberx, given the
// request's context.
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	return httpcore.ClaimFrom(ctx)
}
