package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// keepalive is what keeps a holder's run. In Do it is, in turn: the
// claim's context (bounded by the lease's first deadline), the heartbeat
// that extends the lease every Lease/3 while the effect runs and cancels
// the effect's context at the lease's deadline or at MaxRun, whatever an
// extension under way is doing, and the context of the write that ends
// the claim (detached from the caller's, bounded by max(Lease, 1s)).
//
// The claim's bound is kept by the guard's claim queue (claimQueue), one
// timer for every claim under way, so a claim costs no timer of its own:
// a replay, or any outcome but Acquired, costs this struct (the owner
// token in it), a place in the queue and the claim context's channel;
// the queue watches a caller's context that can be cancelled only for a
// claim still under way after claimWatchDelay. The effect's context is
// an effectCtx in the keepalive, backed by a context of the context
// package only if the effect asks for its Done channel; the keepalive's
// own timer is made when the run starts (start), or when a write needs a
// bound (detach): an effect that ends within a third of the lease arms it
// once (for the first extension) and stops it once, and needs no
// goroutine.
//
// The timer's callback, fire, decides from the state alone what is due,
// so a late or spurious firing does no harm: it re-arms the timer for
// what is due next.
type keepalive struct {
	g      *Guard
	parent context.Context // the caller's context
	// ctx is the effect's context, a child of parent: &eff, set by start
	// (nil until then). Guarded by mu.
	ctx context.Context
	eff effectCtx
	// detachedClaim: the claim does not end with parent, nor report its
	// deadline (Hold, DoBatch); the effect's context is parent's child all
	// the same.
	detachedClaim bool

	mu   sync.Mutex
	idle sync.Cond // broadcast when a notification ends
	// timer calls fire; nil until the run or a write needs one that the
	// claim queue does not keep (arm).
	timer *time.Timer
	// queued: the claim queue calls fire at armed (its runs or writes
	// list) in place of timer.
	queued bool
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
	// notifying: how many timer callbacks are telling the Observer of an
	// event, unlocked; quiesce waits for them, so the heartbeat's event (a
	// lost lease) is observed before the run returns (see lossSeen).
	notifying int
	// extStop ends the extension under way, if any.
	extStop context.CancelFunc
	// lastErr is the last failed extension's error, for the cause.
	lastErr error
	// lossSeen: the heartbeat observed EventLeaseLost, so the write that
	// ends the run does not observe the same loss again.
	lossSeen bool

	// The store call's context (callCtx), while claiming or writing.
	bound   time.Time     // its deadline
	done    chan struct{} // made when first asked for; closed when it ends
	callErr error         // why it ended; nil while it lasts
	// ownEnd: it ended for a reason of its own (its bound, the run's
	// end), not parent's cancellation (see callCtx.Value).
	ownEnd atomic.Bool
	late   bool // the claim's bound passed before its answer
	// afters run when the call's context ends (contexts derived from it).
	afters []*func()
	// writeCancel ends the context of a write made after the call's
	// context ended (detach), if any.
	writeCancel context.CancelFunc

	// q links the keepalive into g.claims's lists: slot 0 into one of
	// bounds (while its claim is under way), runs or writes (its timer's
	// first firing; list0 says which), slot 1 into watches (when to watch
	// parent, if watch). Guarded by g.claims.mu.
	q     [2]queueLinks
	list0 int
	// watch: the claim's context must end with parent's cancellation
	// (parent can be cancelled, and the claim is not detached).
	watch bool
	// unwatch ends the watch of parent that the claim queue made for a
	// claim still under way claimWatchDelay after it was sent, if any.
	unwatch func() bool

	// steps is the run's step log (Step); Lease.steps points here.
	steps stepLog

	// tok holds the claim's owner token (token): the Lease's Token is
	// a view of it, so the token costs no allocation of its own (a Lease
	// kept after Do returns keeps this struct with it).
	tok [tokenChars]byte
}

type phase uint8

const (
	claiming phase = iota // the claim is under way: the claim queue bounds it
	running               // the effect runs: the timer extends and keeps the deadline
	writing               // the effect returned: the timer bounds the write that ends the claim
	ended                 // the timer does nothing
)

// closed is a closed channel, for a call context that ended before anyone
// asked for its channel.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// newKeepalive returns a keepalive in phase claiming, with the lease's
// first deadline valid. It has no timer: claim puts it in the guard's
// claim queue, which bounds the claim; start or detach arm a timer of
// its own.
func (g *Guard) newKeepalive(parent context.Context, valid time.Time) *keepalive {
	k := &keepalive{g: g, parent: parent, valid: valid, bound: valid}
	k.idle.L = &k.mu
	return k
}

