package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/adapter"
)

// The rule that keeps the upstream's effects single (docs: the package doc,
// "When the gateway cannot know", and README.md, "Run it in front of any
// service"):
//
// Just before the first byte of a guarded request is written to a
// connection to the upstream, the gateway records the step "forward" with
// the key's record (guard.Step: one round trip, a compare-and-set on the
// claim's token). Nothing is written until that step is stored. So:
//
//   - a request whose step was never recorded by this attempt never left
//     the gateway (the dial failed, the gateway was shutting down, the
//     step could not be stored), nor did one whose writes all failed with
//     nothing written (a connection reset or closed before its first
//     byte): the key is released, the answer is 503 with Retry-After, and
//     the retry forwards it (a forward step that sent nothing is marked
//     so before the release, which keeps a record's steps: unsent.go; a
//     mark that cannot be stored leaves the key outcome-unknown, the safe
//     side);
//   - once the step is recorded, the request may have reached the
//     upstream, and its effect may have happened: whatever the upstream
//     answers (5xx included) is stored as the key's result (but for an
//     "in progress" answer under unknown_outcome: resend: upstreambusy.go),
//     and a failure after that point (the connection broke, the upstream
//     timed out, the lease was lost) never frees the key for a re-run: the
//     key's result is then a 500 upstream-outcome-unknown problem;
//   - a claim that recovers a key whose record holds the step (its
//     previous holder died, or could not store the answer) cannot know
//     whether the upstream ran it: with unknown_outcome: answer (the
//     default) it stores the outcome-unknown problem and never forwards
//     again; with resend it forwards again with the same derived
//     Idempotency-Key, for upstreams that deduplicate on it.

// forwardStep names the recovery point recorded before forwarding.
const forwardStep = "forward"

// Errors the gate answers a write with. They never reach a client; the
// gateway reads the attempt's state instead of the transport's error.
var (
	errEarlierForward  = errors.New("gateway: an earlier attempt of this key forwarded it; it is not sent again")
	errRetryAfterWrite = errors.New("gateway: net/http would send the request again after bytes of it went out; refused")
	errSealed          = errors.New("gateway: the attempt has ended; nothing more is sent")
	errShuttingDown    = errors.New("gateway: shutting down")
	errUpstreamTimeout = errors.New("gateway: the upstream did not answer within the route's timeout")
	errUpstreamStalled = errors.New("gateway: the upstream's streamed answer brought no data within the route's timeout")
)

// attempt is one guarded request on its way to the upstream: what the gate
// let through. One attempt is one claim of the key.
type attempt struct {
	lease  guard.Lease
	resend bool // the route's unknown_outcome is resend
	ctx    context.Context

	mu          sync.Mutex
	conn        *gateConn     // the connection the gate last let bytes go to
	stepped     bool          // the step was asked for
	forwardN    int           // this attempt recorded the forward step forwardName(forwardN); 0: it did not
	tryN        int           // the forward step this attempt last asked the store for (unsent.go)
	writing     int           // writes let through that have not returned
	idleClosed  bool          // the gate refused this try's connection: the upstream had closed it (idleclosed.go)
	stepErr     error         // why the gate refuses every write of this attempt
	body        io.ReadSeeker // the request's body, to send again on another connection (idleclosed.go)
	earlier     bool          // an earlier attempt of the key recorded the step
	sealed      bool          // the outcome was decided: no more writes
	failed      bool          // the exchange failed (failed answered it)
	forwardedAt time.Time     // when the step was first recorded (by this or an earlier attempt)
	wrote       atomic.Bool   // a write let through put bytes on a connection: the request may have been delivered
	switched    atomic.Bool   // the upstream switched protocols: its session is the answer
	askedGzip   bool          // the gateway asked for gzip (set by the proxy's Rewrite, read by holdAnswer)

	answerBy       *time.Timer             // ends the exchange at the route's timeout, until the answer streams
	cancelExchange context.CancelCauseFunc // ends the exchange with the upstream
}

// streamAnswer is called when the upstream's answer, larger than the
// gateway keeps, begins to stream to the client: the route's timeout no
// longer bounds the exchange (the upstream has answered; a slow client
// reads at its own pace), but each read of the rest of the answer, r,
// must bring data within idle, or the exchange ends (errUpstreamStalled).
func (a *attempt) streamAnswer(r io.Reader, idle time.Duration) io.Reader {
	if a.answerBy == nil || !a.answerBy.Stop() {
		return r // the timeout has passed already: the exchange is ending
	}
	return &idleReader{r: r, idle: idle, cancel: a.cancelExchange}
}

