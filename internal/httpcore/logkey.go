package httpcore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// keyDigest is what log records carry instead of an idempotency key: the
// first 12 hex digits (48 bits) of SHA-256 over the scope, a zero byte and
// the id. It is metrics.KeyDigest (the same bytes, so the guard's log and
// the middleware's correlate; a test holds them equal), kept here so httpx
// does not import the Prometheus client.
func keyDigest(k guard.Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:6])
}

// logKey returns the attributes that name k in a log record: its digest,
// and with Options.LogKeys its scope and id in full.
func (m *Engine) logKey(k guard.Key) []any {
	if m.opts.LogKeys {
		return []any{"key", keyDigest(k), "scope", k.Scope, "id", k.ID}
	}
	return []any{"key", keyDigest(k)}
}

// logErr returns err's text for a log record, with the key's id replaced
// by its digest unless Options.LogKeys (the guard's errors name the key).
func (m *Engine) logErr(k guard.Key, err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if !m.opts.LogKeys && k.ID != "" {
		s = redactIn(s, k, keyDigest(k))
	}
	return s
}

// redactIn replaces k in s: its "scope/id" form (guard errors name keys so)
// and then its bare id, when that is long enough not to match ordinary
// words.
func redactIn(s string, k guard.Key, digest string) string {
	hidden := "<key " + digest + ">"
	s = strings.ReplaceAll(s, k.String(), k.Scope+"/"+hidden)
	if len(k.ID) >= 8 {
		s = strings.ReplaceAll(s, k.ID, hidden)
	}
	return s
}
