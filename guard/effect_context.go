package guard

import (
	"context"
	"sync"
	"time"
)

// effectCtx is an effect's context: a child of parent that ends with
// parent's cancellation and when its owner ends it (end), with a cause.
// It behaves as a context.WithCancelCause of parent, which it makes only
// when asked for its Done channel (real): an effect that never waits on
// it (a short one, or one that only checks Err) costs no context and no
// registration with parent, which a parent shared by many callers (a
// consumer's, a server's) serialises. A keepalive holds one for its run's
// effect, a batch's heartbeat one for each of its leases.
//
// Its fields are guarded by mu, the owner's lock, which the methods
// ending in Locked (and end) expect held.
type effectCtx struct {
	mu     *sync.Mutex
	parent context.Context
	// real backs the context once made, cancel ends it.
	real   context.Context
	cancel context.CancelCauseFunc
	// err and cause: why the context ended (its Err and context.Cause),
	// once it has; they never change after that.
	err, cause error
}

// Deadline is parent's, as a context.WithCancelCause's is.
func (c *effectCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Done returns the channel of real, made now if need be.
func (c *effectCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.realLocked().Done()
}

// Err reports the end of the effect's context, or parent's cancellation
// at once; once non-nil it never changes.
func (c *effectCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// Value is parent's, but for the context package's own key (which
// context.Cause and derived contexts ask for): once the context is backed
// by real, or has ended, every key is real's, so context.Cause finds the
// cause. A live context not yet backed answers parent's values; the
// context package asks for its key only after Done (derived contexts) or
// once Err is non-nil (context.Cause), and both back it.
func (c *effectCtx) Value(key any) any {
	c.mu.Lock()
	if c.real == nil && c.errLocked() == nil {
		c.mu.Unlock()
		return c.parent.Value(key)
	}
	real := c.realLocked()
	c.mu.Unlock()
	return real.Value(key)
}

func (c *effectCtx) String() string { return "idemguard effect" }

// errLocked is the context's Err, and records its cause once it has
// ended.
func (c *effectCtx) errLocked() error {
	if c.err != nil {
		return c.err
	}
	from := c.parent
	if c.real != nil {
		from = c.real
	}
	if err := from.Err(); err != nil {
		c.err, c.cause = err, context.Cause(from)
	}
	return c.err
}

// realLocked backs the context by a context.WithCancelCause of parent, if
// it is not yet, and returns it. A context that has ended already gets
// one ended with the same cause (made from parent's values alone, so that
// parent's later cancellation does not change it).
func (c *effectCtx) realLocked() context.Context {
	if c.real != nil {
		return c.real
	}
	if c.errLocked() != nil {
		c.real, c.cancel = context.WithCancelCause(context.WithoutCancel(c.parent))
		c.cancel(c.cause)
		return c.real
	}
	c.real, c.cancel = context.WithCancelCause(c.parent)
	return c.real
}

// end ends the context with cause (nil: context.Canceled), unless it has
// ended already (parent's cancellation counts first, as it would for a
// context.WithCancelCause of parent). mu is held.
func (c *effectCtx) end(cause error) {
	if c.errLocked() != nil {
		return
	}
	if c.cancel != nil {
		c.cancel(cause)
		c.errLocked()
		return
	}
	if cause == nil {
		cause = context.Canceled
	}
	c.err, c.cause = context.Canceled, cause
}
