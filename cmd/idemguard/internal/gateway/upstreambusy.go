package gateway

import (
	"net/http"
	"strconv"
)

// With unknown_outcome: resend the upstream deduplicates by the derived
// key, so a resend can reach it while its first run of that key still
// goes on (the gateway timed out, or lost the connection, and released the
// key). It then answers "in progress, retry later": 409 Conflict (the IETF
// Idempotency-Key draft, httpx.Guard's default) or 429 Too Many Requests
// (httpx.Options.InFlightStatus), with Retry-After. That is no outcome of
// the request: stored, it would be replayed for the key's whole ttl
// though the upstream completes. So it is passed to the client as it
// came and the key is released; the retry resends under the same derived
// key and gets the upstream's answer (its replay, once its run ended).
// With unknown_outcome: answer the upstream is not taken to deduplicate,
// and such an answer is stored like any other.

// upstreamBusy reports whether res says the upstream runs the request
// already: 409 or 429 with Retry-After.
func upstreamBusy(res *http.Response) bool {
	return (res.StatusCode == http.StatusConflict || res.StatusCode == http.StatusTooManyRequests) &&
		res.Header.Get("Retry-After") != ""
}

// busyAnswer is the upstream's "in progress" answer, held whole: the
// error ModifyResponse fails the exchange with, and what the client gets.
type busyAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (b *busyAnswer) Error() string {
	return "gateway: the upstream answered " + strconv.Itoa(b.status) + " with Retry-After: its run of the key is in progress"
}

func (b *busyAnswer) write(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range b.header {
		h[k] = vs
	}
	h.Set("Content-Length", strconv.Itoa(len(b.body)))
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body)
}

// upstreamBusy ends an attempt the upstream answered "in progress": the
// key is released (ServeHTTP panics, httpx.Guard releases, outer writes
// the answer); its record keeps the forward step, so the next claim
// resends.
func (rt *route) upstreamBusy(r *http.Request, busy *busyAnswer) {
	a := attemptFrom(r.Context())
	a.seal()
	rt.gw.metrics.request(rt.name, resultUpstreamBusy)
	rt.gw.logOutcome(r, rt, a.lease, "the upstream answered its run of the key in progress; key released for a resend with the same upstream key", busy)
	exchangeFrom(r.Context()).release = busy
}
