package guard

import (
	"fmt"
	"unicode/utf8"
)

// Limits on the parts of a Key.
const (
	MaxIDLen    = 255  // bytes in Key.ID, as Stripe and the IETF draft allow
	MaxScopeLen = 1024 // bytes in Key.Scope
)

// Key names one logical operation: the client's idempotency key or a message
// id (ID), inside a namespace such as tenant + method + route or a consumer
// group (Scope). Keys of different scopes never meet.
type Key struct {
	Scope string
	ID    string
}

// String returns the key as "scope/id", for logs.
func (k Key) String() string { return k.Scope + "/" + k.ID }

// Validate reports whether the key can be stored. Both parts must be
// non-empty, valid UTF-8 without control characters, the ID at most
// MaxIDLen bytes and the scope at most MaxScopeLen bytes. A bad key gives an
// error that wraps ErrInvalidKey.
func (k Key) Validate() error {
	if err := checkPart("id", k.ID, MaxIDLen); err != nil {
		return err
	}
	return checkPart("scope", k.Scope, MaxScopeLen)
}

func checkPart(name, s string, max int) error {
	if s != "" && len(s) <= max && printable(s) {
		return nil // the usual key: nothing to decode
	}
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidKey, name)
	case len(s) > max:
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalidKey, name, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidKey, name)
	}
	for i, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%w: %s has control character %U at byte %d", ErrInvalidKey, name, r, i)
		}
	}
	return nil
}

// printable reports whether s is all printable ASCII (0x20 to 0x7e): valid
// UTF-8 without a control character, which checkPart then need not decode.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
