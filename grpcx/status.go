package grpcx

import (
	"time"

	"google.golang.org/grpc/status"

	"github.com/idemguard/idemguard/grpcx/internal/core"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo every status the
// interceptor answers itself carries, with one of the Reason* constants.
// Clients branch on (ErrorDomain, reason), which stay the same across
// versions; the message is for people.
const ErrorDomain = core.ErrorDomain

// The reasons of the statuses the interceptor answers itself, in
// google.rpc.ErrorInfo (UPPER_SNAKE_CASE, as AIP-193 asks). Each names the
// HTTP problem type httpx answers in the same case.
const (
	// ReasonKeyMissing: InvalidArgument; the method requires a key and the
	// call carried none (httpx: 400 missing-key).
	ReasonKeyMissing = core.ReasonKeyMissing
	// ReasonKeyMalformed: InvalidArgument; the key cannot be used: two
	// values, empty, too long, bytes outside visible ASCII (httpx: 400
	// malformed-key).
	ReasonKeyMalformed = core.ReasonKeyMalformed
	// ReasonKeyReused: FailedPrecondition; the key was used before with
	// another request (httpx: 422 key-mismatch). Use a new key.
	ReasonKeyReused = core.ReasonKeyReused
	// ReasonKeyInUse: Aborted with google.rpc.RetryInfo; a call with this
	// key is still running (httpx: 409 in-flight with Retry-After).
	ReasonKeyInUse = core.ReasonKeyInUse
	// ReasonKeyExhausted: Internal; the call with this key was abandoned
	// too often (guard.Options.MaxAttempts) and will not run again (httpx:
	// 500 exhausted).
	ReasonKeyExhausted = core.ReasonKeyExhausted
	// ReasonStoreUnavailable: Unavailable with google.rpc.RetryInfo; the
	// idempotency store could not be reached and the call did not run
	// (httpx: 503 store-unavailable).
	ReasonStoreUnavailable = core.ReasonStoreUnavailable
	// ReasonStoreError: Internal; the store answered with an error the
	// interceptor cannot classify; the call did not run.
	ReasonStoreError = core.ReasonStoreError
	// ReasonCallerUnknown: Unauthenticated; keys are kept per caller and
	// Options.Caller named none (httpx: 401 caller-unknown).
	ReasonCallerUnknown = core.ReasonCallerUnknown
	// ReasonResponseNotKept: AlreadyExists, on a replay; the call with this
	// key ran and succeeded, but its response was not stored (larger than
	// Options.MaxStoredResponse, or not a protobuf message).
	ReasonResponseNotKept = core.ReasonResponseNotKept
	// ReasonResponseCorrupt: Internal, on a replay; the call ran, but its
	// stored response cannot be read.
	ReasonResponseCorrupt = core.ReasonResponseCorrupt
	// ReasonFingerprint: Internal; the request could not be fingerprinted
	// (Options.Fingerprint failed, or the request is not a protobuf
	// message); the call did not run.
	ReasonFingerprint = core.ReasonFingerprint
)

// Reason returns the reason of the ErrorInfo in err's status whose domain
// is ErrorDomain, or "" when err carries none: what a client branches on
// (errors.Is does not see into a status).
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	return core.ReasonOf(core.AnyDetails(st.Proto().GetDetails()))
}

// RetryDelay returns the delay of the google.rpc.RetryInfo in err's status,
// if it carries one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	return core.RetryInfoOf(core.AnyDetails(st.Proto().GetDetails()))
}
