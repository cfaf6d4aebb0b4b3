// Package guard makes a side effect happen once per key, however often the
// request or message behind it is delivered.
//
// A Guard claims a key in a Store, runs the effect while it holds the
// claim's lease, and stores the result; a later call with the same key gets
// the stored result without running the effect again. Guard.Do does all of
// it; Claim, Complete, Fail, Release and Extend are the steps for callers
// that need them apart.
package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults for Options.
const (
	DefaultTTL   = 24 * time.Hour   // how long a completed key is remembered
	DefaultLease = 30 * time.Second // how long a claim lives without a heartbeat
)

// Options configure a Guard. The zero value is ready to use.
type Options struct {
	// TTL is how long a record is kept after its last change: a completed
	// key replays for this long. Default DefaultTTL (24h, as Stripe).
	TTL time.Duration
	// Lease is how long a claim lives without being extended. While the
	// effect runs, Do extends it every Lease/3. A holder that dies loses the
	// key after at most Lease. Default DefaultLease (30s).
	Lease time.Duration
	// MaxAttempts bounds how often a failing key is tried before claims
	// return ErrExhausted. Zero means no limit.
	MaxAttempts int
	// Observer, if set, hears every outcome (for metrics and logs).
	Observer Observer
}

func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.MaxAttempts < 0 {
		o.MaxAttempts = 0
	}
	return o
}

// Guard runs effects once per key. It is safe for concurrent use.
type Guard struct {
	store Store
	opts  Options
}

// New returns a Guard over store.
func New(store Store, opts Options) *Guard {
	if store == nil {
		panic("guard.New: nil Store")
	}
	return &Guard{store: store, opts: opts.withDefaults()}
}

// Store returns the store the guard writes to.
func (g *Guard) Store() Store { return g.store }

// Options returns the guard's options with defaults filled in.
func (g *Guard) Options() Options { return g.opts }

// Func is the effect Do guards. ctx is cancelled, with cause ErrLeaseLost,
// when the lease is found lost; a Func that makes downstream writes should
// pass lease.Fence along with them.
type Func func(ctx context.Context, lease Lease) ([]byte, error)

// Result is what Do returns.
type Result struct {
	Value    []byte // fn's result, or the stored one on a replay
	Replayed bool   // true when Value is a stored result and fn did not run
	Lease    Lease  // the lease fn ran under; zero on a replay
}

// Do runs fn once for key. The first caller claims the key, runs fn and
// stores its result; a later caller with the same key and fingerprint gets
// that result with Replayed set, without running fn. While fn runs, others
// get ErrInProgress; a different fingerprint gets ErrMismatch.
//
// If fn returns an error, the attempt is recorded as failed and the key may
// run again (up to MaxAttempts); Do returns fn's error. An error matching
// ErrRejected releases the key instead, as if it had never been claimed. If fn panics, the
// claim is released and the panic goes on. The result is stored even when
// ctx is cancelled after fn returned. If it cannot be stored, Do returns the
// value together with the error (ErrLeaseLost when another holder took
// over): fn ran, but the guard could not record it.
func (g *Guard) Do(ctx context.Context, key Key, fingerprint string, fn Func) (Result, error) {
	out, err := g.Claim(ctx, key, fingerprint)
	if err != nil {
		return Result{}, err
	}
	if out.Status == Replay {
		return Result{Value: out.Result, Replayed: true}, nil
	}
	return g.run(ctx, out.Lease, fn)
}

