package grpcx

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo every status the
// interceptor answers itself carries, with one of the Reason* constants.
// Clients branch on (ErrorDomain, reason), which stay the same across
// versions; the message is for people.
const ErrorDomain = "idemguard"

// The reasons of the statuses the interceptor answers itself, in
// google.rpc.ErrorInfo (UPPER_SNAKE_CASE, as AIP-193 asks). Each names the
// HTTP problem type httpx answers in the same case.
const (
	// ReasonKeyMissing: InvalidArgument; the method requires a key and the
	// call carried none (httpx: 400 missing-key).
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyMalformed: InvalidArgument; the key cannot be used: two
	// values, empty, too long, bytes outside visible ASCII (httpx: 400
	// malformed-key).
	ReasonKeyMalformed = "IDEMPOTENCY_KEY_MALFORMED"
	// ReasonKeyReused: FailedPrecondition; the key was used before with
	// another request (httpx: 422 key-mismatch). Use a new key.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonKeyInUse: Aborted with google.rpc.RetryInfo; a call with this
	// key is still running (httpx: 409 in-flight with Retry-After).
	ReasonKeyInUse = "IDEMPOTENCY_KEY_IN_USE"
	// ReasonKeyExhausted: Internal; the call with this key was abandoned
	// too often (guard.Options.MaxAttempts) and will not run again (httpx:
	// 500 exhausted).
	ReasonKeyExhausted = "IDEMPOTENCY_KEY_EXHAUSTED"
	// ReasonStoreUnavailable: Unavailable with google.rpc.RetryInfo; the
	// idempotency store could not be reached and the call did not run
	// (httpx: 503 store-unavailable).
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonStoreError: Internal; the store answered with an error the
	// interceptor cannot classify; the call did not run.
	ReasonStoreError = "IDEMPOTENCY_STORE_ERROR"
	// ReasonCallerUnknown: Unauthenticated; keys are kept per caller and
	// Options.Caller named none (httpx: 401 caller-unknown).
	ReasonCallerUnknown = "IDEMPOTENCY_CALLER_UNKNOWN"
	// ReasonResponseNotKept: AlreadyExists, on a replay; the call with this
	// key ran and succeeded, but its response was not stored (larger than
	// Options.MaxStoredResponse, or not a protobuf message).
	ReasonResponseNotKept = "IDEMPOTENCY_RESPONSE_NOT_KEPT"
	// ReasonResponseCorrupt: Internal, on a replay; the call ran, but its
	// stored response cannot be read.
	ReasonResponseCorrupt = "IDEMPOTENCY_RESPONSE_CORRUPT"
	// ReasonFingerprint: Internal; the request could not be fingerprinted
	// (Options.Fingerprint failed, or the request is not a protobuf
	// message); the call did not run.
	ReasonFingerprint = "IDEMPOTENCY_FINGERPRINT_FAILED"
)

// newStatus is a status with an ErrorInfo of reason and, when retry > 0,
// a RetryInfo of that delay.
func newStatus(code codes.Code, reason, msg string, retry time.Duration) *status.Status {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil { // only for a code OK, which is never asked for
		return status.New(code, msg)
	}
	return st
}

// Reason returns the reason of the ErrorInfo in err's status whose domain
// is ErrorDomain, or "" when err carries none: what a client branches on
// (errors.Is does not see into a status).
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// RetryDelay returns the delay of the google.rpc.RetryInfo in err's status,
// if it carries one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	return retryInfo(st)
}

func retryInfo(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err != nil {
				return 0, false
			}
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
