// Package guard makes a side effect happen once per key, however often the
// request or message behind it is delivered.
//
// A Guard claims a key in a Store, runs the effect while it holds the
// claim's lease, and stores the result; a later call with the same key gets
// the stored result without running the effect again. Guard.Do does all of
// it; Hold (a Held claim) does it for callers that run the effect
// themselves; Claim, Complete, Fail, Release, Extend and KeepAlive are the
// steps for callers that need them apart.
//
// # The lease, and what a holder may assume
//
// A claim takes the key for Options.Lease, judged by the store's clock; an
// extension pushes it out for another Lease from when the store runs it.
// The guard cannot see the store's clock, so it reckons from its own: the
// holder's lease lasts until
//
//	Lease.Deadline = sent + Lease − LeaseMargin(Lease)
//
// where sent is when the claim, or the last extension that succeeded, was
// sent (the store ran it at sent or later, so its lease ends no sooner
// than sent + Lease by the store's clock), and LeaseMargin (Lease/100 +
// 2ms, at most Lease/4: Redlock's drift allowance) covers the two clocks
// running at different rates. While the effect runs, Do, Hold and KeepAlive extend the
// lease every Lease/3 and cancel the effect's context, with a cause
// matching ErrLeaseLost, at the deadline in force: on a timer of their
// own, whatever an extension under way is doing. An extension whose answer
// comes after the deadline, or that fails, never revives the context.
// A claim answered after its own deadline is not handed out: Claim, Hold
// and Do release it and return ErrUnavailable.
//
// So a holder may assume: its context is done before any other claim of
// the key can succeed, provided the client's clock runs at the server's
// rate within the margin and the process is not paused (a pause, a long
// garbage collection or a late timer counts against the margin too).
// What the lease cannot give: a holder that ignores its context, a process
// paused after it checked its context, a write already on its way to
// another system, or a Redis failover that loses the last writes all let
// a second holder in while the first one's effect still lands. That is
// what Lease.Fence is for: downstream writes carry it and refuse a stale
// one, and the backstop package's row, written in the same transaction
// as the effect, makes the effect happen once even then. A fence is only
// as durable as the record that counts it, though: a failover or restart
// that loses the last writes (a replica behind its primary, an older RDB
// snapshot) may have lost a takeover too, and the next claim then gets
// that holder's fence again (or a lower one, if the record is gone), so
// downstream checks on Lease.Fence alone cannot refuse it. The backstop's
// fences, kept in PostgreSQL above every fence it has seen for the key,
// still tell the two holders apart.
//
// Options.MaxRun bounds how long one holder keeps a key: after it the
// lease is no longer extended and the effect's context is cancelled with
// a cause matching ErrMaxRun (and ErrLeaseLost); the key can be recovered
// once the lease runs out.
//
// # Steps
//
// An effect that does several things in turn can record each as a step
// (Step): its result is stored with the key's record, and a later attempt
// of the key resumes after the last stored step instead of running the
// whole effect again. Lease.KeyFor gives the idempotency key a step
// passes to a service downstream, the same in every attempt.
//
// # The Redis server
//
// RedisStore needs a server that never evicts keys: call RedisStore.Check
// at start-up; it refuses a maxmemory-policy other than noeviction. When
// such a server runs out of memory, writes answer OOM, which the store
// reports as ErrUnavailable (retry later).
//
// # Constructors
//
// One rule holds for the constructors of this module (New, NewRedisStore,
// and those of the packages built on guard): a constructor that can fail
// because of its input or its environment (a name or setting that may
// come from configuration, a registry that refuses, a server) returns
// (T, error), and reports a nil dependency through that error too. One
// that cannot fail so returns T alone and panics only on a programmer's
// error, of the kind http.Handle panics on: a nil required dependency, or
// arguments that contradict each other whatever the input. No
// constructor keeps an error to return from later calls. Options are
// never invalid: each field says how its zero and negative values are
// read.
//
// # Design
//
// docs/design.md, in the repository, is written for whoever maintains this
// code: the state machine, the record format and each script's cases, what
// a lease guarantees and where that ends, the failure modes and what
// catches each, and sizing.
package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"
)

// Defaults for Options.
const (
	DefaultTTL    = 24 * time.Hour   // how long a completed key is remembered
	DefaultLease  = 30 * time.Second // how long a claim lives without a heartbeat
	DefaultMaxRun = 5 * time.Minute  // how long one holder may keep a key
)

