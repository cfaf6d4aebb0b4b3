package pgstore

import (
	"github.com/idemguard/idemguard/internal/pgsql"
)

// StoredText is how the keys table keeps a fingerprint or a failure reason
// s, which may be any bytes (a raw digest as a fingerprint; an error's text
// quoting the bytes that broke it): s itself when PostgreSQL's text type
// can hold it (UTF-8 without NUL bytes) and it does not start with byte
// 0x01, else 0x01 and the standard base64 of s. Text is stored as it was,
// and no two strings are stored alike. A statement that writes or
// compares such a column of the Store's rows passes its value through
// StoredText; a value read from it is undone before it is answered (Get,
// and backstop.Wrap's Get).
func StoredText(s string) string { return pgsql.StoredText(s) }

// readText undoes StoredText for a value read from the column named what
// of key's row.
var readText = pgsql.ReadText
