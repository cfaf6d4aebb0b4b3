package httpx

// Problem type URIs, one per case, stable across versions: clients may
// branch on them. They identify the case; they need not resolve.
const (
	ProblemMissingKey       = "https://idemguard.dev/problems/missing-key"        // 400: no key on a route that requires one
	ProblemMalformedKey     = "https://idemguard.dev/problems/malformed-key"      // 400: a key that ParseKey rejects, or two key fields
	ProblemBodyUnreadable   = "https://idemguard.dev/problems/body-unreadable"    // 400: the request body could not be read
	ProblemKeyMismatch      = "https://idemguard.dev/problems/key-mismatch"       // 422: the key was used with another request
	ProblemInFlight         = "https://idemguard.dev/problems/request-in-flight"  // 409 (configurable): the key's first request still runs
	ProblemBodyTooLarge     = "https://idemguard.dev/problems/body-too-large"     // 413: the request body is over Options.MaxBody
	ProblemStoreUnavailable = "https://idemguard.dev/problems/store-unavailable"  // 503: the guard's store cannot be reached
	ProblemStoreError       = "https://idemguard.dev/problems/store-error"        // 500: the store answered with an error
	ProblemExhausted        = "https://idemguard.dev/problems/attempts-exhausted" // 500: the key ran out of attempts (its holders kept dying)
	ProblemHandlerPanic     = "https://idemguard.dev/problems/handler-panic"      // 500: the handler panicked; the key was released
	ProblemResponseNotKept  = "https://idemguard.dev/problems/response-not-kept"  // original status: the request ran, its response was not stored
	ProblemCorruptResponse  = "https://idemguard.dev/problems/corrupt-response"   // 500: the stored response cannot be read
	ProblemCallerUnknown    = "https://idemguard.dev/problems/caller-unknown"     // 401: Options.Tenant named no caller for the request
)

// Problem is an RFC 9457 problem details object, the body of every
// response the middleware writes itself.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Key is the idempotency key the problem concerns, when one was read.
	Key string `json:"idempotency_key,omitempty"`
}

// ProblemContentType is the media type of a Problem body.
const ProblemContentType = "application/problem+json"
