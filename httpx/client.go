package httpx

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/internal/adapter"
)

// Defaults for TransportOptions.
const (
	DefaultMaxAttempts   = adapter.DefaultMaxAttempts    // 5
	DefaultBaseDelay     = adapter.DefaultBaseDelay      // 100 ms
	DefaultMaxDelay      = adapter.DefaultMaxDelay       // 10 s
	DefaultMaxRetryAfter = adapter.DefaultMaxServerDelay // 1 min

	DefaultInFlightDelay   = adapter.DefaultInFlightDelay   // 1 s
	DefaultMaxInFlightWait = adapter.DefaultMaxInFlightWait // 1 min
)

// TransportOptions configure a Transport. The zero value is ready to use.
type TransportOptions struct {
	// Base sends each attempt. Default http.DefaultTransport.
	Base http.RoundTripper
	// Header carries the key. Default DefaultHeader ("Idempotency-Key").
	Header string
	// Methods get a fresh key when they have none. Default POST and PATCH.
	// They match a request's method in any case, as the Guard's
	// Options.Methods do: a request made with "patch" (browsers' fetch
	// and some clients send it so; net/http sends it as written) gets a
	// key and is retried as "PATCH" would be, since the Guard guards it as
	// PATCH and would answer it 400 without a key. The method is sent as
	// the request spells it.
	Methods []string
	// NewKey makes a key. Default a UUIDv7 (uuid.NewV7), which sorts by
	// time and carries 62 random bits (google/uuid fills the 12 bits after
	// the milliseconds with finer time).
	NewKey func() (string, error)
	// MaxAttempts bounds the attempts of one request, the first included.
	// Default DefaultMaxAttempts (5).
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: before retry n (1, 2, ...)
	// the transport waits a uniformly random time in
	// [0, min(MaxDelay, BaseDelay·2^(n-1))) ("full jitter"), unless the
	// response said Retry-After. Defaults DefaultBaseDelay (100 ms) and
	// DefaultMaxDelay (10 s).
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// MaxRetryAfter is the longest Retry-After the transport waits for; a
	// longer one ends the retries and the response is returned. Default
	// DefaultMaxRetryAfter (1 min).
	MaxRetryAfter time.Duration
	// InFlightDelay is the longest the transport waits before asking again
	// about a request answered "in flight": the key's first request is
	// still running (see Transport for how such an answer is known). It
	// waits min(Retry-After, InFlightDelay) (at least BaseDelay), less up
	// to a fifth at random so the duplicates of one key spread out, and so
	// gets the first request's response within about InFlightDelay of it
	// being stored. Default DefaultInFlightDelay (1 s).
	InFlightDelay time.Duration
	// MaxInFlightWait bounds the time spent asking again after such
	// answers; they do not count against MaxAttempts, since each is a
	// cheap read of the key. Past it the last one is returned. Default
	// DefaultMaxInFlightWait (1 min).
	MaxInFlightWait time.Duration
}

