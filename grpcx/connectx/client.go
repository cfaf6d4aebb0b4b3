package connectx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemguard/idemguard/grpcx/internal/core"
	"github.com/idemguard/idemguard/internal/adapter"
)

// ClientOptions configure NewClientInterceptor; they are
// grpcx.ClientOptions with Connect's types. The zero value is ready to use.
type ClientOptions struct {
	// Header carries the key. Default DefaultHeader.
	Header string
	// Procedures get a key and are retried. Default: every unary
	// procedure called through the interceptor.
	Procedures []string
	// NewKey makes a key. Default a UUIDv7.
	NewKey func() (string, error)
	// MaxAttempts bounds the attempts of one call, the first included.
	// Default 5.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the full-jitter exponential backoff.
	// Defaults 100 ms and 10 s.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// RetryCodes are the codes retried with the same key. Default
	// CodeUnavailable, CodeResourceExhausted (not connect-go's own for a
	// message over a size limit, which no retry gets under), CodeAborted and
	// CodeDeadlineExceeded (the server's, not the caller's: neither its
	// context's nor its HTTP client's, http.Client.Timeout). A
	// CodeCanceled while the caller's context is alive (connect-go's
	// report of a connection reset mid-answer) counts as CodeUnavailable.
	// An empty, non-nil list retries no code (a key in flight is still
	// asked about again: see InFlightDelay).
	RetryCodes []connect.Code
	// MaxRetryDelay is the longest RetryInfo (or grpc-retry-pushback-ms)
	// delay honoured; a longer one ends the retries. Default 1 min.
	MaxRetryDelay time.Duration
	// InFlightDelay caps the wait before asking again about a key in
	// flight (CodeAborted, ReasonKeyInUse). Default 1 s.
	InFlightDelay time.Duration
	// MaxInFlightWait bounds the time spent asking again about a key in
	// flight; those answers do not count against MaxAttempts. Default
	// 1 min.
	MaxInFlightWait time.Duration
}

// NewClientInterceptor returns a client interceptor
// (connect.WithInterceptors on the client) that gives each unary call of
// ClientOptions.Procedures whose header has no key one (WithIdempotencyKey's,
// else a new UUIDv7) and retries the call with that same key, as
// grpcx.UnaryClientInterceptor does: RetryCodes with exponential backoff
// and full jitter, honouring RetryInfo and grpc-retry-pushback-ms; a key
// in flight is asked about again after its RetryInfo delay, without
// counting attempts. Retries stop after MaxAttempts, when the context
// ends (a wait it ends returns CodeCanceled or CodeDeadlineExceeded at
// once), when the next wait would pass its deadline, or at a replayed
// answer (ReplayedHeader: asking again only repeats it). Streaming calls
// pass through.
//
// The key sent is in the request's header after the call, and stays
// there: a request is one call. Sent again, the same *connect.Request is
// a retry of that call (its key wins over WithIdempotencyKey's): with the
// same message it is replayed (the handler does not run again), with
// another it is refused with CodeFailedPrecondition (ReasonKeyReused).
// For a new call make a new request, or delete the header first.
// (grpcx's client and httpx's Transport leave the caller's request
// unchanged, so a request sent again there is a new call with a new key.)
func NewClientInterceptor(opts ClientOptions) connect.Interceptor {
	if opts.Header == "" {
		opts.Header = DefaultHeader
	}
	if opts.NewKey == nil {
		opts.NewKey = adapter.NewUUIDv7
	}
	var retry []core.Code // nil: the defaults; empty: retry no code
	if opts.RetryCodes != nil {
		retry = make([]core.Code, 0, len(opts.RetryCodes))
		for _, c := range opts.RetryCodes {
			retry = append(retry, core.Code(c))
		}
	}
	c := &client{opts: opts, policy: core.NewRetryPolicy(core.RetryPolicy{
		MaxAttempts: opts.MaxAttempts, BaseDelay: opts.BaseDelay, MaxDelay: opts.MaxDelay, MaxRetryDelay: opts.MaxRetryDelay,
		InFlightDelay: opts.InFlightDelay, MaxInFlightWait: opts.MaxInFlightWait}, retry)}
	if opts.Procedures != nil {
		c.procedures = map[string]bool{}
		for _, p := range opts.Procedures {
			c.procedures[p] = true
		}
	}
	return connect.UnaryInterceptorFunc(c.wrap)
}

