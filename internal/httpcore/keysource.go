package httpcore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/inventory"
)

// KeySpec is httpx.KeySource: where the key comes from (header, JSON
// body field, or computed).
type KeySpec struct {
	kind    inventory.KeySource // "" is the header
	pointer string              // KeyFromBody: the JSON pointer as given
	tokens  []string            // KeyFromBody: its reference tokens, unescaped
	headers []string            // ComputedKey: the header fields digested, canonical
}

// KeyFromBody is httpx.KeyFromBody (its doc says how the key is read).
// It panics on a malformed pointer.
func KeyFromBody(pointer string) KeySpec {
	ks, err := ParseKeyFromBody(pointer)
	if err != nil {
		panic("httpx.KeyFromBody: " + err.Error())
	}
	return ks
}

// ParseKeyFromBody is httpx.ParseKeyFromBody.
func ParseKeyFromBody(pointer string) (KeySpec, error) {
	tokens, err := parsePointer(pointer)
	if err != nil {
		return KeySpec{}, err
	}
	return KeySpec{kind: inventory.KeyBody, pointer: pointer, tokens: tokens}, nil
}

// ComputedKey is httpx.ComputedKey (its doc says when a computed key is
// wrong).
func ComputedKey(headers ...string) KeySpec {
	ks := KeySpec{kind: inventory.KeyComputed}
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
func (ks KeySpec) computedKey(r Request, route string, body []byte) string {
	d := getDigester()
	defer d.put()
	// The method in upper case, as DefaultScope takes it: a copy that
	// spells it otherwise ("patch" after "PATCH") reaches the same
	// handler, so it gets the same key (and the fingerprint, which keeps
	// the method as sent, answers 422), not a run of its own. A key of a
	// method sent in upper case is as before.
	d.field(strings.ToUpper(r.Method()))
	d.field(route)
	d.field(r.EscapedPath())
	d.field(r.RawQuery())
	d.field(first(r.HeaderValues("Content-Type")))
	for _, name := range ks.headers {
		d.field(name)
		values := r.HeaderValues(name)
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
func (ks KeySpec) describe(header string) string {
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
func (ks KeySpec) bodyKey(body []byte) (string, error) {
	v := json.RawMessage(bytes.TrimSpace(body))
	if len(v) == 0 {
		return "", errNoBodyKey
	}
	if !json.Valid(v) {
		// A JSON document followed by more bytes has a key for a handler
		// that reads it with json.Decoder, which stops after the first
		// value: no key for the guard would let it run unguarded.
		var first json.RawMessage
		if json.NewDecoder(bytes.NewReader(v)).Decode(&first) == nil {
			if _, err := ks.bodyKey(first); !errors.Is(err, errNoBodyKey) {
				return "", fmt.Errorf("%w: the request body is a JSON document with a key at %q followed by more bytes, "+
					"which a handler decoding it with json.Decoder reads", ErrMalformedKey, ks.pointer)
			}
		}
		return "", fmt.Errorf("%w (the key is read at %q)", errNotJSON, ks.pointer)
	}
	for _, tok := range ks.tokens {
		next, ok, err := member(v, tok)
		if err != nil {
			return "", fmt.Errorf("%w (the key is read at %q)", err, ks.pointer)
		}
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
		if !unicodeString(v) {
			// encoding/json would decode it with U+FFFD in place of each
			// bad byte or lone surrogate: two different keys would be one.
			return "", fmt.Errorf("%w: the value at %q is not valid Unicode (bytes that are not UTF-8, or a lone surrogate escape)", ErrMalformedKey, ks.pointer)
		}
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

// unicodeString reports whether v, a JSON string (valid JSON, quotes
// included), decodes to the text it spells, with nothing replaced: its
// bytes are UTF-8 and each \u escape of a surrogate is half of a pair.
func unicodeString(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	hex4 := func(b []byte) rune {
		n, err := strconv.ParseUint(string(b), 16, 32)
		if err != nil {
			return -1
		}
		return rune(n)
	}
	for i := 1; i < len(v)-1; i++ {
		if v[i] != '\\' {
			continue
		}
		i++
		if v[i] != 'u' || i+4 >= len(v) {
			continue
		}
		r := hex4(v[i+1 : i+5])
		i += 4
		switch {
		case 0xd800 <= r && r < 0xdc00:
			if i+6 < len(v) && v[i+1] == '\\' && v[i+2] == 'u' {
				if lo := hex4(v[i+3 : i+7]); 0xdc00 <= lo && lo < 0xe000 {
					i += 6
					continue
				}
			}
			return false
		case 0xdc00 <= r && r < 0xe000:
			return false
		}
	}
	return true
}

// member returns the value the reference token tok selects in v (valid
// JSON): an object's member, or an array's element by its decimal index.
// ok is false when v has no such member or element, or is neither an
// object nor an array. An object with a member whose name is tok in
// another case ("ORDER_ID" for "order_id") is an error wrapping
// ErrMalformedKey: encoding/json decodes such a member into the struct
// field tagged tok, so a handler could read another key than the one the
// guard would keep. So is an object with tok itself more than once:
// encoding/json decodes a later object or array into what the earlier
// one filled, and a later null into a struct or string as nothing, so
// the earlier member's key can survive where the last has none.
func member(v json.RawMessage, tok string) (json.RawMessage, bool, error) {
	switch {
	case len(v) > 0 && v[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(v))
		if _, err := dec.Token(); err != nil { // {
			return nil, false, nil
		}
		var m json.RawMessage
		found := false
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return nil, false, nil
			}
			name, _ := t.(string)
			var val json.RawMessage
			if err := dec.Decode(&val); err != nil {
				return nil, false, nil
			}
			switch {
			case name == tok && found:
				return nil, false, fmt.Errorf("%w: the body has the member %q more than once; "+
					"a handler decoding it into a struct may read the key of either", ErrMalformedKey, tok)
			case name == tok:
				m, found = val, true
			case strings.EqualFold(name, tok):
				return nil, false, fmt.Errorf("%w: the body has a member %q as well as or instead of %q; "+
					"a handler decoding it into a struct reads either as the key", ErrMalformedKey, name, tok)
			}
		}
		return m, found, nil
	case len(v) > 0 && v[0] == '[':
		i, ok := arrayIndex(tok)
		if !ok {
			return nil, false, nil
		}
		var arr []json.RawMessage
		if json.Unmarshal(v, &arr) != nil || i >= len(arr) {
			return nil, false, nil
		}
		return arr[i], true, nil
	}
	return nil, false, nil
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
