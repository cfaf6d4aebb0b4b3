package core

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/internal/adapter"
)

// DefaultRetryCodes: see grpcx.DefaultRetryCodes.
var DefaultRetryCodes = []Code{Unavailable, ResourceExhausted, Aborted, DeadlineExceeded}

// MessageTooLarge reports whether a status of code with msg is the gRPC
// library's own ResourceExhausted for a message over a size limit (a
// client's receive or send limit, or the server's receive limit), which
// no retry gets under: the request is as large each time, and the guard
// replays the same response. grpc-go words every one "... larger than
// max ...", connect-go "... larger than configured max ..." or "...
// exceeds sendMaxBytes ...". A server's own ResourceExhausted (shed,
// throttled, out of quota) is not.
func MessageTooLarge(code Code, msg string) bool {
	return code == ResourceExhausted && (strings.Contains(msg, "larger than max") ||
		strings.Contains(msg, "larger than configured max") || strings.Contains(msg, "exceeds sendMaxBytes"))
}

// RetryPolicy is a client's retry policy with its defaults filled in.
type RetryPolicy struct {
	MaxAttempts     int
	BaseDelay       time.Duration
	MaxDelay        time.Duration
	MaxRetryDelay   time.Duration
	InFlightDelay   time.Duration
	MaxInFlightWait time.Duration
	Retry           map[Code]bool
}

// NewRetryPolicy fills the defaults of the zero fields; codes nil means
// DefaultRetryCodes.
func NewRetryPolicy(p RetryPolicy, codes []Code) RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = adapter.DefaultMaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = adapter.DefaultBaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = adapter.DefaultMaxDelay
	}
	if p.MaxRetryDelay <= 0 {
		p.MaxRetryDelay = adapter.DefaultMaxServerDelay
	}
	if p.InFlightDelay <= 0 {
		p.InFlightDelay = adapter.DefaultInFlightDelay
	}
	if p.MaxInFlightWait <= 0 {
		p.MaxInFlightWait = adapter.DefaultMaxInFlightWait
	}
	if codes == nil {
		codes = DefaultRetryCodes
	}
	p.Retry = make(map[Code]bool, len(codes))
	for _, c := range codes {
		p.Retry[c] = true
	}
	return p
}

// Failure is what a failed attempt said.
type Failure struct {
	Code    Code
	Details []Detail
	// Pushback is the grpc-retry-pushback-ms values of the answer.
	Pushback []string
}

// Retries is one call's retry state.
type Retries struct {
	p             RetryPolicy
	attempt       int
	inFlightSince time.Time // when the first in-flight answer in a row came
}

// Start returns the retry state of a new call.
func (p RetryPolicy) Start() *Retries { return &Retries{p: p, attempt: 1} }

// Next says how long to wait before the next attempt after f, or false to
// give up and return f's error.
func (r *Retries) Next(f Failure) (time.Duration, bool) {
	switch {
	case f.Code == Aborted && ReasonOf(f.Details) == ReasonKeyInUse:
		// The key's first call is still running: ask again soon.
		now := time.Now()
		if r.inFlightSince.IsZero() {
			r.inFlightSince = now
		}
		d, ok := RetryInfoOf(f.Details)
		wait := adapter.InFlightWait(d, ok, r.p.InFlightDelay, MinInFlightRetryDelay)
		if now.Add(wait).Sub(r.inFlightSince) > r.p.MaxInFlightWait {
			return 0, false
		}
		return wait, true
	case r.p.Retry[f.Code]:
		if r.attempt >= r.p.MaxAttempts {
			return 0, false
		}
		d, told, stop := serverDelay(f)
		switch {
		case stop:
			return 0, false
		case !told:
			d = adapter.Backoff(r.p.BaseDelay, r.p.MaxDelay, r.attempt)
		case d > r.p.MaxRetryDelay:
			return 0, false
		}
		r.attempt++
		r.inFlightSince = time.Time{}
		return d, true
	}
	return 0, false
}

// serverDelay is the delay the server asked for: RetryInfo, else the
// grpc-retry-pushback-ms trailer. stop is true for a pushback that says
// not to retry (negative, or not a number), as gRFC A6 says.
func serverDelay(f Failure) (d time.Duration, told, stop bool) {
	if d, ok := RetryInfoOf(f.Details); ok {
		return d, true, false
	}
	if len(f.Pushback) == 0 {
		return 0, false, false
	}
	ms, err := strconv.ParseInt(f.Pushback[0], 10, 64)
	if err != nil || ms < 0 {
		return 0, false, true
	}
	if ms > int64(math.MaxInt64/time.Millisecond) {
		// Longer than a Duration holds (centuries): longer than any
		// MaxRetryDelay, not a product that wrapped round to a short one.
		return math.MaxInt64, true, false
	}
	return time.Duration(ms) * time.Millisecond, true, false
}