// idleReader is a streamed answer each read of which must bring data
// within idle.
type idleReader struct {
	r      io.Reader
	idle   time.Duration
	cancel context.CancelCauseFunc
	timer  *time.Timer // one for every read, armed while a read waits
}

func (s *idleReader) Read(p []byte) (int, error) {
	if s.timer == nil {
		s.timer = time.AfterFunc(s.idle, func() { s.cancel(errUpstreamStalled) })
	} else {
		s.timer.Reset(s.idle)
	}
	n, err := s.r.Read(p)
	s.timer.Stop()
	return n, err
}

// beforeWrite is called, with the connection, before any bytes of the
// attempt's request are written. The first time it records the forward
// step; it refuses the write when the step could not be stored, when an
// earlier attempt forwarded and the route does not resend, and when
// net/http tries another connection after bytes went out on one.
func (a *attempt) beforeWrite(c *gateConn) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sealed {
		return errSealed
	}
	if !a.stepped {
		a.stepped = true
		ran, at, err := a.recordForward(time.Now())
		switch {
		case err != nil:
			a.stepErr = fmt.Errorf("gateway: recording the forward step: %w", err)
		case !ran:
			a.earlier, a.forwardedAt = true, at
			if !a.resend {
				a.stepErr = errEarlierForward
			}
		default:
			a.forwardedAt = at
		}
	}
	if a.stepErr != nil {
		return a.stepErr
	}
	if a.conn != nil && a.conn != c && a.wrote.Load() {
		// net/http retries a request on a new connection when the old one
		// failed; after bytes went out, the upstream may have acted.
		return errRetryAfterWrite
	}
	if a.conn != c && peerClosed(c.Conn) {
		// The upstream closed this connection before a byte of the
		// request reached it: it never saw it (idleclosed.go).
		a.idleClosed = true
		return errIdleClosed
	}
	a.conn = c
	a.writing++
	return nil
}

// afterWrite is called when a write beforeWrite let through returned,
// with how many bytes it put on the connection.
func (a *attempt) afterWrite(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writing--
	if n > 0 {
		a.wrote.Store(true)
	}
}

// seal ends a failed attempt and reports whether the request may have reached
// the upstream: whether a write the gate let through put any byte on a
// connection, or may still (it has not returned). A write that failed with
// nothing written (the connection was reset or closed, its deadline
// passed) sent nothing, though the step was recorded for it. After seal no
// write of the attempt passes.
func (a *attempt) seal() (delivered bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sealed, a.failed = true, true
	return a.wrote.Load() || a.writing > 0
}

// finish seals the attempt after the proxy returned and reports whether
// the exchange failed.
func (a *attempt) finish() (failed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sealed = true
	return a.failed
}

func (a *attempt) state() (earlier bool, at time.Time, stepErr error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.earlier, a.forwardedAt, a.stepErr
}

// looked reports whether the gate looked for the forward step (a write of
// the attempt's request was tried).
func (a *attempt) looked() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stepped
}

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// gateConn is a connection to the upstream whose writes pass the gate of
// the request that uses it (HTTP/1: one request at a time).
type gateConn struct {
	net.Conn
	mu    sync.Mutex
	armed *attempt // nil: writes pass (TLS handshake, unguarded requests)
}

func (c *gateConn) arm(a *attempt) {
	c.mu.Lock()
	c.armed = a
	c.mu.Unlock()
}