// Transport is an http.RoundTripper that makes retries safe: it gives each
// request whose method is in Methods (in any case) and that has no key a
// new one, and retries a keyed request with the same key after a
// transport error or a 409, 429, 502, 503 or 504 response, with
// exponential backoff and full jitter, honouring Retry-After (seconds or
// an HTTP date). A replayed response (Idempotent-Replayed: true) is
// returned whatever its status: it is the key's stored answer, which
// asking again would only replay.
//
// A 409 that carries Retry-After means the key's first request is still
// running, and so does a response of any other status with Retry-After
// whose body is a problem (ProblemContentType) of type ProblemInFlight: a
// Guard whose Options.InFlightStatus is 429 (or 202) answers so. The transport then asks again after min(Retry-After,
// InFlightDelay), so a duplicate gets the stored response within about a
// second of it being ready, for up to MaxInFlightWait, without counting
// attempts. Any other 429 (a rate limiter's) is retried as above and
// counts. To tell, the transport reads the first bytes (at most 4 KiB)
// of a problem body with Retry-After, waiting at most 200 ms for them (a
// body that has not sent them by then is not taken for an in-flight
// answer); a response it returns is whole.
//
// Retries stop after MaxAttempts, when the request's context ends, or when
// the next wait would pass the context's deadline (then the last response
// or error is returned as it is). An error that every attempt would meet
// again (a certificate the client does not trust, a URL scheme the base
// does not speak, a request net/http refuses to write: a header value
// with a newline, a URL without a host) is returned at once. A key the
// caller set under a header map entry of another spelling
// (req.Header["idempotency-key"]) is its key: it is sent as the one field
// of the canonical name. A key field that is empty (or blank) is no key:
// the request gets its context's key or a fresh one in its place, as one
// without the field does. The body of a response that is
// retried is closed unread. A request with a body is retried only if it has
// GetBody (http.NewRequest sets it for bytes, strings and bytes.Buffer
// bodies); without it the request is sent once. Requests without a key
// (other methods, when the caller set none) are sent once, untouched.
//
// A request whose context carries a key (WithIdempotencyKey), and that
// sets none in its header, is sent with that key instead of a fresh one,
// whatever its method, and retried as above: the key of a step
// (guard.Lease.KeyFor) is the same in every attempt of the effect, so the
// service acts once however often the effect runs again.
//
// The key sent is in resp.Request.Header. A response is returned once its
// header has come: a body that breaks off while the caller reads it is
// not retried (the caller has read part of it). The effect may have
// happened: send the same request (method, URL, Content-Type and body)
// again with that key in its header, and the guard replays the stored
// response; a new call would get a new key and act again. A call that
// ends in an error (its attempts used up, a deadline passed) may have
// acted too, and the error does not carry the key the Transport made: for
// a call you may send again after an error, set the key yourself (in the
// header, or with WithIdempotencyKey) and send it again with that key. A
// Transport is safe for concurrent use.
type Transport struct {
	opts    TransportOptions
	methods map[string]bool
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport with opts.
func NewTransport(opts TransportOptions) *Transport {
	if opts.Base == nil {
		opts.Base = http.DefaultTransport
	}
	if opts.Header == "" {
		opts.Header = DefaultHeader
	}
	opts.Header = textproto.CanonicalMIMEHeaderKey(opts.Header)
	if len(opts.Methods) == 0 {
		opts.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if opts.NewKey == nil {
		opts.NewKey = adapter.NewUUIDv7
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.BaseDelay <= 0 {
		opts.BaseDelay = DefaultBaseDelay
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = DefaultMaxDelay
	}
	if opts.MaxRetryAfter <= 0 {
		opts.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if opts.InFlightDelay <= 0 {
		opts.InFlightDelay = DefaultInFlightDelay
	}
	if opts.MaxInFlightWait <= 0 {
		opts.MaxInFlightWait = DefaultMaxInFlightWait
	}
	t := &Transport{opts: opts, methods: map[string]bool{}}
	for _, m := range opts.Methods {
		t.methods[strings.ToUpper(m)] = true
	}
	return t
}

// NewClient returns an http.Client over NewTransport(opts).
func NewClient(opts TransportOptions) *http.Client {
	return &http.Client{Transport: NewTransport(opts)}
}

// idempotencyKey is the context key of WithIdempotencyKey.
type idempotencyKey struct{}

// WithIdempotencyKey returns a context that makes a Transport send key as
// the idempotency key of a request made with it (when the request sets
// none in its header), for any method, instead of a fresh UUIDv7: for
// calls whose key must be the same in every attempt of an effect, such as
// guard.Lease.KeyFor(step). (A key field that is empty or blank sets
// none.) An empty key removes one set before. The key
// must be a bare token as ParseKey reads it (1 to MaxKeyLen bytes of
// visible ASCII without DQUOTE, backslash or comma); RoundTrip refuses a
// request with another, with an error wrapping ErrMalformedKey, before
// sending anything.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if name, ok := adapter.OtherSpelling(req.Header, t.opts.Header); ok {
		// The caller's own key, in a header map entry of another spelling
		// (req.Header["idempotency-key"]): sent as one field of the
		// canonical name, not beside a fresh key of its own.
		req = req.Clone(req.Context())
		req.Header[t.opts.Header] = req.Header[name]
		delete(req.Header, name)
	}
	if !adapter.HasKey(req.Header.Values(t.opts.Header)) {
		// No field, or only empty ones (a key copied from where there was
		// none): no key, which the Set below replaces.
		key, _ := req.Context().Value(idempotencyKey{}).(string)
		if key != "" {
			if k, err := ParseKey(key); err != nil || k != key {
				closeBody(req)
				return nil, fmt.Errorf("httpx: idempotency key from the context: %w: %q is not a bare token", ErrMalformedKey, key)
			}
		} else if !t.methods[strings.ToUpper(req.Method)] { // no allocation when upper already
			return t.opts.Base.RoundTrip(req)
		}
		var err error
		if key == "" {
			key, err = t.opts.NewKey()
		}
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("httpx: new idempotency key: %w", err)
		}
		req = req.Clone(req.Context()) // a RoundTripper must not change the caller's request
		if req.Header == nil {         // a request made by hand, given to RoundTrip itself
			req.Header = http.Header{}
		}
		req.Header.Set(t.opts.Header, key)
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	ctx := req.Context()
	var inFlightSince time.Time // when the first in-flight answer in a row came
	for attempt, sent := 1, 0; ; sent++ {
		send := req
		if sent > 0 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("httpx: replay request body: %w", err)
			}
			send = req.Clone(ctx)
			send.Body = body
		}
		resp, err := t.opts.Base.RoundTrip(send)
		if !replayable {
			return resp, err
		}
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil || attempt >= t.opts.MaxAttempts || permanent(err) {
				return resp, err
			}
			wait = adapter.Backoff(t.opts.BaseDelay, t.opts.MaxDelay, attempt)
			attempt++
			inFlightSince = time.Time{}
		case resp.Header.Get(ReplayedHeader) == "true":
			// The key's stored answer: asking again can only replay it.
			return resp, nil
		case inFlightAnswer(resp):
			// The key's first request is still running: ask again soon.
			now := time.Now()
			if inFlightSince.IsZero() {
				inFlightSince = now
			}
			d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now)
			wait = adapter.InFlightWait(d, ok, t.opts.InFlightDelay, t.opts.BaseDelay)
			if now.Add(wait).Sub(inFlightSince) > t.opts.MaxInFlightWait {
				return resp, nil
			}
		case retryStatus(resp.StatusCode):
			if attempt >= t.opts.MaxAttempts {
				return resp, nil
			}
			d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			if !ok {
				d = adapter.Backoff(t.opts.BaseDelay, t.opts.MaxDelay, attempt)
			} else if d > t.opts.MaxRetryAfter {
				return resp, nil
			}
			wait = d
			attempt++
			inFlightSince = time.Time{}
		default:
			return resp, nil
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			return resp, err // no time to try again: the caller gets what there is
		}
		if resp != nil {
			// Closed unread: a body that stalls (an error page that never
			// ends) would hold the retry, and the caller, until ctx ends.
			_ = resp.Body.Close()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("httpx: waiting to retry after attempt %d: %w", sent+1, ctx.Err())
		case <-timer.C:
		}
	}
}

