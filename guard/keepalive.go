package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// LeaseMargin is how much sooner than the store a Guard takes a lease of
// length lease to end (docs/design.md, "Leases"): lease/100 + 2ms, at most a quarter of the lease.
// It is Redlock's allowance for clock drift (a validity of TTL − elapsed −
// (TTL·0.01 + 2ms)): the 1% covers the client's and the server's clocks
// running at different rates over one lease, the 2ms Redis's millisecond
// expiry and the lease's rounding to whole milliseconds. A holder's
// context ends at Lease.Deadline = (when the claim or the last successful
// extension was sent) + lease − LeaseMargin(lease).
func LeaseMargin(lease time.Duration) time.Duration {
	return min(lease/100+2*time.Millisecond, lease/4)
}

// keepalive is the one timer behind a holder's run. In Do it is, in turn:
// the claim's context (bounded by the lease's first deadline), the
// heartbeat that extends the lease every Lease/3 while the effect runs and
// cancels the effect's context at the lease's deadline or at MaxRun,
// whatever an extension under way is doing, and the context of the write
// that ends the claim (detached from the caller's, bounded by
// max(Lease, 1s)). A replay costs this struct (the owner token in it),
// its timer and the claim context's channel, and, when the caller's
// context can be cancelled, the effect's context, made before the claim
// so that the claim's context ends with it; an effect that ends within a
// third of the lease adds only that context: no goroutine, no other
// timer, and the timer is armed once (for the first extension) and
// stopped once.
//
// The timer's callback, fire, decides from the state alone what is due,
// so a late or spurious firing does no harm: it re-arms the timer for
// what is due next.
type keepalive struct {
	g      *Guard
	parent context.Context // the caller's context
	// ctx is the effect's context, a child of parent: made by claimContext
	// when parent can be cancelled (the claim's context ends with it),
	// else by start.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// detachedClaim: the claim does not end with parent (Hold); the
	// effect's context is parent's child all the same.
	detachedClaim bool

	mu    sync.Mutex
	idle  sync.Cond   // broadcast when an extension ends
	timer *time.Timer // calls fire
	// armed is when the timer fires next; zero when it is not armed. A
	// timer armed sooner than what is due is left alone: it fires early
	// and fire arms it again, which costs less than moving it each time.
	armed time.Time
	phase phase
	lease Lease
	valid time.Time // the deadline in force: the effect's context ends then
	beat  time.Time // when the next extension is due
	// maxRun is when MaxRun ends the run; zero: never.
	maxRun time.Time
	busy   bool // an extension is under way
	// extStop ends the extension under way, if any.
	extStop context.CancelFunc
	// lastErr is the last failed extension's error, for the cause.
	lastErr error

	// The store call's context (callCtx), while claiming or writing.
	bound   time.Time     // its deadline
	done    chan struct{} // made when first asked for; closed when it ends
	callErr error         // why it ended; nil while it lasts
	late    bool          // the claim's bound passed before its answer
	// afters run when the call's context ends (contexts derived from it).
	afters []*func()
	// writeCancel ends the context of a write made after the call's
	// context ended (detach), if any.
	writeCancel context.CancelFunc

	// steps is the run's step log (Step); Lease.steps points here.
	steps stepLog

	// tok holds the claim's owner token (token): the Lease's Token is
	// a view of it, so the token costs no allocation of its own (a Lease
	// kept after Do returns keeps this struct with it).
	tok [tokenChars]byte
}

type phase uint8

const (
	claiming phase = iota // the claim is under way: the timer bounds it
	running               // the effect runs: the timer extends and keeps the deadline
	writing               // the effect returned: the timer bounds the write that ends the claim
	ended                 // the timer does nothing
)