// MinLease is the shortest lease a Guard uses: a positive Options.Lease
// below it is read as MinLease. A holder may use its lease for
// Lease − LeaseMargin(Lease) from when its claim was sent (7.9ms at
// MinLease), and the claim's answer must come back within that; below
// MinLease the margin is no longer the clock-drift allowance (Lease/100 +
// 2ms) but a quarter of the lease, so few store round trips fit, none at
// all for a lease of nanoseconds, and RedisStore counts leases in whole
// milliseconds, which the margin no longer covers. A lease near MinLease
// suits a store on the same host; across a network, or where the process
// may pause (garbage collection, a loaded machine), use seconds.
const MinLease = 10 * time.Millisecond

// Options configure a Guard. The zero value is ready to use.
type Options struct {
	// TTL is how long a record is kept after its last change: a completed
	// key replays for this long. Zero or negative: the default,
	// DefaultTTL (24h, as Stripe).
	TTL time.Duration
	// Lease is how long a claim lives without being extended. While the
	// effect runs, Do extends it every Lease/3; the effect's context ends
	// at the lease's deadline (see the package doc) if no extension
	// succeeded in time. A holder that dies loses the key after at most
	// Lease. Zero or negative: the default, DefaultLease (30s); a
	// positive value below MinLease (10ms) is read as MinLease.
	Lease time.Duration
	// MaxRun bounds how long one run of the effect keeps the key, counted
	// from when the effect starts: after it the lease is no longer
	// extended, the effect's context is cancelled with a cause matching
	// ErrMaxRun and ErrLeaseLost, and the key can be claimed again once
	// the lease has run out (an effect that still returns a result is
	// recorded only if no one took the key over meanwhile). Zero: the
	// default, DefaultMaxRun (5 minutes); negative: no limit.
	//
	// Five minutes is ten default leases, longer than any single call to
	// a payment provider with its retries (Stripe's libraries give up on a
	// request after 80s), and the bound Kafka puts on a consumer between
	// polls (max.poll.interval.ms): an effect still running then is hung,
	// and a customer's retry should not wait on it for the 24h its key is
	// kept. Raise it for effects that are meant to run long.
	MaxRun time.Duration
	// MaxAttempts bounds how often a failing key is tried before claims
	// return ErrExhausted. Zero or negative: no limit.
	MaxAttempts int
	// Observer, if set, hears every outcome (for metrics and logs).
	Observer Observer
}

func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	switch {
	case o.Lease <= 0:
		o.Lease = DefaultLease
	case o.Lease < MinLease:
		o.Lease = MinLease
	}
	switch {
	case o.MaxRun == 0:
		o.MaxRun = DefaultMaxRun
	case o.MaxRun < 0:
		o.MaxRun = -1
	}
	if o.MaxAttempts < 0 {
		o.MaxAttempts = 0
	}
	return o
}

// Guard runs effects once per key. It is safe for concurrent use.
type Guard struct {
	store    Store
	opts     Options
	validity time.Duration // Lease − LeaseMargin(Lease)
	claims   *claimQueue   // bounds Do's and Hold's claims under way
}

// New returns a Guard over store. Every Options value is usable (see each
// field for how zero and negative values are read), so New cannot fail;
// it panics on a nil store, a programmer's error (see the package doc's
// Constructors).
func New(store Store, opts Options) *Guard {
	if store == nil {
		panic("guard.New: nil Store")
	}
	opts = opts.withDefaults()
	return &Guard{store: store, opts: opts, validity: opts.Lease - LeaseMargin(opts.Lease), claims: newClaimQueue()}
}

// Store returns the store the guard writes to.
func (g *Guard) Store() Store { return g.store }

// Options returns the guard's options as the guard reads them: defaults
// filled in, a Lease below MinLease raised to it, and MaxRun -1 when
// unlimited.
func (g *Guard) Options() Options { return g.opts }