// Claim takes key for the caller. On Acquired the caller must end the
// claim with Complete, Fail or Release, and Extend it while it works past
// the lease. On Replay the Outcome holds the stored result. The other
// outcomes come back as errors: *InProgressError, ErrMismatch,
// *ExhaustedError, alongside the Outcome.
func (g *Guard) Claim(ctx context.Context, key Key, fingerprint string) (Outcome, error) {
	if err := key.Validate(); err != nil {
		return Outcome{}, err
	}
	// Bound the call by half the lease: a client that re-sends the script
	// after a lost reply (go-redis does) must not do so after the lease
	// this claim may have taken has run out and another holder recovered
	// the key; that retry would answer IN_PROGRESS for a claim that took
	// effect. Past the bound the outcome is unknown (ErrUnavailable). A
	// pipelined store stops waiting at the bound, though its batch may
	// still be re-sent: a claim that runs then has no one to hear its
	// answer, and its lease runs out like an abandoned one.
	cctx, cancel := context.WithTimeout(ctx, g.opts.Lease/2)
	defer cancel()
	out, err := g.store.Claim(cctx, ClaimRequest{
		Key:         key,
		Token:       newToken(),
		Fingerprint: fingerprint,
		Lease:       g.opts.Lease,
		TTL:         g.opts.TTL,
		MaxAttempts: g.opts.MaxAttempts,
	})
	if err != nil {
		g.observeErr(ctx, key, 0, err)
		return Outcome{}, fmt.Errorf("claim %s: %w", key, err)
	}
	switch out.Status {
	case Acquired:
		if out.Lease.Recovered {
			g.observe(ctx, Event{Kind: EventRecovered, Key: key, Attempt: out.Lease.Attempt})
		}
		g.observe(ctx, Event{Kind: EventAcquired, Key: key, Attempt: out.Lease.Attempt})
		return out, nil
	case Replay:
		g.observe(ctx, Event{Kind: EventReplayed, Key: key})
		return out, nil
	case InProgress:
		g.observe(ctx, Event{Kind: EventInProgress, Key: key})
		return out, &InProgressError{Key: key, RetryAfter: out.LeaseLeft}
	case Mismatch:
		g.observe(ctx, Event{Kind: EventMismatch, Key: key})
		return out, fmt.Errorf("%w: %s", ErrMismatch, key)
	case Exhausted:
		err := &ExhaustedError{Key: key, Attempts: out.Attempts, LastError: out.LastError}
		g.observe(ctx, Event{Kind: EventExhausted, Key: key, Attempt: out.Attempts, Err: err})
		return out, err
	default:
		return out, fmt.Errorf("claim %s: %w: status %d", key, ErrCorrupt, out.Status)
	}
}

