package httpcore

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

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

// writeProblem writes p as the whole response. extra headers (such as
// Retry-After) are set first.
func writeProblem(w http.ResponseWriter, p Problem, extra ...string) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; keep the response well formed anyway
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	for i := 0; i+1 < len(extra); i += 2 {
		h.Set(extra[i], extra[i+1])
	}
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Encoding")
	if p.Status < 200 || p.Status == http.StatusNoContent || p.Status == http.StatusNotModified {
		h.Del("Content-Length") // these statuses carry no body
		h.Del("Content-Type")
		w.WriteHeader(p.Status)
		return
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// retryAfter formats d as a Retry-After delay in whole seconds, rounded up
// and at least 1.
func retryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}