// closed is a closed channel, for a call context that ended before anyone
// asked for its channel.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// newKeepalive returns a keepalive in phase claiming, with the lease's
// first deadline valid; its timer fires then unless start moves it on.
func (g *Guard) newKeepalive(parent context.Context, valid time.Time) *keepalive {
	k := &keepalive{g: g, parent: parent, valid: valid, bound: valid}
	k.idle.L = &k.mu
	k.mu.Lock()
	// Armed for the first extension (a third of a lease after the claim
	// was sent, before the claim's bound): a claim answered in time needs
	// no other arming until the holder's write, which is later still.
	k.armed = valid.Add(-g.validity + g.opts.Lease/3)
	k.timer = time.AfterFunc(time.Until(k.armed), k.fire)
	k.mu.Unlock()
	return k
}

// claimContext returns the context of the claim: parent's values, ended
// by parent's cancellation (unless detachedClaim) and at the lease's
// first deadline, which it reports as its deadline (a client that sets
// socket deadlines from the context, go-redis with ContextTimeoutEnabled,
// gives up then as well).
func (k *keepalive) claimContext() context.Context {
	if k.parent.Done() != nil && !k.detachedClaim {
		// The effect's context is made now, and the claim's context
		// ends with it (claimCtx): cheaper than a watch of parent's of
		// its own.
		k.mu.Lock()
		k.ctx, k.cancel = context.WithCancelCause(k.parent)
		k.mu.Unlock()
		return (*claimCtx)(k)
	}
	return (*callCtx)(k)
}

// token returns a fresh owner token for the claim, as rand.Text makes one
// (26 characters of the base32 alphabet, 130 random bits), kept in k.
func (k *keepalive) token() string {
	_, _ = rand.Read(k.tok[:]) // crypto/rand.Read never fails
	for i, b := range k.tok {
		k.tok[i] = base32Alphabet[b&31]
	}
	return unsafe.String(&k.tok[0], len(k.tok))
}

// endCall ends the store call's context with err. k.mu is held.
func (k *keepalive) endCall(err error) {
	if k.callErr != nil {
		return
	}
	k.callErr = err
	if k.done == nil {
		k.done = closed
	} else {
		close(k.done)
	}
	for _, f := range k.afters {
		go (*f)()
	}
	k.afters = nil
}

// timedOut reports whether the claim's bound passed before its answer.
func (k *keepalive) timedOut() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.late
}

// start begins the run of lease, whose deadline is k.valid, and makes the
// effect's context. It reports false, with the context cancelled, if the
// deadline has already passed, or the claim's bound did before its
// answer came: the lease must not be used.
func (k *keepalive) start(lease Lease) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	// The lease is kept whatever follows: the writes that end the claim
	// (Held's) use it even when the run cannot start.
	k.lease = lease
	if k.ctx == nil {
		k.ctx, k.cancel = context.WithCancelCause(k.parent)
	}
	if k.phase != claiming || k.late {
		k.cancel(fmt.Errorf("%w: the claim was answered after the lease's deadline", ErrLeaseLost))
		return false
	}
	now := time.Now()
	if !now.Before(k.valid) {
		k.end(fmt.Errorf("%w: the lease's deadline %s had passed before the effect started",
			ErrLeaseLost, k.valid.Format(time.RFC3339Nano)))
		return false
	}
	k.phase = running
	// Extend a third of a lease after the claim was sent.
	k.beat = k.valid.Add(-k.g.validity + k.g.opts.Lease/3)
	if k.g.opts.MaxRun > 0 {
		k.maxRun = now.Add(k.g.opts.MaxRun)
	}
	k.arm(now)
	return true
}

// arm sets the timer for what is due next. k.mu is held.
func (k *keepalive) arm(now time.Time) {
	var next time.Time
	switch k.phase {
	case claiming, writing:
		next = k.bound
	case running:
		next = k.beat
		if k.busy {
			next = k.valid // the deadline holds whatever the extension does
		}
		if !k.maxRun.IsZero() && k.maxRun.Before(next) {
			next = k.maxRun
		}
	default:
		return
	}
	if !k.armed.IsZero() && !next.Before(k.armed) {
		return // it fires sooner, and fire arms it again
	}
	k.armed = next
	k.timer.Reset(next.Sub(now))
}

