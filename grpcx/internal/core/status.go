package core

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Code is a gRPC status code; Connect's codes have the same numbers.
type Code = uint32

// The codes core uses.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

// ErrorDomain is the domain of every ErrorInfo the server answers with.
const ErrorDomain = "idemguard"

// Reasons; see grpcx.
const (
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"
	ReasonKeyMalformed     = "IDEMPOTENCY_KEY_MALFORMED"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonKeyInUse         = "IDEMPOTENCY_KEY_IN_USE"
	ReasonKeyExhausted     = "IDEMPOTENCY_KEY_EXHAUSTED"
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonStoreError       = "IDEMPOTENCY_STORE_ERROR"
	ReasonCallerUnknown    = "IDEMPOTENCY_CALLER_UNKNOWN"
	ReasonResponseNotKept  = "IDEMPOTENCY_RESPONSE_NOT_KEPT"
	ReasonResponseCorrupt  = "IDEMPOTENCY_RESPONSE_CORRUPT"
	ReasonFingerprint      = "IDEMPOTENCY_FINGERPRINT_FAILED"
)

// NewStatus is a status with an ErrorInfo of reason and, when retry > 0, a
// RetryInfo of that delay.
func NewStatus(code Code, reason, msg string, retry time.Duration) *spb.Status {
	st := &spb.Status{Code: int32(code), Message: msg}
	if a, err := anypb.New(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}); err == nil {
		st.Details = append(st.Details, a)
	}
	if retry > 0 {
		if a, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
			st.Details = append(st.Details, a)
		}
	}
	return st
}

// Detail is an error detail as each library gives it: its message full
// name and encoding.
type Detail struct {
	Type  string // e.g. "google.rpc.RetryInfo"
	Bytes []byte
}

// ReasonOf is the reason of the first ErrorInfo of ErrorDomain in details.
func ReasonOf(details []Detail) string {
	for _, d := range details {
		if d.Type != "google.rpc.ErrorInfo" {
			continue
		}
		info := &errdetails.ErrorInfo{}
		if proto.Unmarshal(d.Bytes, info) == nil && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// RetryInfoOf is the delay of the first valid RetryInfo in details.
func RetryInfoOf(details []Detail) (time.Duration, bool) {
	for _, d := range details {
		if d.Type != "google.rpc.RetryInfo" {
			continue
		}
		ri := &errdetails.RetryInfo{}
		if proto.Unmarshal(d.Bytes, ri) != nil || ri.GetRetryDelay() == nil || ri.GetRetryDelay().CheckValid() != nil {
			continue
		}
		return max(ri.GetRetryDelay().AsDuration(), 0), true
	}
	return 0, false
}

// AnyDetails turns a status's details (Any) into Details.
func AnyDetails(as []*anypb.Any) []Detail {
	out := make([]Detail, 0, len(as))
	for _, a := range as {
		out = append(out, Detail{Type: string(a.MessageName()), Bytes: a.GetValue()})
	}
	return out
}
