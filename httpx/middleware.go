// Package httpx makes net/http handlers idempotent with a guard.Guard, and
// gives clients a transport that retries safely.
//
// Guard is middleware for any router (ServeMux, chi, gorilla/mux, ...). It
// follows the IETF draft "The Idempotency-Key HTTP Header Field" and
// Stripe: the first request with a key runs the handler and its response is
// stored; a repeat with the same key and the same request gets the stored
// response, byte for byte, with "Idempotent-Replayed: true", and the
// handler does not run again. A repeat while the first still runs gets 409
// with Retry-After; a repeat with another request under the same key gets
// 422. Every response the middleware writes itself is an RFC 9457
// application/problem+json document with a stable type URI (the Problem*
// constants).
//
// Transport is the client side: it gives POST and PATCH requests a key and
// retries them with that same key.
package httpx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/guard"
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

// Options configure Guard. The zero value is ready to use.
type Options struct {
	// Header is the request header that carries the key. Default
	// DefaultHeader ("Idempotency-Key").
	Header string
	// Methods are the request methods that are guarded; others pass
	// through untouched and never reach the store. Default POST and PATCH.
	Methods []string
	// Optional lets a request without a key through, unguarded. By default
	// a guarded method without a key gets 400.
	Optional bool
	// Scope names the operation a key belongs to; keys of different scopes
	// never meet. Default DefaultScope: method and route pattern.
	Scope func(r *http.Request) string
	// Tenant, if set, names the caller (from auth, say); its value, quoted,
	// prefixes the scope, so one tenant's key never replays another's
	// response.
	Tenant func(r *http.Request) string
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
	// ReplayHeader reports whether a response header (canonical name) is
	// stored and replayed. Default DefaultReplayHeader, which drops
	// hop-by-hop fields and Set-Cookie. Fields named in the response's
	// Connection header are always dropped.
	ReplayHeader func(name string) bool
	// Store5xx keeps 5xx responses like any other. By default a 5xx
	// releases the key, so a retry runs the handler again.
	Store5xx bool
	// InFlightStatus is the status for a key whose first request still
	// runs. Default 409 Conflict; some APIs use 429.
	InFlightStatus int
	// UnavailableRetryAfter is the Retry-After sent with 503 when the store
	// cannot be reached. Default DefaultRetryAfter (1 s).
	UnavailableRetryAfter time.Duration
	// Logger hears about handler panics and results that could not be
	// stored. Default slog.Default().
	Logger *slog.Logger
}

// Guard returns middleware that runs each keyed request's handler once per
// key within g's retention, and replays its response to repeats.
//
// Guarantees, for requests whose method is in Options.Methods:
//   - the handler runs at most once per (scope, key) while the key is
//     remembered, however many requests carry it, concurrently or not;
//   - a request rejected before the handler (400, 413, 422, 409, 503)
//     stores nothing;
//   - a handler that panics gets the client a 500 and releases the key, so
//     a retry runs it again; a 5xx response does too unless Store5xx;
//   - a completed response is stored even if the client hung up; if it
//     cannot be stored, the client still gets the real response;
//   - the response of a guarded request reaches the client only after it
//     was stored, unless the handler flushes or it is larger than
//     MaxStoredResponse (then it streams).
//
// Guard uses g's Claim, Extend, Complete and Release directly rather than
// Do, because a 5xx must release the key (Do would record a failure) and a
// panic must become a 500 after the release.
func Guard(g *guard.Guard, opts Options) func(http.Handler) http.Handler {
	if g == nil {
		panic("httpx.Guard: nil guard")
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
	if m.opts.UnavailableRetryAfter <= 0 {
		m.opts.UnavailableRetryAfter = DefaultRetryAfter
	}
	if m.opts.Logger == nil {
		m.opts.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}
}

// DefaultScope is the method and the route pattern the router matched
// (r.Pattern, set by ServeMux and by chi for route-level middleware), or the
// escaped path when no pattern is known (chi's r.Use, gorilla/mux).
func DefaultScope(r *http.Request) string {
	route := r.Pattern
	if route == "" {
		route = r.URL.EscapedPath()
	} else if i := strings.IndexAny(route, " \t"); i >= 0 {
		route = strings.TrimLeft(route[i:], " \t") // drop the pattern's own method
	}
	return r.Method + " " + route
}

// DefaultFingerprint is a SHA-256, in hex, over the method, the escaped
// path and query, the Content-Type and the body.
func DefaultFingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	for _, s := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type")} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		io.WriteString(h, s)
	}
	h.Write(body)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// dropped are the response fields DefaultReplayHeader leaves out.
