package httpx

import (
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// MaxKeyLen is the longest idempotency key ParseKey accepts, in bytes
// (Stripe's limit, and the IETF draft's guidance).
const MaxKeyLen = guard.MaxIDLen

// ErrMalformedKey is returned by ParseKey for a header value that is not a
// usable idempotency key.
var ErrMalformedKey = httpcore.ErrMalformedKey

// ParseKey reads an Idempotency-Key field value. It accepts a bare token
// (visible ASCII without DQUOTE, backslash or comma; a comma would mean two
// values folded into one line) or an RFC 8941 sf-string (a quoted string
// where only \" and \\ are escapes and the content is printable ASCII,
// space included). Surrounding spaces and tabs are ignored; structured-field
// parameters are not accepted. The key, unquoted, is 1 to MaxKeyLen bytes.
// Any other value gives an error wrapping ErrMalformedKey.
func ParseKey(value string) (string, error) { return httpcore.ParseKey(value) }
