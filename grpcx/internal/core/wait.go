package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// runTimes keeps, per full method, a moving average of how long the
// handler took: what the in-flight answer's RetryInfo is made of. It is
// this instance's own; another instance that has not run the method yet
// answers with DefaultInFlightRetryDelay.
type runTimes struct {
	mu sync.Mutex
	m  map[string]time.Duration
}

// maxMethods bounds runTimes (Options.Methods bounds it already; this
// keeps the map small whatever happens).
const maxMethods = 1024

func (t *runTimes) observe(method string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	avg, ok := t.m[method]
	switch {
	case ok:
		t.m[method] = avg + (d-avg)/4 // weight 1/4 on the newest run
	case t.m == nil || len(t.m) >= maxMethods:
		t.m = map[string]time.Duration{method: d}
	default:
		t.m[method] = d
	}
}

func (t *runTimes) typical(method string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[method]
	return d, ok
}

// The in-flight answer's retry delay (RetryInfo), see inFlightRetryDelay.
const (
	// DefaultInFlightRetryDelay is the delay given before this instance
	// has seen the method run.
	DefaultInFlightRetryDelay = time.Second
	// MinInFlightRetryDelay is the shortest delay given, so that a
	// duplicate of a fast call does not spin.
	MinInFlightRetryDelay = 20 * time.Millisecond
)

// InFlightRetryDelay is when a call whose key is still running should come
// back: the method's typical run time on this instance (a moving average),
// at least MinInFlightRetryDelay, DefaultInFlightRetryDelay before the
// method ran here; at most what is left of the holder's lease (by then the
// key is answered or free). Unlike HTTP's Retry-After, RetryInfo is not in
// whole seconds, so a 50 ms method is asked about again after about 50 ms,
// not a second. leaseLeft <= 0 means unknown.
func (s *Server) InFlightRetryDelay(method string, leaseLeft time.Duration) time.Duration {
	d := DefaultInFlightRetryDelay
	if typ, ok := s.runs.typical(method); ok {
		d = max(typ, MinInFlightRetryDelay)
	}
	if leaseLeft > 0 {
		d = min(d, max(leaseLeft, MinInFlightRetryDelay))
	}
	return d
}

// wait is called for a call whose key another call holds: it waits,
// up to Options.Wait, for the key to be answered or freed, and returns
// what a claim then says (a replay, the key for this call, or the
// in-flight error when the bound passed); see guard.Guard.Wait. ok is
// false when the client left (nothing was claimed).
func (s *Server) wait(ctx context.Context, key guard.Key, fingerprint string) (out guard.Outcome, err error, ok bool) {
	out, err = s.g.Wait(ctx, key, fingerprint, guard.WaitOptions{Timeout: s.cfg.Wait})
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return guard.Outcome{}, nil, false
	}
	return out, err, true
}

// settleBudget bounds how long the interceptor keeps retrying the write
// that ends a claim (Complete or Release) while the store is unreachable,
// as httpx does: a claim neither completed nor released stays pending
// until its lease runs out, and every retry of the key meanwhile gets
// Aborted. Two seconds see the write through a Redis restart (go-redis
// probes a dead server once a second).
const settleBudget = 2 * time.Second

// settle runs write until it succeeds, fails for a reason other than the
// store being unreachable, or budget has passed, backing off between
// tries (20 ms, doubled up to 250 ms). Complete and Release are safe to
// repeat.
func settle(ctx context.Context, budget time.Duration, write func(context.Context) error) error {
	deadline := time.Now().Add(budget)
	delay := 20 * time.Millisecond
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		err := write(ctx)
		if err == nil || !errors.Is(err, guard.ErrUnavailable) || time.Now().Add(delay).After(deadline) {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return err
		case <-timer.C:
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}

// keyDigest is what log records carry instead of an idempotency key: the
// first 12 hex digits of SHA-256 over the scope, a zero byte and the id,
// as metrics.KeyDigest (a test holds them equal), kept here so the
// adapters do not import the Prometheus client.
func keyDigest(k guard.Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:6])
}

// logKey returns the attributes that name k in a log record.
func (s *Server) logKey(k guard.Key) []any {
	if s.cfg.LogKeys {
		return []any{"key", keyDigest(k), "scope", k.Scope, "id", k.ID}
	}
	return []any{"key", keyDigest(k)}
}

// logErr returns err's text for a log record (and for an InvalidArgument
// the client reads), with the key's id replaced by its digest unless
// Config.LogKeys.
func (s *Server) logErr(k guard.Key, err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if s.cfg.LogKeys || k.ID == "" {
		return msg
	}
	hidden := "<key " + keyDigest(k) + ">"
	msg = strings.ReplaceAll(msg, k.String(), k.Scope+"/"+hidden)
	if len(k.ID) >= 8 {
		msg = strings.ReplaceAll(msg, k.ID, hidden)
	}
	return msg
}
