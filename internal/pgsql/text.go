package pgsql

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemguard/idemguard/guard"
)

// binaryMark starts a text column's value (fingerprint, last_error) that
// holds bytes a PostgreSQL text value cannot: a NUL byte, or bytes that
// are not UTF-8. The rest is their standard base64.
const binaryMark = "\x01"

// StoredText is how the keys table keeps a fingerprint or a failure reason
// s, which may be any bytes: s itself when PostgreSQL's text type can hold
// it (UTF-8 without NUL bytes) and it does not start with byte 0x01, else
// 0x01 and the standard base64 of s. No two strings are stored alike.
// pgstore.StoredText documents it for users.
func StoredText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) && !strings.HasPrefix(s, binaryMark) {
		return s
	}
	return binaryMark + base64.StdEncoding.EncodeToString([]byte(s))
}

// ReadText undoes StoredText for a value read from the column named what
// of key's row: a value that cannot be undone is guard.ErrCorrupt.
func ReadText(key guard.Key, what, v string) (string, error) {
	if !strings.HasPrefix(v, binaryMark) {
		return v, nil
	}
	b, err := base64.StdEncoding.DecodeString(v[len(binaryMark):])
	if err != nil {
		return "", fmt.Errorf("%w: %s: %s column is not readable: %w", guard.ErrCorrupt, key, what, err)
	}
	return string(b), nil
}
