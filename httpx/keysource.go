package httpx

import (
	"fmt"

	"github.com/idemguard/idemguard/internal/httpcore"
)

// KeySource says where Guard finds a request's idempotency key:
// Options.Header (the zero value), a field of the JSON body
// (KeyFromBody), or a digest of the request (ComputedKey). Each route
// group chooses its own, by the Options of its Guard.
type KeySource struct {
	spec httpcore.KeySpec // the zero value is the header
}

// KeyFromBody reads the key from the JSON request body, at pointer, an RFC
// 6901 JSON pointer ("/order_id", "/order/id", "/items/0/ref"; "~1" stands
// for "/" in a member name and "~0" for "~"). The value there must be a
// JSON string or number; the key is the string, or the number as written.
//
// A body key behaves as a header key does: the same key with a different
// request (the default fingerprint covers the whole body) gets 422; a
// request without one gets 400 (ProblemMissingKey), or with
// Options.Optional runs unguarded; a value that is not a string or number,
// is empty, longer than MaxKeyLen bytes, holds control characters or is not
// valid Unicode (bytes that are not UTF-8, a lone surrogate escape such as
// "\ud800", which encoding/json would turn into U+FFFD) gets 400
// (ProblemMalformedKey), and so does a body that is not JSON (with
// Optional it runs unguarded, as it has no key), except one that starts
// with a JSON document holding a key, followed by more bytes, which gets
// 400 with Optional too: a handler decoding it with json.Decoder, which
// stops after the first document, reads that key. A body in which an
// object on the pointer's path has a member named as the pointer's token
// in another case ("ORDER_ID" beside or instead of "order_id") gets 400
// (ProblemMalformedKey) too, with Optional as well: encoding/json decodes
// such a member into the struct field tagged "order_id", so the handler
// could read another key than the one the guard keeps. A body with the
// pointer's token as a member name more than once in an object on its
// path gets 400 (ProblemMalformedKey) too, with Optional as well:
// encoding/json decodes a later object or array into what the earlier
// one filled, and a later null as nothing, so the handler could read
// the earlier member's key where the last has none. The
// Idempotency-Key header
// is not read. The body is read, up to Options.MaxBody, before the key is
// known: a body over the limit gets 413 even without a key.
//
// KeyFromBody panics on a malformed pointer (one that does not start with
// "/", or has "~" not followed by "0" or "1"), as regexp.MustCompile does:
// the pointer is the program's, not input. A pointer read from
// configuration goes through ParseKeyFromBody.
func KeyFromBody(pointer string) KeySource { return KeySource{spec: httpcore.KeyFromBody(pointer)} }

// ParseKeyFromBody is KeyFromBody for a pointer that comes from
// configuration: a malformed pointer is an error naming what is wrong.
func ParseKeyFromBody(pointer string) (KeySource, error) {
	spec, err := httpcore.ParseKeyFromBody(pointer)
	if err != nil {
		return KeySource{}, fmt.Errorf("httpx: key pointer %q: %w", pointer, err)
	}
	return KeySource{spec: spec}, nil
}

// ComputedKey derives the key of a request that carries none from the
// request itself, for clients that send no key: a SHA-256 over the
// method (in upper case, as DefaultScope takes it), the route (Options.Scope), the escaped path and query, the
// Content-Type, the header fields named in headers (e.g. a client's
// request id or a date it sets once per order, if it has one) and the
// body. The key's scope adds the caller (Options.Tenant), as for every
// key, so two callers' identical requests never meet. A retry of the same
// request (the same body and named fields) replays the first one's
// response; a different body runs.
//
// A request that carries Options.Header is keyed by it instead, exactly as
// on a header route: a client that knows two identical requests are two
// orders can say so with two keys.
//
// When a computed key is wrong: two identical requests that are meant to
// be two effects, within the guard's TTL, become one. Two orders of the
// same item by the same caller, with the same body, sent within TTL of
// each other, are one order: the second gets the first's response
// (Idempotent-Replayed: true) and nothing is charged. Use a computed key
// only where a client never sends the same body twice on purpose (the
// body carries something unique to the intent: a cart id, a client-made
// order number, a timestamp the client sets once), or shorten the guard's
// TTL to the window in which a client retries; prefer a key the client
// sends (the header or KeyFromBody) whenever the client can send one.
// Header fields that change between retries (a fresh request id or date
// per attempt) must not be named in headers, or every retry runs.
//
// Every request of a guarded method is deduplicated: Options.Optional
// has no meaning with a computed key, and Guard panics if both are set. A
// custom Options.Fingerprint should read nothing the key does not cover,
// or two requests with one computed key get 422.
func ComputedKey(headers ...string) KeySource {
	return KeySource{spec: httpcore.ComputedKey(headers...)}
}
