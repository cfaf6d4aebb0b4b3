package httpcore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// MaxKeyLen is the longest idempotency key ParseKey accepts, in bytes
// (Stripe's limit, and the IETF draft's guidance).
const MaxKeyLen = guard.MaxIDLen

// ErrMalformedKey is returned by ParseKey for a header value that is not a
// usable idempotency key.
var ErrMalformedKey = errors.New("httpx: malformed idempotency key")

// ParseKey reads an Idempotency-Key field value. It accepts a bare token
// (visible ASCII without DQUOTE, backslash or comma; a comma would mean two
// values folded into one line) or an RFC 8941 sf-string (a quoted string
// where only \" and \\ are escapes and the content is printable ASCII,
// space included). Surrounding spaces and tabs are ignored; structured-field
// parameters are not accepted. The key, unquoted, is 1 to MaxKeyLen bytes.
// Any other value gives an error wrapping ErrMalformedKey.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrMalformedKey)
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == ',' {
				return "", fmt.Errorf("%w: byte 0x%02x at %d is not allowed in a bare key", ErrMalformedKey, c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty", ErrMalformedKey)
	}
	if len(key) > MaxKeyLen {
		return "", fmt.Errorf("%w: %d bytes, more than %d", ErrMalformedKey, len(key), MaxKeyLen)
	}
	return key, nil
}

// parseSFString reads v, which starts with DQUOTE, as a whole RFC 8941
// sf-string (section 4.2.5) and returns its content.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) {
				return "", fmt.Errorf("%w: string ends inside an escape", ErrMalformedKey)
			}
			if v[i] != '"' && v[i] != '\\' {
				return "", fmt.Errorf("%w: bad escape \\%c at %d", ErrMalformedKey, v[i], i)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the closing quote", ErrMalformedKey)
			}
			return b.String(), nil
		case c < 0x20 || c >= 0x7f:
			return "", fmt.Errorf("%w: byte 0x%02x at %d is not allowed in a string", ErrMalformedKey, c, i)
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyLen {
			return "", fmt.Errorf("%w: more than %d bytes", ErrMalformedKey, MaxKeyLen)
		}
	}
	return "", fmt.Errorf("%w: no closing quote", ErrMalformedKey)
}
