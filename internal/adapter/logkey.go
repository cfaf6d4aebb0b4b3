package adapter

import (
	"strings"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

// LogKey returns the attributes that name k in a log record: "key", its
// digest (metrics.KeyDigest, so the adapter's records and the guard's
// correlate), and with full (the adapters' LogKeys option) "scope" and
// "id" in full.
func LogKey(k guard.Key, full bool) []any {
	if full {
		return []any{"key", metrics.KeyDigest(k), "scope", k.Scope, "id", k.ID}
	}
	return []any{"key", metrics.KeyDigest(k)}
}

// LogErr returns err's text for a log record (or an error text the client
// reads), with k replaced by its digest unless full: its "scope/id" form
// (guard errors name keys so) becomes "scope/<key digest>", and then its
// bare id, when that is 8 bytes or longer (shorter ones could match
// ordinary words), "<key digest>". A nil err is "".
func LogErr(k guard.Key, err error, full bool) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if full || k.ID == "" {
		return s
	}
	hidden := "<key " + metrics.KeyDigest(k) + ">"
	s = strings.ReplaceAll(s, k.String(), k.Scope+"/"+hidden)
	if len(k.ID) >= 8 {
		s = strings.ReplaceAll(s, k.ID, hidden)
	}
	return s
}