var dropped = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Set-Cookie": true, ReplayedHeader: true,
}

// DefaultReplayHeader keeps every response field except the hop-by-hop
// ones (RFC 9110 section 7.6.1), trailers and Set-Cookie (a cookie is
// for one client and one moment; replaying it could hand a session on).
func DefaultReplayHeader(name string) bool {
	return !dropped[name] && !strings.HasPrefix(name, http.TrailerPrefix)
}

type middleware struct {
	g       *guard.Guard
	opts    Options
	methods map[string]bool
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(m.opts.Header)
	switch len(values) {
	case 0:
		if m.opts.Optional {
			next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, Problem{Type: ProblemMissingKey, Status: http.StatusBadRequest,
			Title:  "Idempotency key missing",
			Detail: fmt.Sprintf("%s %s requires an %s header", r.Method, r.URL.Path, m.opts.Header)})
		return
	case 1:
	default:
		writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
			Title:  "Idempotency key malformed",
			Detail: fmt.Sprintf("%d %s fields; send exactly one", len(values), m.opts.Header)})
		return
	}
	id, err := ParseKey(values[0])
	if err != nil {
		writeProblem(w, Problem{Type: ProblemMalformedKey, Status: http.StatusBadRequest,
			Title: "Idempotency key malformed", Detail: err.Error()})
		return
	}

	body, ok := m.readBody(w, r, id)
	if !ok {
		return
	}
	key := guard.Key{Scope: m.scope(r), ID: id}
	fingerprint := m.opts.Fingerprint(r, body)

	// Claim even if the client hangs up meanwhile: a claim cut off after
	// the store took it would lock the key for a whole lease. Guard.Claim
	// bounds the call itself (half a lease).
	out, err := m.g.Claim(context.WithoutCancel(r.Context()), key, fingerprint)
	if err != nil {
		m.rejectClaim(w, id, err)
		return
	}
	if out.Status == guard.Replay {
		m.replay(w, r, id, out.Result)
		return
	}
	if r.Context().Err() != nil {
		// The client left before the handler ran: nothing happened yet.
		m.release(r, out.Lease)
		return
	}
	m.run(w, r.WithContext(context.WithValue(r.Context(), claimKey{}, claimInfo{out.Lease, fingerprint})), next, out.Lease)
}

// readBody reads the whole request body, up to MaxBody, and puts it back
// for the handler. It answers 413 or 400 itself and reports false.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request, id string) ([]byte, bool) {
	tooLarge := func() {
		writeProblem(w, Problem{Type: ProblemBodyTooLarge, Status: http.StatusRequestEntityTooLarge,
			Title: "Request body too large", Key: id,
			Detail: fmt.Sprintf("the body is limited to %d bytes", m.opts.MaxBody)})
	}
	if r.ContentLength > m.opts.MaxBody {
		tooLarge()
		return nil, false
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.opts.MaxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			tooLarge()
		} else {
			writeProblem(w, Problem{Type: ProblemBodyUnreadable, Status: http.StatusBadRequest,
				Title: "Request body unreadable", Key: id, Detail: err.Error()})
		}
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// scope is the key's scope: Options.Scope, prefixed by the quoted tenant.
// A scope the store would refuse (too long, control bytes) is replaced by
// its digest.
func (m *middleware) scope(r *http.Request) string {
	s := m.opts.Scope(r)
	if m.opts.Tenant != nil {
		s = strconv.Quote(m.opts.Tenant(r)) + " " + s
	}
	if (guard.Key{Scope: s, ID: "-"}).Validate() != nil {
		sum := sha256.Sum256([]byte(s))
		s = "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

// rejectClaim answers a claim that did not give the key to this request.
func (m *middleware) rejectClaim(w http.ResponseWriter, id string, err error) {
	var inProgress *guard.InProgressError
	switch {
	case errors.As(err, &inProgress):
		writeProblem(w, Problem{Type: ProblemInFlight, Status: m.opts.InFlightStatus,
			Title: "Request with this key in progress", Key: id,
			Detail: "the first request with this key has not finished; retry after the delay given"},
			"Retry-After", retryAfter(inProgress.RetryAfter))
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
			Title: "Idempotency key malformed", Key: id, Detail: err.Error()})
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, Problem{Type: ProblemStoreUnavailable, Status: http.StatusServiceUnavailable,
			Title: "Idempotency store unavailable", Key: id,
			Detail: "the request was not run; retry later with the same key"},
			"Retry-After", retryAfter(m.opts.UnavailableRetryAfter))
	default:
		m.opts.Logger.Error("httpx: idempotency claim failed", "key", id, "err", err)
		writeProblem(w, Problem{Type: ProblemStoreError, Status: http.StatusInternalServerError,
			Title: "Idempotency store error", Key: id, Detail: "the request was not run"})
	}
}