// Complete stores result for the holder of lease. It writes even if ctx
// is cancelled, within the guard's lease. ErrLeaseLost means another holder
// took the key over and the result was not stored.
func (g *Guard) Complete(ctx context.Context, lease Lease, result []byte) error {
	ctx, cancel := g.detached(ctx)
	defer cancel()
	err := g.store.Complete(ctx, lease, result, g.opts.TTL)
	if err != nil {
		g.observeErr(ctx, lease.Key, lease.Attempt, err)
		return fmt.Errorf("complete %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventCompleted, Key: lease.Key, Attempt: lease.Attempt})
	return nil
}

// Fail records the holder's attempt as failed with cause; the key may be
// claimed again until MaxAttempts. It writes even if ctx is cancelled.
func (g *Guard) Fail(ctx context.Context, lease Lease, cause error) error {
	ctx, cancel := g.detached(ctx)
	defer cancel()
	reason := "failed"
	if cause != nil {
		reason = cause.Error()
	}
	err := g.store.Fail(ctx, lease, reason, g.opts.TTL)
	if err != nil {
		g.observeErr(ctx, lease.Key, lease.Attempt, err)
		return fmt.Errorf("fail %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventFailed, Key: lease.Key, Attempt: lease.Attempt, Err: cause})
	return nil
}

// Release undoes the holder's claim, as if it had never been made: use it
// when the request was rejected before any effect. It writes even if ctx is
// cancelled.
func (g *Guard) Release(ctx context.Context, lease Lease) error {
	ctx, cancel := g.detached(ctx)
	defer cancel()
	err := g.store.Release(ctx, lease)
	if err != nil {
		g.observeErr(ctx, lease.Key, lease.Attempt, err)
		return fmt.Errorf("release %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventReleased, Key: lease.Key, Attempt: lease.Attempt})
	return nil
}

// Extend keeps the holder's lease alive for another Options.Lease.
func (g *Guard) Extend(ctx context.Context, lease Lease) error {
	err := g.store.Extend(ctx, lease, g.opts.Lease)
	if err != nil {
		g.observeErr(ctx, lease.Key, lease.Attempt, err)
		return fmt.Errorf("extend %s: %w", lease.Key, err)
	}
	return nil
}

// Get reads the record of key, or returns ErrNotFound.
func (g *Guard) Get(ctx context.Context, key Key) (Record, error) {
	if err := key.Validate(); err != nil {
		return Record{}, err
	}
	rec, err := g.store.Get(ctx, key)
	if err != nil {
		return Record{}, fmt.Errorf("get %s: %w", key, err)
	}
	return rec, nil
}

// run executes fn under lease and ends the claim as fn ended.
func (g *Guard) run(ctx context.Context, lease Lease, fn Func) (Result, error) {
	runCtx, stop := g.KeepAlive(ctx, lease)
	returned := false
	defer func() {
		stop()
		if !returned {
			// fn panicked or called runtime.Goexit: no result exists, so
			// free the key for a retry. The panic continues unchanged.
			_ = g.Release(ctx, lease)
		}
	}()

	value, err := fn(runCtx, lease)
	returned = true
	stop()

	res := Result{Value: value, Lease: lease}
	if errors.Is(err, ErrRejected) {
		if rerr := g.Release(ctx, lease); rerr != nil {
			return res, errors.Join(err, rerr)
		}
		return res, err
	}
	if err != nil {
		if ferr := g.Fail(ctx, lease, err); ferr != nil {
			return res, errors.Join(err, ferr)
		}
		return res, err
	}
	return res, g.Complete(ctx, lease, value)
}

// KeepAlive extends lease in the background every Lease/3 until stop is
// called, for callers that run the effect themselves after Claim. The
// returned context is cancelled, with a cause wrapping ErrLeaseLost, when
// the lease is found lost or could not be extended before it ran out; it
// is not ended by the parent's cancellation alone, since the effect may
// still be running. stop ends the heartbeat, waits for an extension under
// way, cancels the context, and may be called more than once.
func (g *Guard) KeepAlive(ctx context.Context, lease Lease) (context.Context, func()) {
	runCtx, cancel := context.WithCancelCause(ctx)
	stopHeartbeat := g.heartbeat(runCtx, cancel, lease)
	return runCtx, func() {
		stopHeartbeat()
		cancel(nil)
	}
}

// heartbeat extends lease every Lease/3 until stop is called, and cancels
// ctx with cause ErrLeaseLost when the lease is gone or could not be
// extended before it ran out. It keeps going when ctx's parent is
// cancelled: fn may still be running, and the lease must outlive it. stop
// waits for an extension under way and may be called more than once. No
// goroutine exists until the first extension is due, so a quick fn costs
// one timer.
func (g *Guard) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, lease Lease) (stop func()) {
	hb := &heartbeat{g: g, ctx: ctx, cancel: cancel, lease: lease,
		every: g.opts.Lease / 3, validUntil: time.Now().Add(g.opts.Lease)}
	hb.idle.L = &hb.mu
	hb.mu.Lock()
	hb.timer = time.AfterFunc(hb.every, hb.beat)
	hb.mu.Unlock()
	return hb.stop
}

type heartbeat struct {
	g      *Guard
	ctx    context.Context
	cancel context.CancelCauseFunc
	lease  Lease
	every  time.Duration

	mu         sync.Mutex
	idle       sync.Cond // signalled when an extension ends
	timer      *time.Timer
	busy       bool // an extension is under way
	stopped    bool
	validUntil time.Time
}

func (h *heartbeat) beat() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.busy = true
	h.mu.Unlock()

	start := time.Now()
	ectx, ecancel := context.WithTimeout(context.WithoutCancel(h.ctx), h.every)
	err := h.g.Extend(ectx, h.lease)
	ecancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	h.busy = false
	h.idle.Broadcast()
	switch {
	case err == nil:
		h.validUntil = start.Add(h.g.opts.Lease)
	case errors.Is(err, ErrLeaseLost):
		h.cancel(err)
		return
	case !time.Now().Before(h.validUntil.Add(-h.every / 2)):
		// Transient failures until the lease has run out: assume the worst,
		// another holder may have it now.
		h.cancel(fmt.Errorf("%w: lease ran out while extending failed: %w", ErrLeaseLost, err))
		h.g.observe(h.ctx, Event{Kind: EventLeaseLost, Key: h.lease.Key, Attempt: h.lease.Attempt, Err: err})
		return
	}
	if !h.stopped {
		h.timer.Reset(h.every)
	}
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.timer.Stop()
	for h.busy {
		h.idle.Wait()
	}
}

// detached returns a context that outlives ctx's cancellation but is
// bounded by one lease (at least a second, so a very short lease does not
// lose the write), for writes that must not be lost to a hang-up.
func (g *Guard) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), max(g.opts.Lease, time.Second))
}

func (g *Guard) observe(ctx context.Context, e Event) {
	if g.opts.Observer != nil {
		g.opts.Observer.Observe(ctx, e)
	}
}

func (g *Guard) observeErr(ctx context.Context, key Key, attempt int, err error) {
	kind := EventUnavailable
	if errors.Is(err, ErrLeaseLost) {
		kind = EventLeaseLost
	} else if !errors.Is(err, ErrUnavailable) {
		return
	}
	g.observe(ctx, Event{Kind: kind, Key: key, Attempt: attempt, Err: err})
}

// newToken returns a fresh owner token: 128 random bits.
func newToken() string { return rand.Text() }
