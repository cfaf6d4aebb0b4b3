// Package lock runs critical sections under Redlock: a lock held on a
// quorum of N independent Redis nodes, through github.com/go-redsync/redsync.
//
// Locker.Do obtains a lock, runs a function while a watchdog extends the
// lock, and cancels the function's context with cause ErrLost the moment
// the lock can no longer be proven held; then it releases the lock.
// TryDo tries once. Obtain and TryObtain return a Lock to extend and
// release by hand. Guarded runs a guard.Func inside a lock named by a
// resource (two idempotency keys touching one account never overlap), and
// Singleton lets one instance at a time run a job.
//
// What Redlock does not give: a holder that stalls (GC pause, swapped out)
// past its lock's validity can still act after another holder has the
// lock; its context is cancelled, but nothing stops code that ignores it.
// Writes that must not overlap should also be fenced downstream: with
// Options.Fencing each holder gets a number greater than every earlier
// holder's, and two holders at once distinct ones (Lock.Fence; the faults
// it survives are under Options.Fencing), which a store can compare; the
// guard's Lease.Fence and the SQL backstop's unique row do the same per
// key.
// Nodes should persist (AOF with fsync) or stay down longer than Expiry
// after a crash, or a restarted empty node can hand the lock out twice.
// A node that evicts keys, or whose clock steps forward (it lets keys go
// early), is as faulty as one restarted empty: use maxmemory-policy
// noeviction (a full node then refuses new locks, but still extends and
// releases held ones) and a clock that slews. The holder's own clock may
// jump: validity is reckoned on its monotonic clock.
package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/redis/go-redis/v9"
)

// Defaults for Options.
const (
	DefaultPrefix           = "idemguard:lock:"
	DefaultExpiry           = 8 * time.Second // redsync's default
	DefaultUnavailableTries = 3
	DefaultTimeoutFactor    = 0.05 // redsync's default
	DefaultDriftFactor      = 0.01 // redsync's default
)

// MaxNameLen is the longest lock name accepted (in bytes). Names may hold
// any bytes but must not end in ":fence" or ":fence:round" (the fence
// counters' keys).
const MaxNameLen = 512

// Options configure a Locker. The zero value is ready to use.
type Options struct {
	// Prefix starts the Redis key of every lock: the key of lock "x" is
	// Prefix+"x". Default DefaultPrefix.
	Prefix string
	// Expiry is how long a lock lives on a node without being extended. A
	// holder that dies frees the lock after at most Expiry; while Do's
	// function runs, the lock is extended every Expiry/3 (from the start
	// of the round that acquired or last extended it). It is rounded
	// down to whole milliseconds, the resolution of Redis's expiry (the
	// nodes are told whole milliseconds, and the validity is reckoned
	// from what they are told). Default DefaultExpiry (8s).
	Expiry time.Duration
	// Tries bounds the attempts Obtain and Do make while the lock is held
	// by others; they then return ErrNotObtained. Zero means no bound:
	// they wait until ctx ends.
	Tries int
	// RetryDelay is the mean pause between attempts; each pause is drawn
	// at random from [RetryDelay/2, 3*RetryDelay/2) so that waiters do not
	// collide in step. Default: from [50ms, 250ms), as redsync.
	RetryDelay time.Duration
	// UnavailableTries is how many attempts in a row that reach fewer than
	// a quorum of nodes make Obtain and Do give up with ErrUnavailable,
	// even if ctx has no deadline. Default DefaultUnavailableTries (3).
	UnavailableTries int
	// TimeoutFactor bounds each round of calls to the nodes (acquire,
	// extend, release) to Expiry*TimeoutFactor. Default
	// DefaultTimeoutFactor (0.05, i.e. 400ms for the default expiry).
	// Must be below 1/3, and not NaN.
	TimeoutFactor float64
	// DriftFactor is the share of Expiry kept back for clock drift between
	// nodes: a lock is valid for Expiry minus the time taken to acquire it
	// minus Expiry*DriftFactor. Default DefaultDriftFactor (0.01).
	// DriftFactor plus TimeoutFactor must be below 1/3; NaN is refused.
	DriftFactor float64
	// Fencing makes every acquisition also take a fencing number
	// (Lock.Fence, or FromContext(ctx).Fence() inside Do): it grows with
	// every acquisition of the name, so a store that remembers the highest
	// number it has seen can reject writes of a holder that lost the lock.
	// It costs two more rounds to the nodes per acquisition, a counter key
	// per lock name (Prefix+name+":fence") that never expires, and a key
	// naming the round that last raised it, kept for Expiry (so that a
	// raise go-redis sends again is the round's own). The
	// numbers only grow while a quorum of nodes keeps its counters: each
	// fence is written to a quorum at least, read from every node that
	// answers, and refused if a node answers the write holding it already
	// (ErrNotObtained) or a node whose counter was read does not answer
	// the write (ErrUnavailable; a full node's refusal is an answer). So
	// two holders at once (a broken lock) get distinct fences, and with 3
	// nodes one restarted empty is survived, also when that restart is
	// what broke the lock. A
	// second fault (another restart; a node answering neither round of a
	// fence, such as the one node left with the last number being down
	// for the next; a full node that refuses one round's write and takes
	// another's) can start the numbers again from low values, or give two
	// holders at once the same one. Of two rounds that would take the
	// same number, at most one gets it; the other's attempt fails.
	Fencing bool
}