// Func is the effect Do guards. ctx is cancelled, with a cause matching
// ErrLeaseLost, at the lease's deadline unless the lease was extended in
// time, when the lease is found lost, and at MaxRun (the cause then
// matches ErrMaxRun too); it is also cancelled with Do's ctx. A Func that
// makes downstream writes should pass lease.Fence along with them; one that
// does several things in turn can make each a Step.
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
// fn's context ends no later than the lease's deadline (see the package
// doc); Do extends the lease while fn runs. If fn returns an error, the
// attempt is recorded as failed and the key may run again (up to
// MaxAttempts); Do returns fn's error. An error matching ErrRejected
// releases the key instead, as if it had never been claimed. If fn panics,
// the claim is released and the panic goes on. The result is stored even
// when ctx is cancelled after fn returned. If it cannot be stored, Do
// returns the value together with the error (ErrLeaseLost when another
// holder took over): fn ran, but the guard could not record it. The write
// is made once, bounded by max(Lease, 1s): an error matching
// ErrUnavailable means its outcome is unknown (the result may be stored).
// fn's own error comes back as it is, so both "fn failed" and "fn's
// result was refused" may match ErrLeaseLost (an fn that returns its
// context's cause); a caller that must tell them apart notes whether fn
// returned nil.
//
// A nil fn is a programmer's error: Do panics before it claims the key.
func (g *Guard) Do(ctx context.Context, key Key, fingerprint string, fn Func) (Result, error) {
	if fn == nil {
		panic("guard.Do: nil Func")
	}
	return g.do(ctx, key, fingerprint, fn, CallOptions{})
}

func (g *Guard) do(ctx context.Context, key Key, fingerprint string, fn Func, opts CallOptions) (Result, error) {
	k, out, err := g.keptClaim(ctx, key, fingerprint, opts, false)
	if err != nil {
		return Result{}, err
	}
	if out.Status == Replay {
		return Result{Value: out.Result, Replayed: true}, nil
	}
	if ctx.Err() != nil {
		// The caller ended while the claim was under way (its Done
		// channel may close up to claimWatchDelay late, and a store may
		// not look): nobody waits for the effect, so it does not run.
		k.stop()
		_ = g.Release(context.WithoutCancel(ctx), out.Lease)
		return Result{}, fmt.Errorf("%s: not run: %w", key, context.Cause(ctx))
	}
	return g.run(ctx, k, out.Lease, fn)
}

// keptClaim claims key under one keepalive, whose claim the guard's
// claim queue bounds (the lease's first deadline) and which, when the
// claim is Acquired, runs the heartbeat: k is nil otherwise. The claim's
// context ends with ctx unless detachedClaim (its Err at once, its Done
// within claimWatchDelay); the effect's context, made once the claim is
// Acquired, is a child of ctx either way. The outcome and error are
// Claim's.
func (g *Guard) keptClaim(ctx context.Context, key Key, fingerprint string, opts CallOptions, detachedClaim bool) (k *keepalive, out Outcome, err error) {
	if err := key.Validate(); err != nil {
		return nil, Outcome{}, err
	}
	if !detachedClaim && ctx.Err() != nil {
		return nil, Outcome{}, fmt.Errorf("claim %s: not sent: %w", key, context.Cause(ctx))
	}
	valid := time.Now().Add(g.validity)
	k = g.newKeepalive(ctx, valid)
	k.detachedClaim = detachedClaim
	req := g.request(key, fingerprint, k.token(), opts)
	cctx := k.claimContext()
	k.claim()
	out, err = g.store.Claim(cctx, req)
	if err != nil && k.timedOut() && !errors.Is(err, ErrUnavailable) {
		err = g.claimTimedOut(err)
	}
	// A claim its caller gave up on (a detached one's caller is not
	// waited on) is not one whose answer was lost, whatever the error
	// says: go-redis puts the caller's deadline on the socket.
	if err != nil && !k.timedOut() && (detachedClaim || !callerEnded(ctx)) && unheard(err) {
		g.releaseUnheard(ctx, req)
	}
	var late bool
	if err == nil && out.Status == Acquired {
		out.Lease.Deadline = valid
		k.steps = stepLog{g: g, known: out.Steps, holder: k}
		out.Lease.steps = &k.steps
		late = !k.start(out.Lease)
	}
	if err != nil || out.Status != Acquired || late {
		k.stop()
	}
	// claimed calls the Observer: if it panics, nobody holds the claim,
	// and the heartbeat must not keep its lease alive.
	handed := false
	defer func() {
		if !handed {
			k.stop()
		}
	}()
	out, err = g.claimed(ctx, req, out, err, valid, late)
	handed = true
	if err != nil || out.Status != Acquired {
		return nil, out, err
	}
	return k, out, nil
}

