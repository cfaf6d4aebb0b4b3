package metrics

import (
	"context"
	"log/slog"

	"github.com/idemguard/idemguard/guard"
)

// LogOptions configure a Logger. The zero value is ready to use.
type LogOptions struct {
	// ReplayLevel is the level of replay records. Default slog.LevelInfo.
	ReplayLevel slog.Leveler
	// ConflictLevel is the level of in-progress, mismatch, exhausted,
	// lease-lost and unavailable records. Default slog.LevelWarn.
	ConflictLevel slog.Leveler
	// All also logs the routine events (acquired, completed, failed,
	// released, recovered) at slog.LevelDebug; without it only recovered
	// and failed are logged, at Info.
	All bool
}

// Logger is a guard.Observer that logs every replay and every conflict
// (in progress, mismatch, exhausted, lease lost, unavailable) through
// log/slog, with the key's scope and id, the attempt and the error.
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
	default:
		if !l.opts.All {
			return
		}
		level = slog.LevelDebug
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 5)
	attrs = append(attrs, slog.String("event", e.Kind.String()),
		slog.String("scope", e.Key.Scope), slog.String("id", e.Key.ID))
	if e.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
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