func (o Options) withDefaults() (Options, error) {
	// !(x >= 0) refuses NaN too: it passes every comparison below, and
	// gives rounds a timeout and locks a validity of -2^63ns.
	if o.Expiry < 0 || o.Tries < 0 || o.RetryDelay < 0 || o.UnavailableTries < 0 ||
		!(o.TimeoutFactor >= 0) || !(o.DriftFactor >= 0) {
		return o, fmt.Errorf("lock: negative or NaN option in %+v", o)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Expiry == 0 {
		o.Expiry = DefaultExpiry
	}
	// The nodes keep whole milliseconds (redsync sends PX Expiry/1ms); a
	// validity reckoned from a longer Expiry would outlast the keys.
	o.Expiry = o.Expiry.Truncate(time.Millisecond)
	if o.Expiry < 3*time.Millisecond {
		return o, fmt.Errorf("lock: Expiry %s is too short (3ms at least)", o.Expiry)
	}
	if o.UnavailableTries == 0 {
		o.UnavailableTries = DefaultUnavailableTries
	}
	if o.TimeoutFactor == 0 {
		o.TimeoutFactor = DefaultTimeoutFactor
	}
	if o.TimeoutFactor >= 1.0/3 {
		return o, fmt.Errorf("lock: TimeoutFactor %v must be below 1/3", o.TimeoutFactor)
	}
	if o.DriftFactor == 0 {
		o.DriftFactor = DefaultDriftFactor
	}
	if o.DriftFactor+o.TimeoutFactor >= 1.0/3 {
		return o, fmt.Errorf("lock: DriftFactor %v + TimeoutFactor %v must be below 1/3", o.DriftFactor, o.TimeoutFactor)
	}
	return o, nil
}

// Locker hands out locks held on a quorum (N/2+1) of its nodes. It is safe
// for concurrent use; it does not own the clients and never closes them.
type Locker struct {
	rs      *redsync.Redsync
	clients []redis.UniversalClient
	opts    Options
	nodes   int
	quorum  int
}

// New returns a Locker over nodes: clients of independent Redis servers
// (not replicas of one another, not one Cluster). Use an odd number, 3 or
// 5; a single node gives a lock with no fault tolerance. A node given
// twice (one client, or two *redis.Client of one network and address as
// written: "localhost" and "127.0.0.1" are not compared) is refused: it
// would count twice towards the quorum. Every Locker that
// takes a lock name must have the same nodes: quorums of different sets
// need not meet (of nodes a, b, c and of a, b, c, d, e, the quorums {a, b}
// and {c, d, e} share none), so a move to other nodes must not overlap
// old holders (stop them all, or wait out Expiry). It does not touch the
// network.
//
// The clients should honour context deadlines (go-redis
// ContextTimeoutEnabled), as NewNodes makes them: otherwise a node that
// hangs holds up each round for the client's ReadTimeout (3s by default)
// instead of Expiry*TimeoutFactor. Safety does not depend on it: a lock's
// validity always deducts the time its round took.
func New(nodes []redis.UniversalClient, opts Options) (*Locker, error) {
	if len(nodes) == 0 {
		return nil, errors.New("lock: New needs at least one Redis node")
	}
	pools := make([]redsyncredis.Pool, len(nodes))
	for i, c := range nodes {
		if c == nil || isNilPointer(c) {
			return nil, fmt.Errorf("lock: node %d is nil", i)
		}
		for j, d := range nodes[:i] {
			if sameNode(c, d) {
				return nil, fmt.Errorf("lock: node %d is node %d again: it would count twice towards the quorum", i, j)
			}
		}
		pools[i] = newPool(c)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Locker{
		rs:      redsync.New(pools...),
		clients: append([]redis.UniversalClient(nil), nodes...),
		opts:    o,
		nodes:   len(nodes),
		quorum:  len(nodes)/2 + 1,
	}, nil
}

// isNilPointer reports whether c is a nil pointer of a client type, such
// as (*redis.Client)(nil), which an interface holding it does not equal
// nil.
func isNilPointer(c redis.UniversalClient) bool {
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// sameNode reports whether a and b are one client, or clients of one
// address. Sentinel failover clients (whose address go-redis gives as
// "FailoverClient"), Rings and Cluster clients are told apart by
// identity only.
func sameNode(a, b redis.UniversalClient) bool {
	if a == b {
		return true
	}
	x, y := nodeAddr(a), nodeAddr(b)
	return x != "" && x == y
}

// nodeAddr is the network and address c dials, or "" if c is not a
// *redis.Client of one address.
func nodeAddr(c redis.UniversalClient) string {
	rc, ok := c.(*redis.Client)
	if !ok {
		return ""
	}
	o := rc.Options()
	if o.Addr == "" || o.Addr == "FailoverClient" {
		return ""
	}
	return o.Network + " " + o.Addr
}

// NewNodes returns a client of each of addrs, set up for a Locker:
// context deadlines bound every call (ContextTimeoutEnabled); a refused
// dial fails at once instead of being tried 5 times 100ms apart
// (DialerRetries 1); and a command is retried once (MaxRetries 1: enough
// for a connection the server dropped). The Locker's own attempts are the
// real retries. The caller closes the clients.
func NewNodes(addrs ...string) []redis.UniversalClient {
	nodes := make([]redis.UniversalClient, len(addrs))
	for i, addr := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{
			Addr:                  addr,
			ContextTimeoutEnabled: true,
			DialerRetries:         1,
			MaxRetries:            1,
		})
	}
	return nodes
}

// Options returns the Locker's options with defaults filled in.
func (l *Locker) Options() Options { return l.opts }

// Quorum returns how many nodes must agree for a lock to be held.
func (l *Locker) Quorum() int { return l.quorum }

// Obtain takes the lock name, waiting while another holder has it: it
// tries until it succeeds, ctx ends, Options.Tries attempts are spent
// (ErrNotObtained) or Options.UnavailableTries attempts in a row reach no
// quorum (ErrUnavailable). The caller must Release the lock, and Extend it
// before Lock.Until. When ctx ends while an attempt is under way, the
// attempt still completes (so that it leaves no keys behind on the nodes
// it reached), and a lock it took is released: Obtain returns
// ErrNotObtained wrapping ctx's cause, never a lock, once ctx has ended;
// Do and TryDo then do not run fn.
func (l *Locker) Obtain(ctx context.Context, name string) (*Lock, error) {
	return l.obtain(ctx, name, l.opts.Tries, l.opts.UnavailableTries)
}

// TryObtain makes one attempt to take the lock name: ErrNotObtained if
// another holder has it, ErrUnavailable if no quorum of nodes answered.
func (l *Locker) TryObtain(ctx context.Context, name string) (*Lock, error) {
	return l.obtain(ctx, name, 1, 1)
}

// Do runs fn while holding the lock name, waiting for it as Obtain does.
// fn's context is cancelled with cause ErrLost when the lock can no longer
// be proven held (an extension found it gone, or its validity ran out
// while extensions failed); fn should stop work that needs the lock then.
// When fn returns (or panics), the lock is released, even if ctx was
// cancelled.
//
// Do returns fn's error. When the lock was lost while fn ran (or the
// release found it already gone), the error also matches ErrLost, even if
// fn returned nil: fn's work may have overlapped another holder's. That
// holds when ctx was cancelled first, too (fn's context then keeps ctx's
// cause), and when fn returned after the lock's validity ran out. A
// release that fails for want of nodes is not reported: the lock expires
// by itself within Options.Expiry.
func (l *Locker) Do(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	lk, err := l.Obtain(ctx, name)
	if err != nil {
		return err
	}
	return lk.run(ctx, fn)
}

// TryDo is Do with a single attempt to take the lock: if another holder
// has it, TryDo returns ErrNotObtained at once and fn does not run.
func (l *Locker) TryDo(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	lk, err := l.TryObtain(ctx, name)
	if err != nil {
		return err
	}
	return lk.run(ctx, fn)
}

// obtain makes attempts to take the lock name until one succeeds, ctx
// ends, tries attempts found it taken (0: no bound), or unavailableTries
// attempts in a row reached no quorum.
func (l *Locker) obtain(ctx context.Context, name string, tries, unavailableTries int) (*Lock, error) {
	if name == "" || len(name) > MaxNameLen {
		return nil, fmt.Errorf("%w: %d bytes (1 to %d)", ErrInvalidName, len(name), MaxNameLen)
	}
	if strings.HasSuffix(name, fenceSuffix) || strings.HasSuffix(name, roundSuffix) {
		return nil, fmt.Errorf("%w: %q: names ending in %q or %q are kept for fence counters", ErrInvalidName, name, fenceSuffix, roundSuffix)
	}
	m := l.rs.NewMutex(l.opts.Prefix+name,
		redsync.WithExpiry(l.opts.Expiry),
		redsync.WithTries(1),
		redsync.WithTimeoutFactor(l.opts.TimeoutFactor),
		redsync.WithDriftFactor(l.opts.DriftFactor),
	)
	var (
		timer       *time.Timer
		taken       int
		unavailable int
		last        error
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil, l.waitErr(ctx, name, last)
		}
		// An attempt is bounded by Expiry*TimeoutFactor and is not cut
		// short by ctx: a cancelled attempt would leave its keys behind
		// on the nodes it reached until they expire.
		err := m.TryLockContext(context.WithoutCancel(ctx))
		if err == nil {
			k := &Lock{locker: l, name: name, m: m}
			k.noteUntil()
			if ctx.Err() != nil {
				// The caller went away while the attempt was under way:
				// it completed so as to leave nothing behind, and the
				// lock is given back, not handed to no one.
				k.releaseNow(ctx)
				return nil, l.waitErr(ctx, name, nil)
			}
			if !l.opts.Fencing {
				return k, nil
			}
			// A fence round that reaches no quorum (ErrUnavailable) is
			// an attempt like an acquisition that reaches none: release
			// and try again, up to unavailableTries in a row.
			if k.fence, err = l.fence(context.WithoutCancel(ctx), name); err != nil {
				k.releaseNow(ctx)
				last = err
			} else if ctx.Err() != nil {
				k.releaseNow(ctx)
				return nil, l.waitErr(ctx, name, nil)
			} else if time.Now().Before(k.Until()) {
				// The fence is above every earlier holder's only if it
				// was raised while this holder still had the lock: a
				// holder that stalled after reading the counters, past
				// its validity, may raise them to the number the next
				// holder already took.
				return k, nil
			} else {
				k.releaseNow(ctx)
				last = fmt.Errorf("%w: lock %q: its validity ran out while the fence was taken", ErrNotObtained, name)
			}
		} else {
			last = l.acquireErr(name, err)
		}
		if ctx.Err() != nil {
			// The caller went away during the attempt: say so, whatever
			// the attempt met (and whether or not it was the last).
			return nil, l.waitErr(ctx, name, last)
		}
		if errors.Is(last, ErrUnavailable) {
			unavailable++
			if unavailable >= unavailableTries {
				return nil, last
			}
		} else {
			unavailable = 0
			taken++
			if tries > 0 && taken >= tries {
				return nil, last
			}
		}
		if timer == nil {
			timer = time.NewTimer(l.retryDelay())
		} else {
			timer.Reset(l.retryDelay())
		}
		select {
		case <-ctx.Done():
			return nil, l.waitErr(ctx, name, last)
		case <-timer.C:
		}
	}
}