type client struct {
	opts       ClientOptions
	procedures map[string]bool // nil: all
	policy     core.RetryPolicy
}

func (c *client) wrap(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient || (c.procedures != nil && !c.procedures[req.Spec().Procedure]) {
			return next(ctx, req)
		}
		if other, ok := adapter.OtherSpelling(req.Header(), http.CanonicalHeaderKey(c.opts.Header)); ok {
			// The caller's own key, under a header map entry of another
			// spelling: sent as the one field of the canonical name, not
			// beside a fresh key (as httpx.Transport does).
			h := req.Header()
			h[http.CanonicalHeaderKey(c.opts.Header)] = h[other]
			delete(h, other)
		}
		if req.Header().Get(c.opts.Header) == "" {
			key := core.KeyFrom(ctx)
			if key != "" {
				if err := core.CheckKey(key); err != nil {
					ce := connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("connectx: idempotency key from the context: %w", err))
					// The ErrorInfo the server's refusal carries, so that
					// Reason tells the client's own refusal the same way.
					if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: core.ReasonKeyMalformed, Domain: core.ErrorDomain}); err == nil {
						ce.AddDetail(d)
					}
					return nil, ce
				}
			} else {
				var err error
				if key, err = c.opts.NewKey(); err != nil {
					return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("connectx: new idempotency key: %w", err))
				}
			}
			req.Header().Set(c.opts.Header, key)
		}
		retries := c.policy.Start()
		for sent := 1; ; sent++ {
			res, err := next(ctx, req)
			if err == nil || ctx.Err() != nil {
				return res, err
			}
			var pushback []string
			if ce, ok := errors.AsType[*connect.Error](err); ok {
				if ce.Meta().Get(ReplayedHeader) == "true" {
					return res, err // the key's stored answer: asking again can only replay it
				}
				pushback = ce.Meta().Values(http.CanonicalHeaderKey("grpc-retry-pushback-ms"))
			}
			code := connect.CodeOf(err)
			if code == connect.CodeDeadlineExceeded && clientTimeout(err) {
				return res, err // the caller's own bound on the attempt, not the server's
			}
			if code == connect.CodeCanceled {
				// Not the caller's cancel (its context is alive): connect-go
				// reports a connection reset mid-answer so. The attempt's
				// outcome is unknown, as for CodeUnavailable; the key makes
				// the retry safe.
				code = connect.CodeUnavailable
			}
			if ce, ok := errors.AsType[*connect.Error](err); ok && core.MessageTooLarge(core.Code(code), ce.Message()) {
				return res, err // as large, or replayed as large, on every retry
			}
			wait, again := retries.Next(core.Failure{Code: core.Code(code), Details: details(err), Pushback: pushback})
			if !again {
				return res, err
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
				return res, err
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil, connect.NewError(codeOf(ctx.Err()), fmt.Errorf("connectx: waiting to retry after attempt %d: %w", sent, ctx.Err()))
			case <-timer.C:
			}
		}
	}
}

// clientTimeout reports whether err is a timeout of the caller's own HTTP
// client (http.Client.Timeout, an http.Transport's ResponseHeaderTimeout),
// which connect-go reports as CodeDeadlineExceeded: a bound the caller set
// on the call, which retries would each get afresh.
func clientTimeout(err error) bool {
	ue, ok := errors.AsType[*url.Error](err)
	return ok && ue.Timeout()
}