func (c *gateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	a := c.armed
	c.mu.Unlock()
	if a != nil {
		if err := a.beforeWrite(c); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	if a != nil {
		a.afterWrite(n)
	}
	return n, err
}

// gateOf finds the gateConn under a connection net/http reports.
func gateOf(c net.Conn) *gateConn {
	for range 4 {
		switch x := c.(type) {
		case *gateConn:
			return x
		case *tls.Conn:
			c = x.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// newTransport returns the transport to the upstreams: HTTP/1.1 only (a
// connection carries one request at a time, so its gate knows whose bytes
// it writes), every connection gated.
func newTransport(cfg *Config, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *gatedTransport {
	if dial == nil {
		dial = (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	t := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &gateConn{Conn: c}, nil
		},
		MaxIdleConnsPerHost:   cfg.MaxIdleConns,
		IdleConnTimeout:       cfg.IdleConnTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		Protocols:             &protocols,
		// net/http reads a zero MaxIdleConnsPerHost as its default (2);
		// max_idle_conns: 0 means none kept.
		DisableKeepAlives: cfg.MaxIdleConns == 0,
	}
	return &gatedTransport{t: t}
}

// gatedTransport arms the gate of each connection with the request's
// attempt (none for unguarded requests) before net/http writes to it.
type gatedTransport struct{ t *http.Transport }

func (g *gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	a := attemptFrom(req.Context())
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if gc := gateOf(info.Conn); gc != nil {
			gc.arm(a)
		}
	}}
	out := req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	for tries := 0; ; tries++ {
		if a != nil {
			a.newTry()
		}
		res, err := g.t.RoundTrip(out)
		if err == nil || a == nil || tries == maxIdleClosedRetries || !a.sentNothing(err) {
			return res, err
		}
		// The upstream had closed the connection the request was given;
		// nothing was written to it (idleclosed.go). Another one.
		out = out.Clone(out.Context())
		if out.Body != nil && out.Body != http.NoBody {
			if _, serr := a.body.Seek(0, io.SeekStart); serr != nil {
				return res, err
			}
			out.Body = io.NopCloser(a.body)
		}
	}
}

// newTry starts one try of gatedTransport.RoundTrip.
func (a *attempt) newTry() {
	a.mu.Lock()
	a.idleClosed = false
	a.mu.Unlock()
}

// sentNothing reports whether a try that failed with err failed because
// the gate refused a connection the upstream had closed, with no byte of
// the attempt written anywhere: the request may go on another connection.
// The gate's own word decides, not err alone: net/http answers such a try
// with whichever of its goroutines reports first, the writer (the gate's
// errIdleClosed) or the reader, which hears the end of the connection the
// writer closed after the refusal (an EOF, or "use of closed network
// connection").
func (a *attempt) sentNothing(err error) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	refused := a.idleClosed || errors.Is(err, errIdleClosed)
	return refused && !a.wrote.Load() && a.writing == 0 && !a.sealed && a.stepErr == nil
}

// exchange is one request on a guarded route, between the route's outer
// middleware and the forwarding handler inside httpx.Guard.
type exchange struct {
	// release, set by the forwarding handler, asks for the key to be
	// released (the handler then panics with http.ErrAbortHandler, which
	// httpx.Guard answers by releasing the claim and letting the panic
	// go on) and says what the client is answered: the gateway's problem,
	// or the upstream's own "in progress" answer (upstreambusy.go).
	release interface{ write(http.ResponseWriter) }
	// abort: the response streamed and then broke; the key holds its
	// marker. The connection is cut once httpx.Guard stored it.
	abort bool
	// upstream is set while the forwarding handler runs: a 503 written
	// then is the upstream's, and its Retry-After is left as it came.
	upstream atomic.Bool
}

type exchangeKey struct{}

func exchangeFrom(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// trackWriter knows whether anything was written, and gives the
// gateway's own 503s (not the upstream's, not a replay) the Retry-After
// of the fallback breaker (probeRetryAfter).
type trackWriter struct {
	http.ResponseWriter
	wrote bool
	ex    *exchange
	fb    *fallback.Store // nil: Retry-After is left as written
}

func (t *trackWriter) WriteHeader(code int) {
	if code == http.StatusServiceUnavailable && t.fb != nil && !t.ex.upstream.Load() {
		probeRetryAfter(t.Header(), t.fb)
	}
	if code >= 200 {
		t.wrote = true
	}
	t.ResponseWriter.WriteHeader(code)
}

// probeRetryAfter makes h's Retry-After, if it has one and is no replay,
// say when fb's open breaker lets a probe through: under fail-closed a
// retry sooner meets the same open breaker and gets 503 again, however
// short the answer's own delay (httpx's 1 s, the not-forwarded 1 s).
// Closed or half-open (its probe's verdict comes within fallback.timeout),
// the delay written stands.
func probeRetryAfter(h http.Header, fb *fallback.Store) {
	if h.Get("Retry-After") == "" || h.Get(httpx.ReplayedHeader) != "" {
		return
	}
	if at, ok := fb.ProbeAt(); ok {
		h.Set("Retry-After", retryAfterSeconds(time.Until(at)))
	}
}

func (t *trackWriter) Write(p []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(p)
}

func (t *trackWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// route is one configured route at run time.
type route struct {
	gw      *Gateway
	cfg     Route
	name    string // the pattern, for metrics and logs
	proxy   transparent
	methods map[string]bool
	host    bool // the pattern names a host (hosts.go)
	// via are the route's proxies to the other prefixes of its upstream's
	// server, by upstreamID (prefixes.go).
	via map[string]transparent
}

// outer is the route's outermost middleware. For a guarded method it
// detaches the request from the client's cancellation (a request that may
// have reached the upstream is seen through to its answer, which is
// stored for the retry), ends it when the gateway must stop, and turns the
// forwarding handler's release into its answer.
func (rt *route) outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !rt.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
		stop := context.AfterFunc(rt.gw.hardStop, func() { cancel(context.Cause(rt.gw.hardStop)) })
		defer func() {
			stop()
			cancel(nil)
		}()
		ex := &exchange{}
		ctx = context.WithValue(ctx, exchangeKey{}, ex)
		tw := &trackWriter{ResponseWriter: w, ex: ex}
		if rt.gw.cfg.Fallback.Policy == "fail-closed" {
			tw.fb = rt.gw.fb
		}
		before := w.Header().Clone()
		func() {
			defer func() {
				p := recover()
				if p == nil {
					return
				}
				if p == http.ErrAbortHandler && ex.release != nil && !tw.wrote {
					resetHeader(w.Header(), before)
					ex.upstream.Store(false) // the release's answer is the gateway's
					ex.release.write(tw)
					return
				}
				panic(p)
			}()
			next.ServeHTTP(tw, r.WithContext(ctx))
		}()
		switch {
		case ex.abort:
			panic(http.ErrAbortHandler) // the key is stored; cut the broken response off
		case !tw.wrote && ctx.Err() != nil:
			// httpx gave up waiting for the key's first request because the
			// gateway is stopping: nothing was claimed.
			resetHeader(w.Header(), before)
			notForwarded(errShuttingDown).write(tw)
		}
	})
}

func resetHeader(h, to http.Header) {
	clear(h)
	for k, v := range to {
		h[k] = v
	}
}

// ServeHTTP forwards a request: guarded (httpx.Guard claimed its key) under
// the gate, or unguarded as it is.
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lease, _, guarded := httpx.ClaimFrom(r.Context())
	ex := exchangeFrom(r.Context())
	if ex != nil {
		ex.upstream.Store(true) // what is written now is the upstream's
	}
	if !guarded || ex == nil {
		rt.gw.metrics.request(rt.name, resultPassthrough)
		viaProxy(r.Context(), rt.proxy).ServeHTTP(w, r)
		return
	}
	a := &attempt{lease: lease, resend: rt.cfg.UnknownOutcome == Resend}
	// The store calls of the attempt (the forward step) are bounded by
	// the route's timeout.
	sctx, scancel := context.WithTimeoutCause(r.Context(), rt.cfg.Timeout, errUpstreamTimeout)
	defer scancel()
	a.ctx = sctx
	// So is the exchange with the upstream, until its answer streams to
	// the client (holdAnswer): the upstream has answered then, and the
	// time the client takes to read it is not the upstream's; from then
	// on each read of the answer must bring data within the timeout
	// (streamAnswer). The lease (MaxRun) still bounds the whole.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	a.answerBy = time.AfterFunc(rt.cfg.Timeout, func() { cancel(errUpstreamTimeout) })
	defer a.answerBy.Stop()
	a.cancelExchange = cancel
	out := r.WithContext(context.WithValue(ctx, attemptKey{}, a))
	if out.Body != nil && out.Body != http.NoBody {
		// httpx.Guard read the body already, and holds it: it can be sent
		// again from its start on another connection when the one the
		// request was given turns out closed before anything was written
		// (idleclosed.go).
		rs, ok := out.Body.(io.ReadSeeker)
		if !ok || out.ContentLength < 0 {
			body, _ := io.ReadAll(out.Body)
			rs = bytes.NewReader(body)
			out.Body = io.NopCloser(rs)
			if out.ContentLength < 0 {
				// Sent with its length, not chunked as the client sent
				// it (the Transport sends chunked while TransferEncoding
				// says so, whatever the length), unless the client sent
				// trailers, which only a chunked body carries.
				out.ContentLength = int64(len(body))
				if len(out.Trailer) == 0 {
					out.TransferEncoding = nil
				}
			}
		}
		a.body = rs
	}
	start := time.Now()
	if rt.serveProxy(w, out) {
		ex.abort = true
		rt.gw.logOutcome(r, rt, lease, "the upstream's answer broke after it began to stream; the key keeps a marker", nil)
	}
	if a.switched.Load() && errors.Is(context.Cause(ctx), errUpstreamTimeout) {
		rt.gw.logOutcome(r, rt, lease, "a switched session was closed at the route's timeout", nil)
	}
	rt.gw.metrics.upstream(rt.name, time.Since(start))
	if !a.finish() {
		rt.gw.metrics.request(rt.name, resultForwarded)
	}
	if ex.release != nil {
		panic(http.ErrAbortHandler) // httpx.Guard releases the key; outer answers
	}
}