// waitErr is the error of an Obtain whose ctx ended before it got the lock.
func (l *Locker) waitErr(ctx context.Context, name string, last error) error {
	if last != nil {
		return fmt.Errorf("%w: lock %q: %w (last attempt: %w)", ErrNotObtained, name, context.Cause(ctx), last)
	}
	return fmt.Errorf("%w: lock %q: %w", ErrNotObtained, name, context.Cause(ctx))
}

func (l *Locker) retryDelay() time.Duration {
	if d := l.opts.RetryDelay; d > 0 {
		return d/2 + rand.N(d)
	}
	return 50*time.Millisecond + rand.N(200*time.Millisecond)
}

// opTimeout bounds one round of calls to the nodes.
func (l *Locker) opTimeout() time.Duration {
	return time.Duration(float64(l.opts.Expiry) * l.opts.TimeoutFactor)
}

// Lock is a held lock. Its methods are safe for concurrent use.
type Lock struct {
	locker *Locker
	name   string

	fence int64

	mu sync.Mutex // guards m and over: redsync's Mutex is not safe for concurrent use
	m  *redsync.Mutex
	// over: Release called, or found lost (ErrLost): Until is past for good.
	over bool
	// until is m's validity as the last round that changed it left it,
	// nil once the lock was found lost; released: Release was called.
	// Until reads them without mu, so it does not wait for a round under
	// way (one node not answering makes it last its whole bound).
	until    atomic.Pointer[time.Time]
	released atomic.Bool
}

