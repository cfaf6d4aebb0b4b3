package grpcx

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx/internal/core"
	"github.com/idemguard/idemguard/internal/adapter"
)

// Defaults for ClientOptions.
const (
	DefaultMaxAttempts     = adapter.DefaultMaxAttempts     // 5
	DefaultBaseDelay       = adapter.DefaultBaseDelay       // 100 ms
	DefaultMaxDelay        = adapter.DefaultMaxDelay        // 10 s
	DefaultMaxRetryDelay   = adapter.DefaultMaxServerDelay  // 1 min
	DefaultInFlightDelay   = adapter.DefaultInFlightDelay   // 1 s
	DefaultMaxInFlightWait = adapter.DefaultMaxInFlightWait // 1 min
)

// DefaultRetryCodes are the codes ClientOptions.RetryCodes defaults to:
// Unavailable (the server, or the connection to it, is gone: the status a
// lost response gives), ResourceExhausted (shed or throttled; not gRPC's
// own for a message over a size limit, which no retry gets under), Aborted
// (a concurrency conflict) and DeadlineExceeded (a deadline of the
// server's, not the caller's: when the caller's context is done, nothing
// is retried). They are httpx's Transport's 503 and 502, 429, 409 and 504.
var DefaultRetryCodes = []codes.Code{codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded}

// ClientOptions configure UnaryClientInterceptor. The zero value is ready
// to use.
type ClientOptions struct {
	// Metadata carries the key. Default DefaultMetadata ("idempotency-key").
	Metadata string
	// Methods are the full method names that get a key and are retried.
	// Default: every unary method called through the interceptor. Name the
	// methods when the connection also reaches methods no guard protects:
	// retrying those after a lost response could run them twice.
	Methods []string
	// NewKey makes a key. Default a UUIDv7 (uuid.NewV7), which sorts by
	// time and carries 62 random bits (google/uuid fills the 12 bits after
	// the milliseconds with finer time).
	NewKey func() (string, error)
	// MaxAttempts bounds the attempts of one call, the first included, as
	// gRPC's retry policy maxAttempts does. Default DefaultMaxAttempts (5).
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff, as gRPC's retry policy
	// (gRFC A6) does with a multiplier of 2: before retry n (1, 2, ...) the
	// interceptor waits a uniformly random time in
	// [0, min(MaxDelay, BaseDelay·2^(n-1))), unless the server said how
	// long (RetryInfo, or grpc-retry-pushback-ms). Defaults
	// DefaultBaseDelay (100 ms) and DefaultMaxDelay (10 s).
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// RetryCodes are the status codes retried with the same key. Default
	// (nil) DefaultRetryCodes; an empty, non-nil list retries no code (a
	// key in flight is still asked about again: see InFlightDelay).
	RetryCodes []codes.Code
	// MaxRetryDelay is the longest delay a server may ask for (RetryInfo,
	// pushback); a longer one ends the retries and its status is returned.
	// Default DefaultMaxRetryDelay (1 min).
	MaxRetryDelay time.Duration
	// InFlightDelay is the longest the interceptor waits before asking
	// again about a key whose first call still runs (Aborted with
	// ReasonKeyInUse): min(RetryInfo, InFlightDelay), at least
	// MinInFlightRetryDelay, less up to a fifth at random so the duplicates
	// of one key spread out. Default DefaultInFlightDelay (1 s).
	InFlightDelay time.Duration
	// MaxInFlightWait bounds the time spent asking again after such
	// answers; they do not count against MaxAttempts, since each is a
	// cheap read of the key. Past it the Aborted status is returned.
	// Default DefaultMaxInFlightWait (1 min).
	MaxInFlightWait time.Duration
}

// UnaryClientInterceptor returns an interceptor that makes retries safe:
// it gives each call of ClientOptions.Methods whose outgoing metadata has
// no key (an empty or blank value is none) one (WithIdempotencyKey's,
// else a new UUIDv7), and retries the
// call with that same key while it fails with one of RetryCodes, with
// exponential backoff and full jitter as gRPC's retry policy has them,
// honouring the server's google.rpc.RetryInfo and grpc-retry-pushback-ms
// (a negative or unreadable pushback stops the retries, as gRFC A6 says).
//
// An Aborted status with ReasonKeyInUse means the key's first call is still
// running: the interceptor asks again after min(RetryInfo, InFlightDelay),
// so a duplicate gets the stored response within about the method's run
// time of it being ready, for up to MaxInFlightWait, without counting
// attempts.
//
// Retries stop after MaxAttempts, when the call's context ends, when the
// next wait would pass the context's deadline (or the method's timeout in
// the channel's service config, which bounds the whole call as a deadline
// does), and at a replayed answer (ReplayedMetadata: the key's stored
// answer, which asking again only repeats); the last status is
// returned. SentKey reports the key sent. The interceptor is safe for
// concurrent use; it composes with gRPC's own retries (a service config
// retryPolicy), which resend the same metadata, so the same key.
//
// A call it refuses to send gets a status error that wraps the cause: a
// malformed key from the context InvalidArgument with ReasonKeyMalformed
// (errors.Is ErrMalformedKey), a NewKey failure Internal wrapping
// NewKey's error.
func UnaryClientInterceptor(opts ClientOptions) grpc.UnaryClientInterceptor {
	if opts.Metadata == "" {
		opts.Metadata = DefaultMetadata
	}
	opts.Metadata = strings.ToLower(opts.Metadata)
	if opts.NewKey == nil {
		opts.NewKey = adapter.NewUUIDv7
	}
	var retry []core.Code
	if opts.RetryCodes != nil {
		retry = make([]core.Code, 0, len(opts.RetryCodes))
		for _, code := range opts.RetryCodes {
			retry = append(retry, core.Code(code))
		}
	}
	c := &client{opts: opts, policy: core.NewRetryPolicy(core.RetryPolicy{
		MaxAttempts: opts.MaxAttempts, BaseDelay: opts.BaseDelay, MaxDelay: opts.MaxDelay, MaxRetryDelay: opts.MaxRetryDelay,
		InFlightDelay: opts.InFlightDelay, MaxInFlightWait: opts.MaxInFlightWait}, retry)}
	if opts.Methods != nil {
		c.methods = map[string]bool{}
		for _, m := range opts.Methods {
			c.methods[m] = true
		}
	}
	return c.intercept
}