// serveProxy runs the reverse proxy; aborted reports that it cut off a
// response whose copy failed (http.ErrAbortHandler), which must not reach
// httpx.Guard: it would release a key whose request the upstream got.
func (rt *route) serveProxy(w http.ResponseWriter, r *http.Request) (aborted bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			aborted = true
		}
	}()
	viaProxy(r.Context(), rt.proxy).ServeHTTP(w, r)
	return false
}

// newProxy returns the reverse proxy of a route (or, with rt.cfg zero, of
// the pass-through).
func (gw *Gateway) newProxy(rt *route, target *url.URL) transparent {
	xf := gw.cfg.XForwarded
	keyHeader := gw.cfg.ForwardKeyHeader
	return transparent{&httputil.ReverseProxy{
		Transport: gw.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// Rewrite's request has lost the X-Forwarded-* fields and
			// Forwarded (RFC 7239): "set" names this hop's client alone,
			// "append" and "off" keep the chain in front.
			if xf != "set" {
				if v := pr.In.Header.Values("Forwarded"); len(v) > 0 {
					pr.Out.Header["Forwarded"] = v
				}
			}
			switch xf {
			case "set":
				pr.SetXForwarded()
			case "append":
				if v := pr.In.Header.Values("X-Forwarded-For"); len(v) > 0 {
					pr.Out.Header["X-Forwarded-For"] = v
				}
				pr.SetXForwarded()
			default: // off: the client's fields, untouched
				for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
					if v := pr.In.Header.Values(h); len(v) > 0 {
						pr.Out.Header[h] = v
					}
				}
			}
			if rt != nil {
				// The client's own key is not the upstream's: it is not
				// scoped by caller, so an upstream deduplicating on it
				// could answer one caller with another's result. It never
				// goes, guarded or not (a soft route's request without a
				// key passes through), whatever it is called: the route's
				// key header, or on a body or computed route the default
				// one (a computed key takes the client's from it); nor
				// does a field of the derived key's name the client sent.
				// Spelt with '_' for '-' too: CGI-style servers (wsgiref,
				// PHP, Puma) read Idempotency_Key as Idempotency-Key.
				clientKey := rt.cfg.Key.Header
				if clientKey == "" {
					clientKey = httpx.DefaultHeader
				}
				delAnySpelling(pr.Out.Header, clientKey)
				if keyHeader != "" {
					delAnySpelling(pr.Out.Header, keyHeader)
				}
			}
			if a := attemptFrom(pr.In.Context()); a != nil {
				pr.Out.Header.Del("Expect") // the body was read already
				// The answer is stored for every retry, whatever coding
				// that retry accepts: the gateway asks for gzip itself and
				// decodes it (holdAnswer, readHeld), so what is stored is
				// the plain body (or, if it does not decode, the answer as
				// it came).
				pr.Out.Header.Del("Accept-Encoding")
				if a.askedGzip = asksGzip(pr.Out); a.askedGzip {
					pr.Out.Header.Set("Accept-Encoding", "gzip")
				}
				// Only the derived key goes (when forward_key_header
				// names a header).
				if keyHeader != "" {
					pr.Out.Header.Set(keyHeader, a.lease.KeyFor(forwardStep))
				}
			}
		},
		ModifyResponse: func(res *http.Response) error {
			gw.switching(res)
			a := attemptFrom(res.Request.Context())
			if rt == nil || a == nil {
				return nil
			}
			if res.StatusCode == http.StatusSwitchingProtocols {
				a.switched.Store(true)
			}
			return rt.holdAnswer(res, a)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if rt == nil || attemptFrom(r.Context()) == nil {
				gw.passthroughError(w, r, err)
				return
			}
			if busy := (*busyAnswer)(nil); errors.As(err, &busy) {
				rt.upstreamBusy(r, busy)
				return
			}
			rt.failed(w, r, err)
		},
		ErrorLog: gw.errorLog,
	}, gw}
}