// CloseIdleConnections closes the idle connections of the base transport,
// so http.Client.CloseIdleConnections works through a Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.opts.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// maxProblemPeek bounds the bytes of a response body inFlightAnswer reads
// to learn its problem type; the Guard's problems are a few hundred.
const maxProblemPeek = 4 << 10

// maxProblemPeekWait bounds the time inFlightAnswer waits for those bytes:
// a problem document comes with its header or right after it, and a body
// that stalls must not hold the retry, or the caller, until ctx ends.
const maxProblemPeekWait = 200 * time.Millisecond

// inFlightAnswer reports whether resp says that the key's first request
// is still running: a 409 with Retry-After (httpx.Guard's default, and
// Stripe's), or a response of another status (Options.InFlightStatus set
// to 429, say) with Retry-After whose body is a problem of type
// ProblemInFlight. Only such a response's body is read to tell, at most
// maxProblemPeek bytes of it, and what was read is put back in front of
// the rest, so a response returned is whole. A body whose bytes have not
// come within maxProblemPeekWait is not taken for one (they are read on,
// and put back all the same). Any other 429 (a rate limiter's) is not
// taken for one.
func inFlightAnswer(resp *http.Response) bool {
	if resp.Header.Get("Retry-After") == "" {
		return false // a Guard's in-flight answer, of whatever status, has one
	}
	if resp.StatusCode == http.StatusConflict {
		return true
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != ProblemContentType || resp.ContentLength > maxProblemPeek {
		return false
	}
	p := &peekedBody{body: resp.Body, done: make(chan struct{})}
	go p.peek()
	resp.Body = p
	timer := time.NewTimer(maxProblemPeekWait)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		return false
	}
	if p.err != nil || len(p.head) > maxProblemPeek {
		return false
	}
	var prob struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(p.head, &prob) == nil && prob.Type == ProblemInFlight
}

