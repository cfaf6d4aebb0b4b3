package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// Problem types the gateway answers with itself (RFC 9457), besides
// httpx's. Stable: clients may branch on them.
const (
	// ProblemOutcomeUnknown (500): the request may have reached the
	// upstream and no complete answer came back. It is the key's stored
	// result: every retry gets it, Idempotent-Replayed: true, and the
	// request is never sent again. Reconcile with the upstream (it
	// received upstream_idempotency_key). 500, not 502 or 504: the answer
	// is final, and retrying clients (httpx.Transport among them) retry
	// 502, 503 and 504, which would only fetch the same answer again.
	ProblemOutcomeUnknown = "https://idemguard.dev/problems/upstream-outcome-unknown"
	// ProblemNotForwarded (503 with Retry-After): nothing of the request
	// reached the upstream (it could not be reached, or the gateway is
	// stopping); the key was released and a retry with it runs.
	ProblemNotForwarded = "https://idemguard.dev/problems/not-forwarded"
	// ProblemResend (502 with Retry-After), on routes with
	// unknown_outcome: resend: the request may have reached the upstream
	// without a complete answer; the key was released and a retry sends
	// it again with the same upstream idempotency key.
	ProblemResend = "https://idemguard.dev/problems/upstream-resend"
)

// problem is an RFC 9457 document with the gateway's members.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Key    string `json:"idempotency_key,omitempty"`
	// UpstreamKey is the Idempotency-Key the upstream received (or would
	// have): what to look the request up by there.
	UpstreamKey string `json:"upstream_idempotency_key,omitempty"`
	ForwardedAt string `json:"forwarded_at,omitempty"`

	retryAfter time.Duration
}

func (p *problem) write(w http.ResponseWriter) {
	body, err := json.Marshal(p)
	if err != nil {
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", httpx.ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Encoding")
	if p.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(p.retryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

func outcomeUnknown(lease guard.Lease, at time.Time, why string) *problem {
	p := &problem{Type: ProblemOutcomeUnknown, Title: "Upstream outcome unknown", Status: http.StatusInternalServerError,
		Detail: why + ". The request may have been carried out. This answer is kept for the idempotency key: " +
			"it will not be sent again; check with the service under upstream_idempotency_key.",
		Key: lease.Key.ID, UpstreamKey: lease.KeyFor(forwardStep)}
	if !at.IsZero() {
		p.ForwardedAt = at.UTC().Format(time.RFC3339Nano)
	}
	return p
}

func notForwarded(cause error) *problem {
	detail := "the upstream could not be reached; nothing was sent. Retry with the same idempotency key."
	if errors.Is(cause, errShuttingDown) {
		detail = "the gateway is shutting down; nothing was sent. Retry with the same idempotency key."
	} else if errors.Is(cause, guard.ErrUnavailable) || errors.Is(cause, guard.ErrLeaseLost) {
		detail = "the idempotency store could not record the request before sending it; nothing was sent. Retry with the same idempotency key."
	}
	return &problem{Type: ProblemNotForwarded, Title: "Not forwarded", Status: http.StatusServiceUnavailable,
		Detail: detail, retryAfter: time.Second}
}

func resendProblem(lease guard.Lease) *problem {
	return &problem{Type: ProblemResend, Title: "Upstream outcome unknown; retry to resend", Status: http.StatusBadGateway,
		Detail: "the request may have reached the upstream without a complete answer; a retry with the same idempotency key " +
			"sends it again with the same upstream idempotency key, which the upstream deduplicates",
		Key: lease.Key.ID, UpstreamKey: lease.KeyFor(forwardStep), retryAfter: time.Second}
}

// retryAfterSeconds is d as a Retry-After: whole seconds, rounded up, at
// least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}