// noteUntil records m's validity for Until, unless the lock was found
// lost. k.mu is held, or k is not shared yet.
func (k *Lock) noteUntil() {
	if k.over {
		return
	}
	u := k.m.Until()
	k.until.Store(&u)
}

// Fence returns the lock's fencing number: greater than that of every
// earlier holder of the name, and no other holder's, while a quorum of
// nodes keeps its counters (see Options.Fencing). It is 0 unless
// Options.Fencing is set.
func (k *Lock) Fence() int64 { return k.fence }

// Name returns the lock's name (without the Locker's prefix).
func (k *Lock) Name() string { return k.name }

// Key returns the Redis key the lock is held under on each node.
func (k *Lock) Key() string { return k.locker.opts.Prefix + k.name }

// Until returns when the lock stops being valid unless extended: the
// acquisition (or last extension) time plus Expiry, less the time the
// round took and the drift allowance. Once Release was called (whatever
// it answered: deletions whose answers were lost may have landed), or
// Extend found the lock lost (ErrLost), it is the zero time: a holder
// that checks it before a write writes nothing more.
//
// It does not wait for an Extend under way: until that round ends, it is
// the validity the lock had before it.
func (k *Lock) Until() time.Time {
	if u := k.until.Load(); u != nil && !k.released.Load() {
		return *u
	}
	return time.Time{}
}

