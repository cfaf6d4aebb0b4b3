package httpcore

import (
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// logKey returns the attributes that name k in a log record: its digest,
// and with Options.LogKeys its scope and id in full (adapter.LogKey).
func (m *Engine) logKey(k guard.Key) []any { return adapter.LogKey(k, m.opts.LogKeys) }

// logErr returns err's text for a log record, with the key's id replaced
// by its digest unless Options.LogKeys (adapter.LogErr).
func (m *Engine) logErr(k guard.Key, err error) string {
	return adapter.LogErr(k, err, m.opts.LogKeys)
}