type client struct {
	opts    ClientOptions
	methods map[string]bool // nil: all
	policy  core.RetryPolicy
}

// SentKey returns a CallOption through which the client interceptor reports
// the idempotency key it sent with the call (its own, or the one the
// outgoing metadata carried): keep it to ask about the call later, or to
// log it. *key is left alone for calls the interceptor does not key.
func SentKey(key *string) grpc.CallOption { return sentKey{p: key} }

// refusal is the error of a call the client refused to send: a status
// of code (with an ErrorInfo of reason, when given) that wraps err, so
// the caller tells it by status.Code, by Reason and by errors.Is, as
// httpx.Transport's and connectx's refusals are told.
func refusal(code core.Code, reason, msg string, err error) error {
	var st *status.Status
	if reason != "" {
		st = status.FromProto(core.NewStatus(code, reason, msg+": "+err.Error(), 0))
	} else {
		st = status.New(codes.Code(code), msg+": "+err.Error())
	}
	return &refusalError{st: st, err: err}
}

type refusalError struct {
	st  *status.Status
	err error
}

func (e *refusalError) Error() string              { return e.st.Err().Error() }
func (e *refusalError) GRPCStatus() *status.Status { return e.st }
func (e *refusalError) Unwrap() error              { return e.err }

type sentKey struct {
	grpc.EmptyCallOption
	p *string
}

func (c *client) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if c.methods != nil && !c.methods[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var key string
	md, _ := metadata.FromOutgoingContext(ctx)
	if vs := md.Get(c.opts.Metadata); adapter.HasKey(vs) {
		key = vs[0]
	} else {
		key = core.KeyFrom(ctx)
		if key != "" {
			if err := CheckKey(key); err != nil {
				return refusal(core.InvalidArgument, core.ReasonKeyMalformed, "grpcx: idempotency key from the context", err)
			}
		} else {
			var err error
			if key, err = c.opts.NewKey(); err != nil {
				return refusal(core.Internal, "", "grpcx: new idempotency key", err)
			}
		}
		if len(vs) > 0 {
			// Only empty or blank values (a key copied from where there
			// was none): no key, which this one replaces.
			md = md.Copy()
			md.Set(c.opts.Metadata, key)
			ctx = metadata.NewOutgoingContext(ctx, md)
		} else {
			ctx = metadata.AppendToOutgoingContext(ctx, c.opts.Metadata, key)
		}
	}
	for _, o := range opts {
		if s, ok := o.(sentKey); ok && s.p != nil {
			*s.p = key
		}
	}

	callOpts := make([]grpc.CallOption, len(opts), len(opts)+2)
	copy(callOpts, opts)
	var header, trailer metadata.MD
	callOpts = append(callOpts, grpc.Header(&header), grpc.Trailer(&trailer))
	retries := c.policy.Start()
	start, timed := time.Now(), false
	for sent := 1; ; sent++ {
		header, trailer = nil, nil
		err := invoker(ctx, method, req, reply, cc, callOpts...)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !timed && cc != nil {
			// A method's timeout in the service config bounds the whole
			// call, as the caller's deadline (gRFC A6). grpc-go sets it
			// inside the invoker, out of this context's sight, and reads
			// the config only once the channel left idle: without it here,
			// its DeadlineExceeded would be retried as a server's, each
			// attempt with a new timeout.
			if mc := cc.GetMethodConfig(method); mc.Timeout != nil && *mc.Timeout >= 0 {
				timed = true
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, start.Add(*mc.Timeout))
				defer cancel()
				if ctx.Err() != nil {
					return err
				}
			}
		}
		if replayed(header) || replayed(trailer) { // a trailers-only answer carries it in the trailer
			return err // the key's stored answer: asking again can only replay it
		}
		st := status.Convert(err)
		if core.MessageTooLarge(core.Code(st.Code()), st.Message()) {
			return err // as large, or replayed as large, on every retry
		}
		wait, again := retries.Next(core.Failure{Code: core.Code(st.Code()),
			Details: core.AnyDetails(st.Proto().GetDetails()), Pushback: trailer.Get("grpc-retry-pushback-ms")})
		if !again {
			return err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			return err // no time to try again: the caller gets what there is
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return status.FromContextError(fmt.Errorf("grpcx: waiting to retry after attempt %d: %w", sent, ctx.Err())).Err()
		case <-timer.C:
		}
	}
}

// replayed reports whether md says the answer is a key's stored one.
func replayed(md metadata.MD) bool {
	vs := md.Get(ReplayedMetadata)
	return len(vs) == 1 && vs[0] == "true"
}
