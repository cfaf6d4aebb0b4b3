// Package grpcx makes unary gRPC methods idempotent with a guard.Guard,
// and gives clients an interceptor that retries safely. It is a module of
// its own (github.com/idemguard/idemguard/grpcx), so the core module does
// not bring google.golang.org/grpc to services that do not use it.
//
// UnaryServerInterceptor is the gRPC form of httpx.Guard. The first call
// of a guarded method with an idempotency key (the "idempotency-key"
// metadata, or a request field through Options.Key) runs the handler and
// stores its response message and the header and trailer metadata it set;
// a repeat with the same key and the same request gets them back with
// "idempotent-replayed: true" in its header, and the handler does not run
// again. Statuses map as follows:
//
//	HTTP (httpx)                 gRPC (grpcx)                          ErrorInfo reason
//	400 key missing / malformed  InvalidArgument                       IDEMPOTENCY_KEY_MISSING / _MALFORMED
//	401 caller unknown           Unauthenticated                       IDEMPOTENCY_CALLER_UNKNOWN
//	409 + Retry-After (in flight) Aborted + google.rpc.RetryInfo        IDEMPOTENCY_KEY_IN_USE
//	422 key reused               FailedPrecondition                    IDEMPOTENCY_KEY_REUSED
//	503 + Retry-After (store)    Unavailable + google.rpc.RetryInfo    IDEMPOTENCY_STORE_UNAVAILABLE
//	500 exhausted                Internal                              IDEMPOTENCY_KEY_EXHAUSTED
//
// Each status the interceptor answers itself carries a google.rpc.ErrorInfo
// with domain ErrorDomain and one of the Reason* constants; Reason reads it.
//
// Why FailedPrecondition for a reused key: gRPC's status code guide keeps
// InvalidArgument for a request that is wrong whatever the system's state,
// and FailedPrecondition for one the system's state refuses and that must
// not be retried until that state changes: the key's earlier use is such a
// state, and the fix (a new key) is the client's. AlreadyExists would tell
// the client its request took effect, and Aborted is retried by clients.
// Neither AIP-155 nor gRPC names a code for it; HTTP's 422 maps to no gRPC
// code.
//
// # Keys are kept per caller
//
// A key is scoped by the caller and the full method name, so one caller's
// key never replays another caller's response. Building the interceptor
// means choosing how the caller is named: Options.Caller
// (CallerFromContext reads what an authentication interceptor stored), or
// Options.SingleCaller for a service one caller owns. The interceptor
// panics without a choice. The caller is never derived from the
// credential itself: a client that refreshes its token between two
// retries is replayed, not run again.
//
// # What is stored when the handler fails
//
// Stripe keeps a request's result once it began to execute, and httpx
// releases the key on a 5xx so a retry runs the handler again. grpcx does
// the same with gRPC codes (DefaultRelease): Canceled, Unknown,
// DeadlineExceeded, ResourceExhausted, Aborted, Unimplemented, Internal,
// Unavailable and DataLoss release the key; every other status is stored
// and replayed (its code, message, details and metadata). A handler that
// panics releases the key. Options.Release changes the choice.
//
// # The client
//
// UnaryClientInterceptor gives each call a UUIDv7 key (or the one in its
// metadata, or WithIdempotencyKey's) and retries it with that key under
// gRPC's retry semantics: the retryable codes, exponential backoff with
// full jitter, the server's RetryInfo and grpc-retry-pushback-ms; a key in
// flight is asked about again after the RetryInfo delay, which the server
// sets from the method's typical run time.
//
// # Connect
//
// The package connectx in this module gives the same interceptors for
// Connect (connectrpc.com/connect) handlers and clients, over the same
// core; it does not link google.golang.org/grpc.
package grpcx