// claim puts k, about to send its claim, in the guard's claim queue: the
// claim's context ends at k.bound unless k leaves phase claiming first.
func (k *keepalive) claim() { k.g.claims.add(k) }

// claimBound ends the claim's context at its bound, the lease's first
// deadline, if the claim is still under way: the claim queue calls it.
func (k *keepalive) claimBound() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.phase != claiming || time.Now().Before(k.bound) {
		return
	}
	k.late = true
	if k.unwatch != nil {
		k.unwatch()
	}
	k.phase = ended
	k.endCall(context.DeadlineExceeded, true)
}

// watchParent makes the claim's context end with parent's cancellation,
// if the claim is still under way: the claim queue calls it
// claimWatchDelay after the claim was sent.
func (k *keepalive) watchParent() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.phase != claiming || k.callErr != nil || k.unwatch != nil {
		return
	}
	k.unwatch = context.AfterFunc(k.parent, k.parentDone)
}

// parentDone ends the claim's context as parent ended, if the claim is
// still under way.
func (k *keepalive) parentDone() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.parentEnded()
}

// parentEnded ends the claim's context if parent has ended and the claim
// is still under way, and reports whether it has ended. k.mu is held.
func (k *keepalive) parentEnded() bool {
	if k.callErr != nil {
		return true
	}
	if !k.watch || k.phase != claiming {
		return false
	}
	if err := k.parent.Err(); err != nil {
		k.endCall(err, false)
		return true
	}
	return false
}

// leaveClaim takes k out of the claim queue as it leaves phase claiming.
// k.mu is held.
func (k *keepalive) leaveClaim() {
	if k.phase != claiming {
		return
	}
	k.g.claims.remove(k)
	if k.unwatch != nil {
		k.unwatch()
	}
}

