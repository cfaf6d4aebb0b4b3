// Package metrics logs what a guard does through log/slog, with keys
// redacted to a stable digest (KeyDigest), and fans events out to several
// observers (Tee). Prometheus metrics are in the promx module.
package metrics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// LogOptions configure a Logger. The zero value is ready to use.
type LogOptions struct {
	// ReplayLevel is the level of replay records. Default slog.LevelInfo.
	ReplayLevel slog.Leveler
	// ConflictLevel is the level of in-progress, mismatch, exhausted,
	// lease-lost and unavailable records. Default slog.LevelWarn.
	ConflictLevel slog.Leveler
	// All also logs the routine events acquired, completed and released,
	// at slog.LevelDebug. Recovered and failed are logged at Info with or
	// without it.
	All bool
	// LogKeys writes each key's id in full (an "id" attribute). By default
	// a record names the key by its digest only (KeyDigest, the "key"
	// attribute), and the id is replaced by it in error texts too: an
	// idempotency key and its scope are what fetch a stored response.
	LogKeys bool
}

// KeyDigest is how logs name an idempotency key without carrying it: the
// first 12 hex digits (48 bits) of SHA-256 over the key's scope, a zero
// byte and its id. The same key has the same digest in every process, so
// its log lines still correlate (httpx's log uses the same digest), but
// the digest does not give the key back to whoever reads the log, as long
// as the id cannot be guessed (a client's random key): the digest is not
// keyed, so an id from a small set (an order number, a message offset)
// is found by hashing each candidate with the scope the log shows.
func KeyDigest(k guard.Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:6])
}

// Logger is a guard.Observer that logs every replay and every conflict
// (in progress, mismatch, exhausted, lease lost, unavailable), every
// recovered claim and failed attempt at Info level, and every corrupt
// record at Error level, through
// log/slog, with the key's scope and digest (its id too with
// LogOptions.LogKeys), the attempt and the error.
type Logger struct {
	log  *slog.Logger
	opts LogOptions
}

var _ guard.Observer = (*Logger)(nil)

// NewLogger returns a Logger writing to l (slog.Default() when nil).
func NewLogger(l *slog.Logger, opts LogOptions) *Logger {
	if l == nil {
		l = slog.Default()
	}
	if opts.ReplayLevel == nil {
		opts.ReplayLevel = slog.LevelInfo
	}
	if opts.ConflictLevel == nil {
		opts.ConflictLevel = slog.LevelWarn
	}
	return &Logger{log: l, opts: opts}
}

// Observe implements guard.Observer.
func (l *Logger) Observe(ctx context.Context, e guard.Event) {
	var level slog.Level
	switch e.Kind {
	case guard.EventReplayed:
		level = l.opts.ReplayLevel.Level()
	case guard.EventInProgress, guard.EventMismatch, guard.EventExhausted,
		guard.EventLeaseLost, guard.EventUnavailable:
		level = l.opts.ConflictLevel.Level()
	case guard.EventRecovered, guard.EventFailed:
		level = slog.LevelInfo
	case guard.EventCorrupt:
		level = slog.LevelError // a record nothing can read: the key is stuck until an operator acts
	default:
		if !l.opts.All {
			return
		}
		level = slog.LevelDebug
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	digest := KeyDigest(e.Key)
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs, slog.String("event", e.Kind.String()),
		slog.String("scope", e.Key.Scope), slog.String("key", digest))
	if l.opts.LogKeys {
		attrs = append(attrs, slog.String("id", e.Key.ID))
	}
	if e.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	}
	if e.Err != nil {
		msg := e.Err.Error()
		if !l.opts.LogKeys {
			msg = redactIn(msg, e.Key, digest)
		}
		attrs = append(attrs, slog.String("error", msg))
	}
	l.log.LogAttrs(ctx, level, "idemguard "+e.Kind.String(), attrs...)
}

// Tee returns an Observer that hands each event to every one of obs, in
// order (nil entries are skipped).
func Tee(obs ...guard.Observer) guard.Observer {
	list := make([]guard.Observer, 0, len(obs))
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	return tee(list)
}

type tee []guard.Observer

func (t tee) Observe(ctx context.Context, e guard.Event) {
	for _, o := range t {
		o.Observe(ctx, e)
	}
}

// Redact returns s with key k hidden behind its digest (KeyDigest): its
// "scope/id" form (guard errors name keys so) becomes "scope/<key digest>",
// and its bare id "<key digest>". An id shorter than 4 bytes is hidden in
// the first form only: alone it would match parts of ordinary words. The
// Logger and otelx hide keys in error texts so.
func Redact(s string, k guard.Key) string {
	return redactIn(s, k, KeyDigest(k))
}

func redactIn(s string, k guard.Key, digest string) string {
	if k.ID == "" {
		return s
	}
	hidden := "<key " + digest + ">"
	s = strings.ReplaceAll(s, k.String(), k.Scope+"/"+hidden)
	if len(k.ID) >= 4 {
		s = strings.ReplaceAll(s, k.ID, hidden)
	}
	return s
}
