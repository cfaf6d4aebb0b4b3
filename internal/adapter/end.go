package adapter

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// Ender ends the claims of a request guard (internal/httpcore's Engine,
// grpcx/internal/core's Server): it stores a completed request's result
// or releases its key, through a store that may be briefly unreachable,
// and logs what it could not do. Set every field.
type Ender struct {
	Guard   *guard.Guard
	Logger  *slog.Logger
	Prefix  string // of every log message: "httpx: "
	LogKeys bool   // name keys in full in the log (LogKey)
}

// Complete stores result for held, retrying while the store cannot be
// reached (Settle, for SettleBudget). If it still cannot, it releases the
// key if it can, so that the next request with it is not told the key is
// in progress until the lease ends: with a SQL backstop under the guard,
// that request then finds the committed result; without one, it runs
// again, as it would have once the lease ran out. attr and value name the
// request in the log record ("path", "/orders"; "method", ...).
func (e *Ender) Complete(held *guard.Held, result []byte, attr, value string) {
	err := Settle(context.Background(), SettleBudget, func(context.Context) error { return held.Complete(result) })
	if err == nil {
		return
	}
	key := held.Lease().Key
	if errors.Is(err, guard.ErrUnavailable) && e.lastRelease(held) == nil {
		e.Logger.Warn(e.Prefix+"response not stored (store unreachable); idempotency key released",
			append(LogKey(key, e.LogKeys), attr, value, "err", LogErr(key, err, e.LogKeys))...)
		return
	}
	// The handler ran; the client gets its real response anyway.
	e.Logger.Error(e.Prefix+"response not stored; a retry with this key may run the handler again",
		append(LogKey(key, e.LogKeys), attr, value, "err", LogErr(key, err, e.LogKeys))...)
}

// lastRelease tries once more, briefly, to free a key whose completion
// could not be stored.
func (e *Ender) lastRelease(held *guard.Held) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(held.Context()), time.Second)
	defer cancel()
	return e.Guard.Release(ctx, held.Lease())
}

// Release undoes held's claim, even if the client is gone, retrying while
// the store cannot be reached (Settle, for SettleBudget); a key it could
// not release frees when its lease ends, and the log says so.
func (e *Ender) Release(held *guard.Held) {
	if err := Settle(context.Background(), SettleBudget, func(context.Context) error { return held.Release() }); err != nil {
		key := held.Lease().Key
		e.Logger.Warn(e.Prefix+"idempotency key not released; it frees when its lease ends",
			append(LogKey(key, e.LogKeys), "err", LogErr(key, err, e.LogKeys))...)
	}
}