// peekedBody is a response body whose first bytes (up to
// maxProblemPeek+1) are read ahead, by peek, and read again from a copy,
// before the rest. Close closes the body at once, which ends a peek that
// stalls.
type peekedBody struct {
	body io.ReadCloser
	done chan struct{} // closed when peek has ended; then head and err hold
	head []byte
	err  error     // peek's read error, io.EOF not counted
	rest io.Reader // head, then err or the rest of body: set by the first Read
}

func (p *peekedBody) peek() {
	defer close(p.done)
	p.head, p.err = io.ReadAll(io.LimitReader(p.body, maxProblemPeek+1))
}

func (p *peekedBody) Read(b []byte) (int, error) {
	if p.rest == nil {
		<-p.done
		var after io.Reader = p.body
		if p.err != nil {
			after = errReader{p.err}
		}
		p.rest = io.MultiReader(bytes.NewReader(p.head), after)
	}
	return p.rest.Read(b)
}

func (p *peekedBody) Close() error { return p.body.Close() }

// errReader is a Reader that only fails, with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// retryStatus reports whether a response status is worth retrying with the
// same key: the key is busy (409), the server sheds load (429, 503), or a
// gateway lost the answer (502, 504).
func retryStatus(code int) bool {
	switch code {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (RFC 9110 section 10.2.3). A date in the past is a zero delay; seconds
// past what a Duration holds are its longest, not unreadable.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || secs > uint64(math.MaxInt64/time.Second) {
			return math.MaxInt64, true
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// permanent reports whether a transport error would come again on every
// attempt: nothing reached a handler, and asking again only repeats it.
func permanent(err error) bool {
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError // the server does not speak TLS (an https URL to a plain-HTTP port)
	if errors.As(err, &cv) || errors.As(err, &rh) {
		return true
	}
	// net/http refuses a request it cannot write with errors of no type of
	// their own: these it gives before sending anything.
	msg := err.Error()
	for _, refusal := range []string{
		"unsupported protocol scheme",
		"no Host in request URL",
		"invalid header field name",
		"invalid header field value",
		"invalid method",
		"invalid trailer field",
		"can't write control character",
		"with nil Body",
		"with Body length",
		"invalid port",
	} {
		if strings.Contains(msg, refusal) {
			return true
		}
	}
	return false
}