// Claim takes key for the caller. On Acquired the caller must end the
// claim with Complete, Fail or Release, and keep it alive with KeepAlive
// (or Extend) while it works past the lease; out.Lease.Deadline says when
// the lease ends unless extended. On Replay the Outcome holds the stored
// result. The other outcomes come back as errors: *InProgressError,
// ErrMismatch, *ExhaustedError, alongside the Outcome.
//
// The call is bounded by the lease's first deadline: a client that
// re-sends the claim after a lost reply (go-redis does) must not do so
// after the lease it may have taken has run out and another holder
// recovered the key. A claim whose answer is Acquired but arrives after
// that deadline is released and reported as ErrUnavailable: its lease
// may already be another's. Past the bound the outcome is unknown
// (ErrUnavailable), as it is when the connection fails after the claim
// was sent (a client read timeout shorter than the server's answer, a
// connection reset): the guard then releases the claim by its token
// before it returns (Claim, Hold, Do, Wait and DoBatch), so that a claim
// the store took all the same frees the key, attempt uncounted, rather
// than hold it for a lease (and, at MaxAttempts, leave it exhausted by
// an attempt that never ran). A claim that still runs in the store after
// that release, or whose caller's context ended while it was on its way,
// has no one to hear its answer, and its lease runs out like an
// abandoned one.
func (g *Guard) Claim(ctx context.Context, key Key, fingerprint string) (Outcome, error) {
	return g.claim(ctx, key, fingerprint, CallOptions{})
}

func (g *Guard) claim(ctx context.Context, key Key, fingerprint string, opts CallOptions) (Outcome, error) {
	if err := key.Validate(); err != nil {
		return Outcome{}, err
	}
	valid := time.Now().Add(g.validity)
	cctx, cancel := context.WithDeadline(ctx, valid)
	req := g.request(key, fingerprint, newToken(), opts)
	out, err := g.store.Claim(cctx, req)
	cancel()
	if err != nil && !time.Now().Before(valid) && ctx.Err() == nil && !errors.Is(err, ErrUnavailable) {
		// Cut off at its bound, the lease's first deadline, not by the
		// caller: the outcome is unknown, as keptClaim reports it.
		err = g.claimTimedOut(err)
	}
	if err != nil && time.Now().Before(valid) && !callerEnded(ctx) && unheard(err) { // as in keptClaim
		g.releaseUnheard(ctx, req)
	}
	late := err == nil && out.Status == Acquired && !time.Now().Before(valid)
	out, err = g.claimed(ctx, req, out, err, valid, late)
	if err == nil && out.Status == Acquired {
		out.Lease.steps = &stepLog{g: g, known: out.Steps}
	}
	return out, err
}

func (g *Guard) request(key Key, fingerprint, token string, opts CallOptions) ClaimRequest {
	return ClaimRequest{
		Key:         key,
		Token:       token,
		Fingerprint: fingerprint,
		Lease:       g.opts.Lease,
		TTL:         g.opts.TTL,
		MaxAttempts: opts.maxAttempts(g.opts.MaxAttempts),
	}
}

// claimed turns a store's answer to req into Claim's. valid is the
// lease's deadline; late means an Acquired answer came after it.
func (g *Guard) claimed(ctx context.Context, req ClaimRequest, out Outcome, err error, valid time.Time, late bool) (Outcome, error) {
	key := req.Key
	if err != nil {
		g.observeErr(ctx, key, 0, err)
		return Outcome{}, fmt.Errorf("claim %s: %w", key, err)
	}
	switch out.Status {
	case Acquired:
		if late {
			// Nobody ran the effect: give the key back, attempt uncounted,
			// rather than leave it to run out.
			err := g.lateClaim(key)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(g.opts.Lease, time.Second))
			if rerr := g.store.Release(rctx, out.Lease); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
				err = fmt.Errorf("%w (releasing it: %w)", err, rerr)
			}
			cancel()
			g.observe(ctx, Event{Kind: EventUnavailable, Key: key, Attempt: out.Lease.Attempt, Err: err})
			return Outcome{}, err
		}
		out.Lease.Deadline = valid
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
		err := fmt.Errorf("claim %s: %w: status %d", key, ErrCorrupt, out.Status)
		g.observe(ctx, Event{Kind: EventCorrupt, Key: key, Err: err})
		return out, err
	}
}

// lateClaim is the error of a claim of key answered Acquired after its
// lease's deadline. It names Options.Lease: a lease too short for the
// store's round trips is the likely cause.
func (g *Guard) lateClaim(key Key) error {
	return fmt.Errorf("claim %s: %w: answered after the lease's deadline, so not used "+
		"(Options.Lease %s leaves %s from sending a claim to using it)", key, ErrUnavailable, g.opts.Lease, g.validity)
}