// replay writes a stored response.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, id string, result []byte) {
	sr, err := decodeResponse(result)
	if err != nil {
		m.opts.Logger.Error("httpx: stored response unreadable", "key", id, "path", r.URL.Path, "err", err)
		writeProblem(w, Problem{Type: ProblemCorruptResponse, Status: http.StatusInternalServerError,
			Title: "Stored response unreadable", Key: id,
			Detail: "the request with this key ran, but its stored response cannot be read"})
		return
	}
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
	h := w.Header()
	for k, vs := range sr.header {
		h[k] = vs
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
}

// run calls the handler under lease and stores or releases the outcome.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, lease guard.Lease) {
	ctx, stop := m.g.KeepAlive(r.Context(), lease)
	c := &capture{w: w, max: m.opts.MaxStoredResponse}
	returned := false
	defer func() {
		if returned {
			return
		}
		p := recover()
		stop()
		m.release(r, lease)
		if p == nil {
			return // runtime.Goexit: let it go on
		}
		if p == http.ErrAbortHandler {
			panic(p) // the handler's way to cut the response off; net/http handles it
		}
		m.opts.Logger.Error("httpx: handler panicked; idempotency key released",
			"key", lease.Key.ID, "path", r.URL.Path, "panic", p)
		if c.committed || c.hijacked {
			panic(http.ErrAbortHandler) // part of the response is out: cut it off
		}
		clear(w.Header())
		writeProblem(w, Problem{Type: ProblemHandlerPanic, Status: http.StatusInternalServerError,
			Title: "Internal server error", Key: lease.Key.ID,
			Detail: "the handler failed; the key was released, retry with the same key"})
	}()
	next.ServeHTTP(c, r.WithContext(ctx))
	returned = true
	stop()
	m.finish(r, c, lease)
}

// finish stores the handler's response (or a marker, or releases the key
// for a 5xx) and then lets the held response go to the client.
func (m *middleware) finish(r *http.Request, c *capture, lease guard.Lease) {
	if !c.wroteHeader && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
	status := c.status
	var sr storedResponse
	switch {
	case c.hijacked:
		if status < 200 {
			status = http.StatusOK
		}
		sr = storedResponse{status: status, notKept: notKeptHijacked}
	case status >= 500 && !m.opts.Store5xx:
		m.release(r, lease)
		c.commit()
		return
	case c.tooLarge:
		sr = storedResponse{status: status, notKept: notKeptTooLarge}
	default:
		sr = storedResponse{status: status, header: m.replayable(c.header), body: c.buf.Bytes()}
	}
	if err := m.g.Complete(r.Context(), lease, encodeResponse(sr)); err != nil {
		// The handler ran; the client gets its real response anyway.
		m.opts.Logger.Error("httpx: response not stored; a retry with this key may run the handler again",
			"key", lease.Key.ID, "path", r.URL.Path, "err", err)
	}
	if !c.hijacked {
		c.commit()
	}
}

// replayable returns the fields of h that are stored for replays.
func (m *middleware) replayable(h http.Header) http.Header {
	var conn map[string]bool
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if conn == nil {
					conn = map[string]bool{}
				}
				conn[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		if len(vs) > 0 && !conn[k] && m.opts.ReplayHeader(k) {
			out[k] = vs
		}
	}
	return out
}

// release undoes the claim, even if the client is gone.
func (m *middleware) release(r *http.Request, lease guard.Lease) {
	if err := m.g.Release(r.Context(), lease); err != nil {
		m.opts.Logger.Warn("httpx: idempotency key not released; it frees when its lease ends",
			"key", lease.Key.ID, "err", err)
	}
}

type claimKey struct{}

type claimInfo struct {
	lease       guard.Lease
	fingerprint string
}

// ClaimFrom returns, inside a guarded handler, the lease it runs under and
// the request's fingerprint: what a handler passes to downstream writes
// (lease.Fence) or to sqlbackstop's Commit in its business transaction.
// ok is false outside a guarded run (a safe method, an optional key).
func ClaimFrom(ctx context.Context) (lease guard.Lease, fingerprint string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(claimInfo)
	return c.lease, c.fingerprint, ok
}