// Extend pushes the lock's expiry out to Options.Expiry from now on a
// quorum of nodes. ErrLost: the lock is no longer held on a quorum (it
// expired or another holder has it), or the round took longer than the
// validity it would give. ErrUnavailable: too few nodes answered; the
// lock may still be held until Until. An Extend after Until succeeds if
// it finds the keys still on a quorum: keys only vanish (expiry, eviction,
// a restart), so unless a node went back to older data (a restore from a
// snapshot) no other holder can have had the lock meanwhile, though no
// validity covered that time.
func (k *Lock) Extend(ctx context.Context) error {
	// The round's bound starts once the lock's mutex is held: a round
	// under way (one node not answering makes it last its whole bound)
	// must not spend this one's.
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, k.locker.opTimeout())
	defer cancel()
	ok, err := k.m.ExtendContext(ctx)
	if ok {
		k.noteUntil()
		return nil
	}
	if err == nil {
		err = redsync.ErrExtendFailed
	}
	err = k.locker.extendErr(k.name, err)
	if errors.Is(err, ErrLost) {
		k.over = true
		k.until.Store(nil)
	}
	return err
}

// Release frees the lock on every node that still holds it. ErrLost: it
// had already expired or been taken over on too many nodes to have been
// held; ErrUnavailable: too few nodes answered (the lock expires by itself
// within Options.Expiry). A ctx that has already ended reaches no node:
// release with a context of its own (as Do does), not a request's that
// may be cancelled, or the lock stays taken until it expires. A Release
// made while an Extend is under way waits for that round to end, then has
// a round's bound (Expiry × TimeoutFactor) of its own.
func (k *Lock) Release(ctx context.Context) error {
	k.released.Store(true) // Until is past from now on, whatever the answer
	k.mu.Lock()            // before the bound starts, as in Extend
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, k.locker.opTimeout())
	defer cancel()
	// Sent within the validity, no node's key can have expired: one found
	// gone is the holder's own deletion sent again (go-redis re-sends a
	// command whose answer it lost), not a lock lost.
	held := !k.over && time.Now().Before(k.m.Until())
	// Whatever the answer, the holder gave the lock up: deletions that
	// were sent may have landed though their answers did not come back
	// (ErrUnavailable), and another holder may have the lock by now.
	k.over = true
	ok, err := k.m.UnlockContext(ctx)
	if ok {
		return nil
	}
	return k.locker.releaseErr(k.name, err, held)
}