// claimTimedOut is the error of a claim that its bound, the lease's first
// deadline, ended before the store answered (err).
func (g *Guard) claimTimedOut(err error) error {
	return fmt.Errorf("%w: no answer within the lease's validity (%s of Options.Lease %s): %w",
		ErrUnavailable, g.validity, g.opts.Lease, err)
}

// run executes fn under lease, kept alive by k, and ends the claim as fn
// ended.
func (g *Guard) run(ctx context.Context, k *keepalive, lease Lease, fn Func) (Result, error) {
	returned := false
	defer func() {
		if !returned {
			// fn panicked or called runtime.Goexit: no result exists, so
			// free the key for a retry. The panic continues unchanged. A
			// lost lease the heartbeat observed is not observed again by
			// the refused release.
			_ = g.release(ctx, k.detachFreeing(), lease, k.lossObserved())
		}
		k.stop()
	}()

	value, err := fn(k.ctx, lease)
	returned = true

	res := Result{Value: value, Lease: lease}
	if errors.Is(err, ErrRejected) {
		wctx := k.detachFreeing()
		if rerr := g.release(ctx, wctx, lease, k.lossObserved()); rerr != nil {
			return res, errors.Join(err, rerr)
		}
		return res, err
	}
	if err != nil {
		wctx := k.detachFreeing()
		if ferr := g.fail(ctx, wctx, lease, err, k.lossObserved()); ferr != nil {
			return res, errors.Join(err, ferr)
		}
		return res, err
	}
	wctx := k.detach()
	return res, g.complete(ctx, wctx, lease, value, k.lossObserved())
}

// KeepAlive keeps lease alive for callers that run the effect themselves
// after Claim: it extends the lease every Lease/3 until stop is called,
// and returns a context, a child of ctx, that is cancelled with a cause
// matching ErrLeaseLost at the lease's deadline unless an extension
// succeeded in time (see the package doc), as soon as the lease is found
// lost, and at Options.MaxRun (counted from this call; the cause then
// matches ErrMaxRun too). The deadline starts from lease.Deadline, as
// Claim set it; a Lease without one (built by hand) is taken as claimed
// now. Extensions go on when ctx is cancelled, since the effect may still
// be running. stop ends the heartbeat, cancels the context, and may be
// called more than once; it tells an extension under way to give up but
// does not wait for its answer (which changes nothing and is not
// observed), so a store call that ignores its context cannot hold up the
// write that follows. Such a call returns in its own time. Call stop
// before the Complete, Fail or Release that ends the claim: a failure or a
// release frees the key as soon as the store has it, and the context
// must be done by then (Hold's writes keep that order themselves).
func (g *Guard) KeepAlive(ctx context.Context, lease Lease) (context.Context, func()) {
	k := g.keep(ctx, lease)
	return k.ctx, k.stop
}

// keep starts a keepalive for lease (KeepAlive, Keep).
func (g *Guard) keep(ctx context.Context, lease Lease) *keepalive {
	valid := lease.Deadline
	if valid.IsZero() {
		valid = time.Now().Add(g.validity)
	}
	k := g.newKeepalive(ctx, valid)
	k.start(lease)
	if s := lease.steps; s != nil {
		s.mu.Lock()
		s.holder, s.item = k, 0
		s.mu.Unlock()
	}
	return k
}

// Complete stores result for the holder of lease. It writes even if ctx
// is cancelled, for at most max(Lease, 1s). ErrLeaseLost means another
// holder took the key over and the result was not stored.
func (g *Guard) Complete(ctx context.Context, lease Lease, result []byte) error {
	wctx, cancel := g.detached(ctx)
	defer cancel()
	return g.complete(ctx, wctx, lease, result, false)
}

