package guard

import "context"

// Held is a claim whose holder runs the effect itself, from Hold (or
// Keep) until Complete, Fail or Release ends it: Claim, KeepAlive and the
// write that ends the claim in one piece, kept by the guard's claim
// queue (and, for a run past a third of the lease, one timer) where those
// three calls take three timers. Adapters that answer replays and conflicts
// before they run a handler use it (httpx, grpcx). Get one from Hold or
// Keep. Its methods are safe for concurrent use, but one caller should
// end the claim: a Stop, or another write, that ends while a write is
// under way cuts that write off, which then reports ErrUnavailable
// whether or not it reached the store.
type Held keepalive

// Hold claims key as Claim does and, when the claim is Acquired, keeps
// the lease alive (extended every Lease/3) until the claim ends: held is
// non-nil exactly when out.Status is Acquired and err is nil. The other
// outcomes come back as Claim's do. Unlike Claim's, the claim is not cut
// short when ctx is cancelled, since an answer nobody hears would hold
// the key for a whole lease; it is bounded by the lease's first deadline,
// as Claim's is. held's Context is a child of ctx.
func (g *Guard) Hold(ctx context.Context, key Key, fingerprint string) (out Outcome, held *Held, err error) {
	return g.HoldWith(ctx, key, fingerprint, CallOptions{})
}

// HoldWith is Hold with call options: the same guarantees, with opts in
// force for this claim in place of the guard's Options.
func (g *Guard) HoldWith(ctx context.Context, key Key, fingerprint string, opts CallOptions) (out Outcome, held *Held, err error) {
	k, out, err := g.keptClaim(ctx, key, fingerprint, opts, true)
	return out, (*Held)(k), err
}

// Keep holds a lease that Claim or Wait acquired, as Hold holds its own:
// the heartbeat starts now, and the deadline in force is lease.Deadline
// (as Claim set it; a Lease without one, built by hand, is taken as
// claimed now). If that deadline has passed, Context is cancelled at once
// with a cause matching ErrLeaseLost; the writes may still be tried.
// KeepAlive is Keep's Context and Stop.
func (g *Guard) Keep(ctx context.Context, lease Lease) *Held {
	return (*Held)(g.keep(ctx, lease))
}

// Lease returns the lease held: the fence for downstream writes, and what
// Step records under.
func (h *Held) Lease() Lease { return h.lease }

// Context returns the effect's context, a child of the context given to
// Hold or Keep. It is cancelled with a cause matching ErrLeaseLost at the
// lease's deadline unless an extension succeeded in time, as soon as the
// lease is found lost, and at Options.MaxRun (the cause then matches
// ErrMaxRun too); and when the claim ends (Complete, Fail, Release,
// Stop).
func (h *Held) Context() context.Context { return h.ctx }

// Complete stores result for the holder and ends the claim, with the
// guarantees of Guard.Complete: the heartbeat ends, the write is made even
// if the context given to Hold was cancelled, for at most max(Lease, 1s),
// and Context ends when it returns. ErrLeaseLost means another holder
// took the key over and the result was not stored; after an error
// matching ErrUnavailable Complete may be called again.
func (h *Held) Complete(result []byte) error {
	k := (*keepalive)(h)
	defer k.stop()
	wctx := k.detach()
	return k.g.complete(k.parent, wctx, k.lease, result, k.lossObserved())
}

// Fail records the holder's attempt as failed with cause and ends the
// claim, with the guarantees of Guard.Fail and the bound of Complete;
// Context ends before the write is sent (the key is free for another
// claim as soon as the store has it).
func (h *Held) Fail(cause error) error {
	k := (*keepalive)(h)
	defer k.stop()
	wctx := k.detachFreeing()
	return k.g.fail(k.parent, wctx, k.lease, cause, k.lossObserved())
}

// Release undoes the holder's claim, as if it had never been made, with
// the guarantees of Guard.Release and the bound of Complete; Context ends
// before the write is sent, as for Fail.
func (h *Held) Release() error {
	k := (*keepalive)(h)
	defer k.stop()
	wctx := k.detachFreeing()
	return k.g.release(k.parent, wctx, k.lease, k.lossObserved())
}

// Stop ends the heartbeat and Context without a write: the claim then
// ends when its lease runs out. An extension under way is told to give
// up and not waited for; its answer changes nothing.
// Complete, Fail and Release stop it too; Stop may be called more than
// once, and a write may still follow it.
func (h *Held) Stop() { (*keepalive)(h).stop() }