// end cancels the effect's context with cause and stops the timer. An
// extension under way is abandoned: its answer changes nothing. k.mu is
// held.
func (k *keepalive) end(cause error) {
	k.phase = ended
	k.timer.Stop()
	k.armed = time.Time{}
	if k.extStop != nil {
		k.extStop()
	}
	if k.cancel != nil {
		k.cancel(cause)
	}
}

// fire is the timer's callback.
func (k *keepalive) fire() {
	k.mu.Lock()
	k.armed = time.Time{}
	var ev *Event
	defer func() {
		k.mu.Unlock()
		if ev != nil {
			k.g.observe(k.ctx, *ev)
		}
	}()
	now := time.Now()
	switch k.phase {
	case ended:
		return
	case claiming, writing:
		if now.Before(k.bound) {
			k.arm(now)
			return
		}
		k.late = k.phase == claiming
		k.phase = ended
		k.endCall(context.DeadlineExceeded)
		if k.late && k.cancel != nil {
			// The claim's context watched parent through k.ctx: end it.
			k.cancel(fmt.Errorf("%w: the claim was not answered within the lease's validity", ErrLeaseLost))
		}
		return
	}
	switch {
	case !k.maxRun.IsZero() && !now.Before(k.maxRun):
		err := fmt.Errorf("%w (%s): %w: the lease is no longer extended", ErrMaxRun, k.g.opts.MaxRun, ErrLeaseLost)
		k.end(err)
		ev = &Event{Kind: EventLeaseLost, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		return
	case !now.Before(k.valid):
		err := fmt.Errorf("%w: the lease's deadline passed without a successful extension", ErrLeaseLost)
		if k.lastErr != nil {
			err = fmt.Errorf("%w: the lease's deadline passed without a successful extension: %w", ErrLeaseLost, k.lastErr)
		}
		k.end(err)
		ev = &Event{Kind: EventLeaseLost, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		return
	case k.busy || now.Before(k.beat):
		k.arm(now) // early, or an extension is under way: wait
		return
	}

	// An extension is due. The timer now keeps the deadline while it runs;
	// the extension's own context ends then too, so an answer that would
	// come too late is not waited for where the client honours deadlines.
	k.busy = true
	k.arm(now)
	ectx, ecancel := context.WithDeadline(context.WithoutCancel(k.ctx), k.valid)
	k.extStop = ecancel
	lease := k.lease
	k.mu.Unlock()

	sent := time.Now()
	err := k.g.Extend(ectx, lease)
	ecancel()

	k.mu.Lock()
	k.busy, k.extStop = false, nil
	k.idle.Broadcast()
	if k.phase != running {
		return // stopped, or the deadline passed: a late answer revives nothing
	}
	now = time.Now()
	switch {
	case err == nil && now.Before(k.valid):
		// The server pushed the lease out at or after sent.
		k.valid = sent.Add(k.g.validity)
		k.beat = sent.Add(k.g.opts.Lease / 3)
		k.lastErr = nil
	case err == nil:
		k.end(fmt.Errorf("%w: an extension succeeded only after the lease's deadline", ErrLeaseLost))
		return
	case errors.Is(err, ErrLeaseLost):
		k.end(err) // observed by Extend
		return
	default:
		// Unavailable or timed out: try again soon, while the lease lasts.
		k.lastErr = err
		k.beat = now.Add(max(min(k.g.opts.Lease/3, k.valid.Sub(now)/3), time.Millisecond))
	}
	k.arm(now)
}

// stop ends the heartbeat (waiting for an extension under way, after
// telling it to give up), cancels the effect's context and ends the store
// call's. It may be called more than once.
func (k *keepalive) stop() {
	k.halt()
	k.mu.Lock()
	k.endCall(context.Canceled)
	writeCancel := k.writeCancel
	k.writeCancel = nil
	k.mu.Unlock()
	if writeCancel != nil {
		writeCancel()
	}
	if k.cancel != nil {
		k.cancel(nil)
	}
}

// halt ends the heartbeat and waits for an extension under way, without
// cancelling the effect's context.
func (k *keepalive) halt() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.quiesce()
	k.timer.Stop()
	k.armed = time.Time{}
}

// quiesce ends the heartbeat's phase and waits for an extension under
// way, after telling it to give up. The timer stays armed: fired, it does
// nothing until the phase changes. k.mu is held.
func (k *keepalive) quiesce() {
	k.phase = ended
	if k.extStop != nil {
		k.extStop()
	}
	for k.busy {
		k.idle.Wait()
	}
}

// detach ends the heartbeat and returns the context of the write that
// ends the claim: it carries the caller's values, outlives the caller's
// cancellation (a client that hangs up does not lose the result), and
// ends after max(Lease, 1s). Call stop when the write is done.
func (k *keepalive) detach() context.Context {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.quiesce()
	now := time.Now()
	k.phase, k.bound = writing, now.Add(max(k.g.opts.Lease, time.Second))
	if k.callErr != nil {
		// The call context has ended (at a bound, or by stop, before a
		// write that is tried again): it is not revived, since a context
		// derived from it may read its Err after it ended. This write
		// gets a context of its own, which stop cancels.
		if k.writeCancel != nil {
			k.writeCancel()
		}
		var ctx context.Context
		ctx, k.writeCancel = context.WithDeadline(context.WithoutCancel(k.parent), k.bound)
		return ctx
	}
	k.arm(now)
	return (*callCtx)(k)
}

// callCtx is a keepalive seen as the context of its store call: the claim
// or the write that ends it.
type callCtx keepalive

func (c *callCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	d, claim := c.bound, (c.phase == claiming || c.late) && !c.detachedClaim
	c.mu.Unlock()
	if claim {
		if pd, ok := c.parent.Deadline(); ok && pd.Before(d) {
			return pd, true
		}
	}
	return d, true
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callErr
}

func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

// AfterFunc arranges for f to run, in a goroutine of its own, when the
// context ends. The context package uses it for contexts derived from
// this one, instead of a goroutine watching Done for each.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.callErr != nil {
		go f()
		return func() bool { return false }
	}
	p := &f
	c.afters = append(c.afters, p)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, q := range c.afters {
			if q == p {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

func (c *callCtx) String() string { return "idemguard store call" }

// claimCtx is Do's claim context when the caller's context can be
// cancelled: the effect's context, k.ctx (made by claimContext), with the
// claim's deadline; the timer cancels k.ctx at the claim's bound. It stays
// a view of k.ctx after the claim: a context derived from it during the
// claim may be cancelled through it later (the context package's
// goroutine that does so reads Err then), so once Done has closed, Err
// never goes back to nil, as it would if the claim's context were the
// write's (detach) by then.
type claimCtx keepalive

func (c *claimCtx) Deadline() (time.Time, bool) { return (*callCtx)(c).Deadline() }

func (c *claimCtx) Done() <-chan struct{} { return c.ctx.Done() }

// Err is k.ctx's, or context.DeadlineExceeded when the claim's bound
// ended it.
func (c *claimCtx) Err() error {
	err := c.ctx.Err()
	if err != nil && (*keepalive)(c).timedOut() {
		return context.DeadlineExceeded
	}
	return err
}

func (c *claimCtx) Value(key any) any { return c.parent.Value(key) }

// AfterFunc arranges for f to run, in a goroutine of its own, when k.ctx
// ends (see callCtx.AfterFunc).
func (c *claimCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.ctx, f) }

func (c *claimCtx) String() string { return "idemguard store call" }