// complete, fail and release make the write that ends a claim; lossSeen:
// the holder's heartbeat already observed its lease lost (observeErr).
func (g *Guard) complete(ctx, wctx context.Context, lease Lease, result []byte, lossSeen bool) error {
	lease.steps.end()
	err := bounded(wctx, g.store.Complete(wctx, lease, result, g.opts.TTL))
	if err != nil {
		g.observeWriteErr(ctx, lease, err, lossSeen)
		return fmt.Errorf("complete %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventCompleted, Key: lease.Key, Attempt: lease.Attempt})
	return nil
}

// Fail records the holder's attempt as failed with cause; the key may be
// claimed again until MaxAttempts. It writes even if ctx is cancelled, for
// at most max(Lease, 1s).
func (g *Guard) Fail(ctx context.Context, lease Lease, cause error) error {
	wctx, cancel := g.detached(ctx)
	defer cancel()
	return g.fail(ctx, wctx, lease, cause, false)
}

func (g *Guard) fail(ctx, wctx context.Context, lease Lease, cause error, lossSeen bool) error {
	lease.steps.end()
	reason := "failed"
	if cause != nil {
		reason = cause.Error()
	}
	err := bounded(wctx, g.store.Fail(wctx, lease, reason, g.opts.TTL))
	if err != nil {
		g.observeWriteErr(ctx, lease, err, lossSeen)
		return fmt.Errorf("fail %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventFailed, Key: lease.Key, Attempt: lease.Attempt, Err: cause})
	return nil
}

// Release undoes the holder's claim, as if it had never been made: use it
// when the request was rejected before any effect. It writes even if ctx is
// cancelled, for at most max(Lease, 1s).
func (g *Guard) Release(ctx context.Context, lease Lease) error {
	wctx, cancel := g.detached(ctx)
	defer cancel()
	return g.release(ctx, wctx, lease, false)
}

func (g *Guard) release(ctx, wctx context.Context, lease Lease, lossSeen bool) error {
	lease.steps.end()
	err := bounded(wctx, g.store.Release(wctx, lease))
	if err != nil {
		g.observeWriteErr(ctx, lease, err, lossSeen)
		return fmt.Errorf("release %s: %w", lease.Key, err)
	}
	g.observe(ctx, Event{Kind: EventReleased, Key: lease.Key, Attempt: lease.Attempt})
	return nil
}

// Extend keeps the holder's lease alive for another Options.Lease from
// when the store runs it. A caller keeping its own deadline takes the new
// one as (when it sent this call) + Lease − LeaseMargin(Lease), and only
// if the call returned nil before the old deadline; KeepAlive does that.
func (g *Guard) Extend(ctx context.Context, lease Lease) error {
	err := g.extend(ctx, lease)
	if err != nil {
		g.observeWriteErr(ctx, lease, err, false)
	}
	return err
}

// extend is Extend without the Observer: the heartbeat observes an
// extension's error only if its answer still counts (keepalive's fire).
func (g *Guard) extend(ctx context.Context, lease Lease) error {
	if err := g.store.Extend(ctx, lease, g.opts.Lease); err != nil {
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

// bounded reports a write that wctx, detached from the caller's context,
// ended before its answer came as ErrUnavailable: the outcome is unknown.
func bounded(wctx context.Context, err error) error {
	if err != nil && wctx.Err() != nil && !errors.Is(err, ErrUnavailable) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%w: no answer within max(Lease, 1s): %w", ErrUnavailable, err)
	}
	return err
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

// observeWriteErr observes the error of a write to lease's claim (one
// that ends it, or Extend): as observeErr, but a refusal for a lost lease
// is not observed when the holder's heartbeat already observed the loss
// (lossSeen), or when a step, an extension or a write of the same lease
// did (Lease.lossObserved: Claim's lease, kept by KeepAlive or not, ended
// by Complete, Fail or Release), so one lost lease is one EventLeaseLost.
func (g *Guard) observeWriteErr(ctx context.Context, lease Lease, err error, lossSeen bool) {
	if errors.Is(err, ErrLeaseLost) {
		if lossSeen || lease.lossObserved() {
			return
		}
		lease.markLossObserved()
	}
	g.observeErr(ctx, lease.Key, lease.Attempt, err)
}

func (g *Guard) observeErr(ctx context.Context, key Key, attempt int, err error) {
	if kind, ok := errEventKind(err); ok {
		g.observe(ctx, Event{Kind: kind, Key: key, Attempt: attempt, Err: err})
	}
}

// errEventKind is the event a store's error is observed as, if any.
func errEventKind(err error) (EventKind, bool) {
	switch {
	case errors.Is(err, ErrLeaseLost):
		return EventLeaseLost, true
	case errors.Is(err, ErrUnavailable):
		return EventUnavailable, true
	case errors.Is(err, ErrCorrupt):
		return EventCorrupt, true
	}
	return 0, false
}

// newToken returns a fresh owner token: 130 random bits (rand.Text).
func newToken() string { return rand.Text() }