// releaseNow releases k within one round, even if ctx has ended.
func (k *Lock) releaseNow(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.locker.opTimeout())
	_ = k.Release(rctx)
	cancel()
}

// run runs fn under k with a watchdog, then releases k.
func (k *Lock) run(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	runCtx, cancel := context.WithCancelCause(context.WithValue(ctx, ctxKey{}, k))
	// The watchdog's finding is kept apart from runCtx's cause: once ctx
	// was cancelled (a caller that gave up while fn went on), cancelling
	// runCtx again records nothing, and the loss would go unreported.
	var found atomic.Pointer[error]
	stop := k.watch(func(cause error) {
		found.CompareAndSwap(nil, &cause)
		cancel(cause)
	})
	var returnedAt time.Time
	defer func() {
		stop()
		// Final now: the watchdog no longer extends the lock.
		until := k.Until()
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), k.locker.opTimeout())
		rerr := k.Release(rctx)
		rcancel()
		if returnedAt.IsZero() {
			return // panic or Goexit: goes on unchanged
		}
		var lost error
		switch f := found.Load(); {
		case f != nil:
			lost = *f
		case !returnedAt.Before(until):
			// fn returned after the validity ran out, before the
			// watchdog's deadline had fired (or was heard).
			lost = fmt.Errorf("%w: lock %q: validity ran out before the lock could be extended", ErrLost, k.name)
		case errors.Is(rerr, ErrLost):
			lost = rerr
		}
		if lost != nil && !errors.Is(err, ErrLost) {
			err = errors.Join(err, lost)
		}
	}()
	err = fn(runCtx)
	returnedAt = time.Now()
	return err
}

// watch extends k until stop is called, and cancels with cause ErrLost
// when an extension finds the lock lost or the lock's validity runs out
// before an extension succeeds. The validity deadline fires on time even
// while an extension is under way. stop waits for the watchdog to end and
// may be called more than once.
//
// An extension starts Expiry/3 after the round that gave the lock its
// validity (the acquisition or the last extension) began, reckoned from
// the lock's Until, not from when watch starts: the fence rounds between
// acquisition and fn (each up to Expiry*TimeoutFactor) have used some of
// the validity already. After a failed one (ErrUnavailable), the next
// starts Expiry/3 after it did.
func (k *Lock) watch(cancel context.CancelCauseFunc) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	expired := make(chan struct{})
	until := k.Until()
	deadline := time.AfterFunc(time.Until(until), func() {
		cancel(fmt.Errorf("%w: lock %q: validity ran out before the lock could be extended", ErrLost, k.name))
		close(expired)
	})
	go func() {
		defer close(done)
		defer deadline.Stop()
		expiry := k.locker.opts.Expiry
		// Until is the round's start + Expiry - the drift allowance.
		lead := 2*expiry/3 - time.Duration(int64(float64(expiry)*k.locker.opts.DriftFactor))
		next := time.NewTimer(max(0, time.Until(until)-lead))
		defer next.Stop()
		for {
			select {
			case <-quit:
				return
			case <-expired:
				return
			case <-next.C:
			}
			at := time.Now()
			err := k.Extend(context.Background())
			switch {
			case err == nil:
				if !deadline.Stop() {
					return // validity ran out before the extension landed
				}
				until := k.Until()
				deadline.Reset(time.Until(until))
				next.Reset(max(0, time.Until(until)-lead))
			case errors.Is(err, ErrLost):
				if deadline.Stop() {
					cancel(err)
				}
				return
			default:
				// ErrUnavailable: try again Expiry/3 after this attempt
				// began; the deadline cancels if none succeeds in time.
				next.Reset(max(0, expiry/3-time.Since(at)))
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}