// claimContext returns the context of the claim: parent's values, ended
// by parent's cancellation (unless detachedClaim) and at the lease's
// first deadline, which it reports as its deadline (a client that sets
// socket deadlines from the context, go-redis with ContextTimeoutEnabled,
// gives up then as well). Its Err reports parent's cancellation at once;
// its Done channel closes within claimWatchDelay of it (see claimQueue).
func (k *keepalive) claimContext() context.Context {
	k.watch = k.parent.Done() != nil && !k.detachedClaim
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

// endCall ends the store call's context with err, for a reason of its own
// (own) or parent's cancellation. k.mu is held.
func (k *keepalive) endCall(err error, own bool) {
	if k.callErr != nil {
		return
	}
	k.callErr = err
	k.ownEnd.Store(own)
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
	k.eff = effectCtx{mu: &k.mu, parent: k.parent}
	k.ctx = &k.eff
	if k.phase != claiming || k.late {
		k.endEffect(fmt.Errorf("%w: the claim was answered after the lease's deadline", ErrLeaseLost))
		return false
	}
	now := time.Now()
	if !now.Before(k.valid) {
		k.end(fmt.Errorf("%w: the lease's deadline %s had passed before the effect started",
			ErrLeaseLost, k.valid.Format(time.RFC3339Nano)))
		return false
	}
	// k leaves the claim queue's bounds as arm puts it in its runs.
	if k.unwatch != nil {
		k.unwatch()
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
	case claiming:
		next = k.bound
	case writing:
		next = k.bound
		if k.ctx != nil && k.eff.errLocked() == nil && k.valid.Before(next) {
			next = k.valid // the effect's context ends at the lease's deadline
		}
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
	if k.timer == nil && !k.busy {
		// The first extension of a run, MaxRun before it, or a write's
		// bound: the claim queue keeps it, with one timer for every
		// keepalive of the guard, so a short effect and its write cost
		// no timer of their own (and leave the claim queue's bounds).
		list := runs
		if k.phase == writing {
			list = writes
		}
		k.g.claims.wake(k, list, next)
		k.queued = true
		return
	}
	if k.queued {
		// Out of the claim queue: once a run needs a timer of its own
		// (for the deadline while an extension is under way), it keeps it.
		k.g.claims.remove(k)
		k.queued = false
	}
	if k.timer == nil {
		k.timer = time.AfterFunc(next.Sub(now), k.fire)
		return
	}
	k.timer.Reset(next.Sub(now))
}

// stopTimer stops k's timer, if it has one, and takes k out of the claim
// queue. k.mu is held.
func (k *keepalive) stopTimer() {
	if k.timer != nil {
		k.timer.Stop()
	}
	if k.queued {
		k.g.claims.remove(k)
		k.queued = false
	}
	k.armed = time.Time{}
}

// end cancels the effect's context with cause and stops the timer. An
// extension under way is abandoned: its answer changes nothing. k.mu is
// held.
func (k *keepalive) end(cause error) {
	k.leaveClaim()
	k.phase = ended
	k.stopTimer()
	if k.extStop != nil {
		k.extStop()
	}
	k.endEffect(cause)
}

// lossObserved reports whether the heartbeat observed the lease lost
// (EventLeaseLost): the write that ends the run then observes no second
// loss (see observeErr).
func (k *keepalive) lossObserved() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lossSeen
}

// lossObservedFor implements lossSink: lossObserved.
func (k *keepalive) lossObservedFor(int) bool { return k.lossObserved() }

// stepLost: a step of the run found the lease lost (lossSink). The
// effect's context ends now, and the write that ends the run observes no
// second loss.
func (k *keepalive) stepLost(_ int, err error) (observed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	observed = k.lossSeen
	if k.phase == running {
		k.end(err)
	}
	k.lossSeen = true
	return observed
}

// fire is the timer's callback.
func (k *keepalive) fire() {
	k.mu.Lock()
	k.armed = time.Time{}
	var ev *Event
	defer func() {
		if ev == nil {
			k.mu.Unlock()
			return
		}
		k.notifying++
		k.mu.Unlock()
		k.g.observe(k.ctx, *ev)
		k.mu.Lock()
		k.notifying--
		k.idle.Broadcast()
		k.mu.Unlock()
	}()
	now := time.Now()
	switch k.phase {
	case ended:
		return
	case claiming:
		return // bounded by the claim queue (claimBound), not the timer
	case writing:
		if k.ctx != nil && !now.Before(k.valid) {
			// The holder may assume nothing past its deadline, the write
			// that ends its claim under way or not: another claim may
			// take the key once the store's lease ran out. Whether the
			// lease was lost the write tells (and observes).
			k.endEffect(fmt.Errorf("%w: the lease's deadline passed while the write that ends the claim was under way", ErrLeaseLost))
		}
		if now.Before(k.bound) {
			k.arm(now)
			return
		}
		k.phase = ended
		k.endCall(context.DeadlineExceeded, true)
		return
	}
	switch {
	case !k.maxRun.IsZero() && !now.Before(k.maxRun):
		err := fmt.Errorf("%w (%s): %w: the lease is no longer extended", ErrMaxRun, k.g.opts.MaxRun, ErrLeaseLost)
		k.end(err)
		k.lossSeen = true
		ev = &Event{Kind: EventLeaseLost, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		return
	case !now.Before(k.valid):
		err := fmt.Errorf("%w: the lease's deadline passed without a successful extension", ErrLeaseLost)
		if k.lastErr != nil {
			err = fmt.Errorf("%w: the lease's deadline passed without a successful extension: %w", ErrLeaseLost, k.lastErr)
		}
		k.end(err)
		k.lossSeen = true
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
	err := k.g.extend(ectx, lease)
	ecancel()

	k.mu.Lock()
	k.busy, k.extStop = false, nil
	if k.phase != running {
		// Stopped, or the deadline passed: a late answer revives nothing,
		// and is not observed. The run may have ended the claim without
		// waiting for this extension (quiesce), so a refusal here can be
		// the answer to an extension that reached the store after the
		// completion did, not a lost lease.
		return
	}
	now = time.Now()
	switch {
	case err == nil && now.Before(k.valid):
		// The server pushed the lease out at or after sent.
		k.valid = sent.Add(k.g.validity)
		k.beat = sent.Add(k.g.opts.Lease / 3)
		k.lastErr = nil
	case err == nil:
		// The timer that keeps the deadline has not fired yet: the lease
		// is lost all the same, and observed as lost (as DoBatch's is).
		err = fmt.Errorf("%w: an extension succeeded only after the lease's deadline", ErrLeaseLost)
		k.end(err)
		k.lossSeen = true
		ev = &Event{Kind: EventLeaseLost, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		return
	case errors.Is(err, ErrLeaseLost):
		k.end(err)
		k.lossSeen = true
		ev = &Event{Kind: EventLeaseLost, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		return
	default:
		// Unavailable or timed out: try again soon, while the lease lasts.
		k.lastErr = err
		k.beat = now.Add(max(min(k.g.opts.Lease/3, k.valid.Sub(now)/3), time.Millisecond))
		if kind, ok := errEventKind(err); ok {
			ev = &Event{Kind: kind, Key: k.lease.Key, Attempt: k.lease.Attempt, Err: err}
		}
	}
	k.arm(now)
}

// stop ends the heartbeat (telling an extension under way to give up,
// without waiting for its answer), cancels the effect's context and ends the store
// call's. It may be called more than once.
func (k *keepalive) stop() {
	k.halt()
	k.mu.Lock()
	k.endCall(context.Canceled, true)
	writeCancel := k.writeCancel
	k.writeCancel = nil
	k.endEffect(nil)
	k.mu.Unlock()
	if writeCancel != nil {
		writeCancel()
	}
}

// halt ends the heartbeat, telling an extension under way to give up,
// without cancelling the effect's context.
func (k *keepalive) halt() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.quiesce()
	k.stopTimer()
}

// quiesce ends the heartbeat's phase, tells an extension under way to
// give up, and waits for the Observer to hear of an event the heartbeat
// found (so it is heard before the run returns). It does not wait for the
// extension's answer: a client that ignores its context (go-redis without
// ContextTimeoutEnabled waits out its read timeout) would hold the write
// that ends the claim until the lease ran out, and a duplicate would then
// run the effect again. The extension's answer, when it comes, changes
// nothing and is not observed (fire). The timer stays armed: fired, it
// does nothing until the phase changes. k.mu is held.
func (k *keepalive) quiesce() {
	k.leaveClaim()
	k.phase = ended
	if k.extStop != nil {
		k.extStop()
	}
	for k.notifying > 0 {
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

// detachFreeing is detach for a write that frees the key (a failure or a
// release): another claim can take the key as soon as the store has the
// write, before its answer is back, so the effect's context ends first
// (docs/design.md: the holder's context is done before any other claim of
// the key can succeed). A completion frees nothing: the key then replays.
func (k *keepalive) detachFreeing() context.Context {
	ctx := k.detach()
	k.mu.Lock()
	k.endEffect(nil)
	k.mu.Unlock()
	return ctx
}

// endEffect ends the effect's context with cause (nil: context.Canceled),
// unless it has ended already or is not made yet. k.mu is held.
func (k *keepalive) endEffect(cause error) {
	if k.ctx != nil {
		k.eff.end(cause)
	}
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

// Err reports parent's cancellation during the claim at once (and ends
// the context then, so that Done agrees).
func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	(*keepalive)(c).parentEnded()
	return c.callErr
}

// Value gives parent's values. Once the call's context ended for a reason
// of its own (its bound, the run's end), parent's cancellation is hidden
// from it, so that context.Cause of the call gives that reason, not a
// cause the caller cancelled with meanwhile (which would read as the
// caller's refusal, not as a write whose outcome is unknown).
func (c *callCtx) Value(key any) any {
	if c.ownEnd.Load() {
		return context.WithoutCancel(c.parent).Value(key)
	}
	return c.parent.Value(key)
}

// AfterFunc arranges for f to run, in a goroutine of its own, when the
// context ends. The context package uses it for contexts derived from
// this one, instead of a goroutine watching Done for each.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (*keepalive)(c).parentEnded() {
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

// claimWatchDelay is how long a claim of Do may be under way before its
// context watches the caller's for cancellation: a claim answered sooner,
// nearly every one, costs no watch. Until then the claim's context
// reports the caller's cancellation from Err at once, and a store that
// waits on its Done channel learns of it up to this much later.
const claimWatchDelay = 5 * time.Millisecond

// The claim queue's lists.
const (
	bounds  = iota // every claim under way, by its bound
	watches        // claims whose caller is still to be watched, by when
	runs           // runs whose timer is due first (first extension, MaxRun), by when
	writes         // writes that end a claim, by their bound
)

// queueLinks is a keepalive's place in one list of the claim queue.
type queueLinks struct {
	prev, next *keepalive
	in         bool
	at         time.Time // when it is due
}

// queueList is a list of the claim queue, kept in order of due times.
type queueList struct {
	i          int // which of the keepalive's links: 0, or 1 for watches
	head, tail *keepalive
}

// add puts k at its place in l, at at: after a step back or two from the
// tail when goroutines raced between reading the clock and joining.
func (l *queueList) add(k *keepalive, at time.Time) {
	kl := &k.q[l.i]
	kl.at = at
	after := l.tail
	for after != nil && at.Before(after.q[l.i].at) {
		after = after.q[l.i].prev
	}
	kl.prev = after
	if after == nil {
		kl.next, l.head = l.head, k
	} else {
		kl.next, after.q[l.i].next = after.q[l.i].next, k
	}
	if kl.next == nil {
		l.tail = k
	} else {
		kl.next.q[l.i].prev = k
	}
	kl.in = true
}

// remove takes k out of l, if it is there.
func (l *queueList) remove(k *keepalive) {
	kl := &k.q[l.i]
	if !kl.in {
		return
	}
	if kl.prev == nil {
		l.head = kl.next
	} else {
		kl.prev.q[l.i].next = kl.next
	}
	if kl.next == nil {
		l.tail = kl.prev
	} else {
		kl.next.q[l.i].prev = kl.prev
	}
	kl.prev, kl.next, kl.in = nil, nil, false
}

// due takes from l the keepalives due at now and appends them to ks.
func (l *queueList) due(now time.Time, ks []*keepalive) []*keepalive {
	for l.head != nil && !now.Before(l.head.q[l.i].at) {
		k := l.head
		l.remove(k)
		ks = append(ks, k)
	}
	return ks
}

// next is when l's head is due; zero when l is empty.
func (l *queueList) next() time.Time {
	if l.head == nil {
		return time.Time{}
	}
	return l.head.q[l.i].at
}

// claimQueue bounds the claims of a guard under way with one timer: each
// claim's context ends at its bound (the lease's first deadline) unless
// its keepalive leaves the queue first, and a claim of Do still under way
// claimWatchDelay after it was sent starts watching its caller's context.
// Each list is kept in order of due times, which, with one Lease per
// guard, is the order the claims were sent in: a claim joins at the tail
// and leaves from wherever it is, and the timer is armed for the sooner
// head. A head that leaves does not move the timer: it fires early and is
// armed again for the new heads, about once per claimWatchDelay at a
// steady load, so a claim costs two short critical sections and no timer
// or watch of its own.
//
// The same timer fires the keepalives' own timers the first time: a run's
// first extension (a third of a lease after the claim was sent, or MaxRun
// if sooner) and the bound of the write that ends a claim, again each in
// order with one Lease per guard. It calls the keepalive's fire for each
// one due, in a goroutine of its own, as a timer of its own would; a run
// that outlasts its first extension arms a timer of its own. So a run that
// ends sooner costs no timer.
type claimQueue struct {
	mu    sync.Mutex
	lists [4]queueList
	timer *time.Timer
	armed time.Time // when the timer fires next; zero: not armed
}

func newClaimQueue() *claimQueue {
	return &claimQueue{lists: [4]queueList{{i: 0}, {i: 1}, {i: 0}, {i: 0}}}
}

// add puts k, about to send its claim, in the queue.
func (q *claimQueue) add(k *keepalive) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lists[bounds].add(k, k.bound)
	k.list0 = bounds
	next := k.bound
	if k.watch {
		// k.bound is when the claim was sent + the guard's validity.
		at := k.bound.Add(-k.g.validity + claimWatchDelay)
		q.lists[watches].add(k, at)
		if at.Before(next) {
			next = at
		}
	}
	if q.armed.IsZero() || next.Before(q.armed) {
		q.arm(next)
	}
}

// arm sets the timer for when. q.mu is held.
func (q *claimQueue) arm(when time.Time) {
	q.armed = when
	if q.timer == nil {
		q.timer = time.AfterFunc(time.Until(when), q.fire)
		return
	}
	q.timer.Reset(time.Until(when))
}

// wake puts k in list (runs or writes) at at, out of any other list:
// the queue calls k.fire then.
func (q *claimQueue) wake(k *keepalive, list int, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lists[k.list0].remove(k)
	q.lists[watches].remove(k)
	q.lists[list].add(k, at)
	k.list0 = list
	if q.armed.IsZero() || at.Before(q.armed) {
		q.arm(at)
	}
}

// remove takes k out of the queue, if it is there.
func (q *claimQueue) remove(k *keepalive) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lists[k.list0].remove(k)
	q.lists[watches].remove(k)
}

// fire is the timer's callback: it ends the claims whose bound has
// passed, starts watching the callers of those due to be watched, and
// arms the timer for what is due next.
func (q *claimQueue) fire() {
	q.mu.Lock()
	q.armed = time.Time{}
	now := time.Now()
	ended := q.lists[bounds].due(now, nil)
	for _, k := range ended {
		q.lists[watches].remove(k)
	}
	watch := q.lists[watches].due(now, nil)
	fire := q.lists[writes].due(now, q.lists[runs].due(now, nil))
	var next time.Time
	for i := range q.lists {
		if at := q.lists[i].next(); !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	if !next.IsZero() {
		q.arm(next)
	}
	q.mu.Unlock()
	for _, k := range ended {
		k.claimBound()
	}
	for _, k := range watch {
		k.watchParent()
	}
	for _, k := range fire {
		go k.fire()
	}
}