// holdAnswer reads the upstream's answer up to the stored limit before
// anything is sent, so a body that breaks within it is an unknown outcome
// (answered by failed), not a truncated response stored as complete. A
// longer body streams on: the key keeps the marker httpx stores. A gzip
// answer the gateway asked for is decoded (readHeld); one that does not
// decode is kept as it came. A 101 passes untouched.
func (rt *route) holdAnswer(res *http.Response, a *attempt) error {
	if res.StatusCode == http.StatusSwitchingProtocols {
		// The body is the switched connection: the proxy copies it both
		// ways until either side closes (read here, it would wait for the
		// end of a session the client cannot start without the 101).
		return nil
	}
	limit := int64(rt.cfg.MaxStoredResponse)
	body, rest, undecodable, err := readHeld(res, a.askedGzip, limit)
	if err != nil {
		return fmt.Errorf("reading the upstream's answer: %w", err)
	}
	if undecodable != nil {
		rt.gw.logOutcome(res.Request, rt, a.lease, "the upstream's answer says gzip but does not decode; kept as it came", undecodable)
	}
	if int64(len(body)) <= limit {
		if a.resend && upstreamBusy(res) {
			// Not the key's result: failed by the ErrorHandler, which
			// releases the key and passes this answer on.
			return &busyAnswer{status: res.StatusCode, header: res.Header.Clone(), body: body}
		}
		_ = res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.TransferEncoding = nil
		if len(res.Trailer) > 0 {
			// The body was read whole, so the trailers are in: pass them
			// as fields named with http.TrailerPrefix, which net/http
			// sends as trailers (and httpx stores), without a
			// Content-Length, which would leave no room for them. Left in
			// res.Trailer, the proxy would flush the response before it
			// was stored, with a Content-Length that drops them.
			for k, vs := range res.Trailer {
				if len(vs) > 0 {
					res.Header[http.TrailerPrefix+k] = vs
				}
			}
			res.Trailer = nil
			res.Header.Del("Content-Length")
			return nil
		}
		if !bodyless(res) {
			res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		}
		return nil
	}
	res.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), a.streamAnswer(rest, rt.cfg.Timeout)), res.Body}
	return nil
}

