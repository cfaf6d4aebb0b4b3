package httpx

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/inventory"
)

// KeySource says where Guard finds a request's idempotency key:
// Options.Header (the zero value), a field of the JSON body
// (KeyFromBody), or a digest of the request (ComputedKey). Each route
// group chooses its own, by the Options of its Guard.
type KeySource struct {
	kind    inventory.KeySource // "" is the header
	pointer string              // KeyFromBody: the JSON pointer as given
	tokens  []string            // KeyFromBody: its reference tokens, unescaped
	headers []string            // ComputedKey: the header fields digested, canonical
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
// is empty, longer than MaxKeyLen bytes or holds control characters gets
// 400 (ProblemMalformedKey), and so does a body that is not JSON (with
// Optional it runs unguarded, as it has no key). The Idempotency-Key header
// is not read. The body is read, up to Options.MaxBody, before the key is
// known: a body over the limit gets 413 even without a key.
//
// KeyFromBody panics on a malformed pointer (one that does not start with
// "/", or has "~" not followed by "0" or "1"), as regexp.MustCompile does:
// the pointer is the program's, not input.
func KeyFromBody(pointer string) KeySource {
	tokens, err := parsePointer(pointer)
	if err != nil {
		panic("httpx.KeyFromBody: " + err.Error())
	}
	return KeySource{kind: inventory.KeyBody, pointer: pointer, tokens: tokens}
}

// ComputedKey derives the key of a request that carries none from the
// request itself, for clients that send no key: a SHA-256 over the
// method, the route (Options.Scope), the escaped path and query, the
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
	ks := KeySource{kind: inventory.KeyComputed}
	for _, h := range headers {
		h = strings.TrimSpace(h)
		if h == "" {
			panic("httpx.ComputedKey: empty header name")
		}
		ks.headers = append(ks.headers, textproto.CanonicalMIMEHeaderKey(h))
	}
	return ks
}

// computedPrefix starts every computed key, so a log line or a stored
// record tells a computed key from a client's.
const computedPrefix = "computed:"

// computedKey digests r and body into a key (see ComputedKey).
func (ks KeySource) computedKey(r *http.Request, route string, body []byte) string {
	d := getDigester()
	defer d.put()
	for _, s := range [...]string{r.Method, route, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type")} {
		d.field(s)
	}
	for _, name := range ks.headers {
		d.field(name)
		values := r.Header.Values(name)
		d.field(strconv.Itoa(len(values)))
		for _, v := range values {
			d.field(v)
		}
	}
	// The body, length first, as a field; written to the hash directly.
	d.buf = binary.BigEndian.AppendUint64(d.buf, uint64(len(body)))
	d.flush()
	d.h.Write(body)
	return d.hex(computedPrefix)
}

// describe is the key's description in the inventory.
func (ks KeySource) describe(header string) string {
	switch ks.kind {
	case inventory.KeyBody:
		return ks.pointer
	case inventory.KeyComputed:
		d := "sha256(method, route, path, query, Content-Type"
		if len(ks.headers) > 0 {
			d += ", " + strings.Join(ks.headers, ", ")
		}
		return d + ", body); " + header + " when sent"
	}
	return header
}

// Errors of bodyKey.
var (
	// errNoBodyKey: the body is empty, or the pointer reaches no value or
	// null.
	errNoBodyKey = errors.New("no value at the pointer")
	// errNotJSON: the body is not a JSON document.
	errNotJSON = fmt.Errorf("%w: the request body is not a JSON document", ErrMalformedKey)
)

// bodyKey reads the key at ks's pointer in body. It returns errNoBodyKey
// when there is none, an error wrapping errNotJSON when the body is not
// JSON, one wrapping ErrMalformedKey when the value is not a usable key.
func (ks KeySource) bodyKey(body []byte) (string, error) {
	v := json.RawMessage(bytes.TrimSpace(body))
	if len(v) == 0 {
		return "", errNoBodyKey
	}
	if !json.Valid(v) {
		return "", fmt.Errorf("%w (the key is read at %q)", errNotJSON, ks.pointer)
	}
	for _, tok := range ks.tokens {
		next, ok := member(v, tok)
		if !ok {
			return "", errNoBodyKey
		}
		v = bytes.TrimSpace(next)
	}
	var key string
	switch {
	case len(v) == 0 || string(v) == "null":
		return "", errNoBodyKey
	case v[0] == '"':
		if err := json.Unmarshal(v, &key); err != nil {
			return "", fmt.Errorf("%w: %v", ErrMalformedKey, err)
		}
	case v[0] == '-' || ('0' <= v[0] && v[0] <= '9'):
		key = string(v) // a number, as written
	default:
		return "", fmt.Errorf("%w: the value at %q is not a string or a number", ErrMalformedKey, ks.pointer)
	}
	if err := (guard.Key{Scope: "-", ID: key}).Validate(); err != nil { // empty, over MaxKeyLen, control characters
		return "", fmt.Errorf("%w: %w", ErrMalformedKey, err)
	}
	return key, nil
}

// member returns the value the reference token tok selects in v (valid
// JSON): an object's member, or an array's element by its decimal index.
// ok is false when v has no such member or element, or is neither an
// object nor an array. Of two members with one name the last counts, as
// encoding/json decides.
func member(v json.RawMessage, tok string) (json.RawMessage, bool) {
	switch {
	case len(v) > 0 && v[0] == '{':
		var obj map[string]json.RawMessage
		if json.Unmarshal(v, &obj) != nil {
			return nil, false
		}
		m, ok := obj[tok]
		return m, ok
	case len(v) > 0 && v[0] == '[':
		i, ok := arrayIndex(tok)
		if !ok {
			return nil, false
		}
		var arr []json.RawMessage
		if json.Unmarshal(v, &arr) != nil || i >= len(arr) {
			return nil, false
		}
		return arr[i], true
	}
	return nil, false
}

// arrayIndex reads an RFC 6901 array index: "0", or digits without a
// leading zero. "-" (past the end) selects nothing.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(tok)
	return i, err == nil
}

// parsePointer splits an RFC 6901 JSON pointer into its unescaped
// reference tokens. "" is the whole document.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q does not start with \"/\"", p)
	}
	parts := strings.Split(p[1:], "/")
	for i, s := range parts {
		for j := 0; j < len(s); j++ {
			if s[j] == '~' && (j+1 == len(s) || (s[j+1] != '0' && s[j+1] != '1')) {
				return nil, fmt.Errorf("JSON pointer %q: \"~\" must be followed by 0 or 1", p)
			}
		}
		// ~1 first, then ~0, so "~01" is "~1" and not "/" (RFC 6901 section 4).
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return parts, nil
}