func bodyless(res *http.Response) bool {
	return res.StatusCode == http.StatusNoContent || res.StatusCode == http.StatusNotModified ||
		res.StatusCode < 200 || res.Request.Method == http.MethodHead
}

// failed answers a guarded request whose exchange with the upstream failed
// (no answer, or an answer that broke before the stored limit).
func (rt *route) failed(w http.ResponseWriter, r *http.Request, err error) {
	a := attemptFrom(r.Context())
	ex := exchangeFrom(r.Context())
	delivered := a.seal()
	gateFound, at, stepErr := a.state()
	lease := a.lease
	if !delivered && a.forwardN > 0 { // sealed: forwardN no longer changes
		// This attempt recorded its forward step and sent nothing: say so
		// in the record before the key is released, or the next claim
		// would take the step for a delivery.
		if merr := a.markUnsent(); merr != nil {
			delivered = true // the record keeps a forward the next claim cannot tell from a delivery
			rt.gw.logOutcome(r, rt, lease, "nothing of the request was sent, but the record could not say so; handled as possibly delivered", merr)
		}
	}
	if !delivered && a.forwardN == 0 && stepErr != nil && !errors.Is(stepErr, errEarlierForward) {
		// The forward step's store call failed: it may have stored the
		// step all the same, though nothing was sent (unsent.go).
		if marked, merr := a.markLateUnsent(rt.gw.store); merr != nil {
			rt.gw.logOutcome(r, rt, lease, "the forward step's store call failed and whether it stored the step is unknown; a retry may answer outcome-unknown", merr)
		} else if marked {
			rt.gw.logOutcome(r, rt, lease, "not forwarded; the forward step was stored though its store call failed, and is marked unsent", stepErr)
		}
	}
	earlier := errors.Is(stepErr, errEarlierForward)
	if !delivered {
		// Nothing of this attempt was sent, but a recovered key's earlier
		// attempt may have been delivered, and "nothing was sent" would
		// not be true of the key: the gate found such a forward at the
		// first write (on a resend route it lets the request go again);
		// when no write was tried (the dial failed; the route's timeout or
		// the gateway's stop came first), it never looked.
		found := gateFound
		if !a.looked() {
			switch f, t, perr := a.earlierForward(); {
			case perr != nil:
				rt.gw.logOutcome(r, rt, lease, "not forwarded; whether an earlier attempt of the key forwarded it could not be read", perr)
			case f:
				found, at = true, t
			}
		}
		switch {
		case found && rt.cfg.UnknownOutcome == Resend:
			rt.gw.metrics.request(rt.name, resultResend)
			rt.gw.logOutcome(r, rt, lease, "not forwarded, but an earlier attempt of the key was; key released for a resend with the same upstream key", err)
			ex.release = resendProblem(lease)
			return
		case found:
			earlier = true
		}
	}
	switch {
	case !delivered && earlier:
		// An earlier holder forwarded it; this one sent nothing.
		rt.gw.metrics.request(rt.name, resultEarlierForward)
		rt.gw.logOutcome(r, rt, lease, "a recovered key's earlier attempt forwarded the request; outcome unknown, stored", nil)
		outcomeUnknown(lease, at, "an earlier attempt of this key forwarded the request at "+at.UTC().Format(time.RFC3339Nano)+
			" and its answer was never stored (the gateway that sent it stopped or lost the key, or the upstream switched protocols: a session is no answer to store)").write(w)
	case !delivered:
		// Nothing of the request left the gateway: safe to run again.
		rt.gw.metrics.request(rt.name, resultNotForwarded)
		cause := err
		switch {
		case stepErr != nil:
			cause = stepErr
		case context.Cause(r.Context()) != nil:
			cause = context.Cause(r.Context())
		}
		rt.gw.logOutcome(r, rt, lease, "not forwarded; key released", cause)
		ex.release = notForwarded(cause)
	case rt.cfg.UnknownOutcome == Resend:
		rt.gw.metrics.request(rt.name, resultResend)
		rt.gw.logOutcome(r, rt, lease, "forwarded without a complete answer; key released for a resend with the same upstream key", err)
		ex.release = resendProblem(lease)
	default:
		rt.gw.metrics.request(rt.name, resultUnknown)
		why := "the connection to the upstream failed before its whole answer came: " + errText(err)
		switch cause := context.Cause(r.Context()); {
		case errors.Is(cause, errUpstreamTimeout):
			why = "the upstream did not answer within " + rt.cfg.Timeout.String()
		case errors.Is(cause, guard.ErrLeaseLost):
			why = "the gateway lost its claim on the key while it waited for the upstream"
		case errors.Is(cause, errShuttingDown):
			why = "the gateway stopped before the upstream answered"
		}
		rt.gw.logOutcome(r, rt, lease, "forwarded without a complete answer; outcome unknown, stored", err)
		outcomeUnknown(lease, at, why).write(w)
	}
}

func errText(err error) string {
	var ne *net.OpError
	if errors.As(err, &ne) && ne.Err != nil {
		return shortText(ne.Op + ": " + ne.Err.Error())
	}
	if err == nil {
		return "no answer"
	}
	return shortText(err.Error())
}

// maxErrText bounds the transport's error quoted in an outcome-unknown
// problem: net/http's "malformed HTTP response %q" quotes the upstream's
// whole first line (up to its 10 MiB header limit), and the problem is
// the key's stored answer, which must stay within max_stored_response
// (minStoredResponse).
const maxErrText = 200

// shortText is s cut to maxErrText bytes (on a rune boundary), marked as cut.
func shortText(s string) string {
	if len(s) <= maxErrText {
		return s
	}
	return adapter.CutText(s, maxErrText) + "…"
}

// passthroughError answers an unguarded request the upstream did not
// answer, as httputil.ReverseProxy would.
func (gw *Gateway) passthroughError(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, context.Canceled) {
		gw.log.Warn("gateway: upstream error (unguarded request)", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	w.WriteHeader(http.StatusBadGateway)
}
