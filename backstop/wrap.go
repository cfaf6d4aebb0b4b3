package backstop

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// Wrap returns a guard.Store that is primary (Redis) with b as its safety
// net. (It wraps a Store; lock.Guarded, by contrast, wraps a guard.Func.)
// When primary lets a holder acquire a key, the store consults the
// backstop in the same call:
//
//   - the key's effect was committed (primary lost its record): the claim
//     becomes a Replay of the result stored in PostgreSQL, and the primary
//     record is completed with it, so later replays come from primary;
//   - the key was used with another fingerprint: Mismatch, and the primary
//     claim is released;
//   - primary reports the key exhausted but its effect was committed (the
//     last holder died after its commit): Replay of the stored result;
//     not committed: Exhausted, and the last holder's mark, its lease
//     over, is failed first, so that holder (paused past its lease) can
//     no longer commit after the key was given up: ErrStaleFence;
//   - another holder's mark is still within its lease (primary lost the
//     record of a holder that may still be running, or a pgstore.Store on
//     the same tables, say a fallback's secondary, holds the key):
//     InProgress, with the time its lease has left, and the primary claim
//     is released; the mark's lease follows the holder's Extend, and ends
//     with its Fail or Release;
//   - otherwise the holder is marked in PostgreSQL with a fence above every
//     fence seen for the key, and that fence is the lease's. A holder whose
//     lease another holder recovered then fails Commit with ErrStaleFence
//     instead of committing twice.
//
// If the backstop cannot be reached the claim is released and the error
// (wrapping guard.ErrUnavailable) returned: fail closed. So is a key
// primary reports exhausted, whose effect may have been committed. Under
// a fallback.Store (the order the package documentations describe:
// fallback.New(backstop.Wrap(redisStore, b), …)), that error is the
// primary's unavailability, though Redis answers: it counts against the
// breaker, whose open state then refuses every claim (FailClosed), a key
// Redis holds completed included, for OpenTimeout, or lets effects run
// unguarded (FailOpen), their Backstop.Commit keeping each key's row
// single. A claim Redis answers from a completed record needs no
// PostgreSQL while the breaker is closed.
// Complete, Fail, Release and Extend go to primary; a Fail or Release
// also ends the holder's lease on its mark (even when primary answers
// ErrLeaseLost or cannot be reached: the holder runs nothing any more),
// a Release of a first attempt that primary took undoes the
// mark, so the key is as if never claimed (unless a step of
// the key committed its row: its effect happened, and the mark stays, as
// primary keeps the record), and an Extend also extends the holder's
// mark, so the mark lasts for the holder's lease and the backstop's TTL
// after it (an Extend whose mark PostgreSQL did not extend answers
// guard.ErrUnavailable, so its holder does not run past the mark's
// lease). A holder that completes without committing a row leaves its
// mark's lease to run out: should primary lose the record meanwhile, the
// key answers InProgress until then.
// Get reads primary and, when it has no record, PostgreSQL: the key's
// committed row (a completed record with its result, fingerprint and fence), or else a
// holder's mark whose lease is live (a pending record with the lease it
// has left, LeaseLeft; every claim is told InProgress until then), so
// that guard.Wait reads, rather than claims, until that holder commits,
// fails or its lease runs out.
//
// A write to primary that ends a claim is never given up at the first
// failure: the store's own (teaching primary a committed result, releasing
// a claim it refuses) and the holder's Complete, Fail and Release are
// retried while primary cannot be reached, for up to 2 s (a restarted
// Redis is answered within a second), so a claim primary just granted is
// not left pending for a whole lease, during which every retry would be
// told the key is in progress though the backstop holds its answer. When
// teaching primary still fails, its claim is released if it can be.
//
// The store Wrap returns is a guard.StepStore when primary is one:
// steps are kept in primary (guard.KeepsSteps answers as for primary), and a step that writes to the database
// commits its own row with Backstop.Step (or CommitStep). It is a
// guard.BatchStore when primary is one: a batch's claims and writes go to
// primary in its round trips, and each key gets the checks above as its
// own call would (up to 16 keys at once).
//
// Effects run under a wrapped store must Commit their row with b (see
// Backstop.Func, and httpx.CommitResponse for HTTP handlers, which commits
// the response the client receives); the lease's fence may differ from
// primary's own record.
//
// The store is not a guard.DeadlineStore, whatever primary is: a claim
// it must undo, and the result it teaches primary, are written past the
// caller's deadline on purpose, and database/sql drivers differ in how
// they honour one. A fallback.Store over it therefore bounds each call on
// a goroutine of its own.
//
// Wrap panics when primary or b is nil (a programmer error).
func Wrap(primary guard.Store, b *Backstop) guard.Store {
	if primary == nil || b == nil {
		panic("backstop.Wrap: nil primary store or backstop")
	}
	w := &wrappedStore{primary: primary, b: b}
	ss, steps := primary.(guard.StepStore)
	bs, batches := primary.(guard.BatchStore)
	switch {
	case steps && batches:
		return &wrappedStepsBatches{w, stepsOf{ss}, batchesOf{w, bs}} // wrap_steps.go, wrap_batch.go
	case steps:
		return &wrappedSteps{w, stepsOf{ss}}
	case batches:
		return &wrappedBatches{w, batchesOf{w, bs}}
	}
	return w
}

type wrappedStore struct {
	primary guard.Store
	b       *Backstop
}

// Unwrap returns primary, which keeps the records: the adapters see
// through Wrap to it, so a fallback.Store as primary still sets the
// Retry-After of a 503 while its breaker is open, and a Guard on Wrap's
// store nested in one on primary (or the other way round) knows the
// outer claim of its key.
func (g *wrappedStore) Unwrap() guard.Store { return g.primary }

func (g *wrappedStore) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := g.primary.Claim(ctx, req)
	if err != nil {
		return out, err
	}
	return g.claimed(ctx, req, out)
}

// claimed is the answer to req once primary answered out: the backstop's
// checks of the claim (Wrap's doc).
func (g *wrappedStore) claimed(ctx context.Context, req guard.ClaimRequest, out guard.Outcome) (guard.Outcome, error) {
	switch out.Status {
	case guard.Acquired:
	case guard.Exhausted:
		// The last holder may have committed and died before completing:
		// then the effect happened, and its result is the answer.
		// Without the backstop's answer that is unknown, and Exhausted is
		// final (a consumer dead-letters the message): fail closed. First
		// that holder's mark is failed, so that it cannot commit after
		// this answer (paused past its lease, it may yet wake); a commit
		// before it is found by the lookup.
		// Its errors hold no claim to release (an Exhausted answer
		// grants none): undoneErr, as a failed mark's.
		if err := g.b.exhaust(ctx, req.Key); err != nil {
			return guard.Outcome{}, undoneErr{fmt.Errorf("backstop: %w", err)}
		}
		// A row another payload committed (an unguarded effect's, on an
		// expired mark) is that payload's result, not this one's.
		result, same, found, lerr := g.b.lookupAs(ctx, req.Key, req.Fingerprint)
		switch {
		case lerr != nil:
			return guard.Outcome{}, undoneErr{fmt.Errorf("backstop: %w", lerr)}
		case found && same:
			return guard.Outcome{Status: guard.Replay, Result: result}, nil
		case found:
			return guard.Outcome{Status: guard.Mismatch}, nil
		}
		return out, nil
	default:
		return out, nil
	}
	m, err := g.b.mark(ctx, req, out.Lease)
	if err != nil {
		// The mark may have committed though its reply never came (the
		// context ended, the connection died after the COMMIT): undo it
		// too, or the orphaned mark would refuse other payloads as a
		// mismatch for its whole retention.
		g.undo(ctx, out.Lease, true)
		return guard.Outcome{}, undoneErr{fmt.Errorf("backstop: %w", err)}
	}
	switch {
	case m.mismatch:
		g.undo(ctx, out.Lease, false)
		return guard.Outcome{Status: guard.Mismatch}, nil
	case m.leaseLeft > 0:
		// Another holder's lease is live in PostgreSQL (primary lost its
		// record, or a pgstore.Store on the same tables holds the key):
		// it may still be running its effect.
		g.undo(ctx, out.Lease, false)
		return guard.Outcome{Status: guard.InProgress, LeaseLeft: m.leaseLeft}, nil
	case m.committed:
		// Primary forgot a key whose effect is committed: teach it again.
		// The replay is right either way; what matters is that the claim
		// primary just granted does not stay pending for a lease, so if
		// it cannot be completed it is released, and the next claim asks
		// the backstop again.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(req.Lease, time.Second))
		err := adapter.Settle(wctx, adapter.SettleBudget, func(wctx context.Context) error { return g.primary.Complete(wctx, out.Lease, m.result, req.TTL) })
		if errors.Is(err, guard.ErrUnavailable) {
			_ = g.primary.Release(wctx, out.Lease)
		}
		cancel()
		return guard.Outcome{Status: guard.Replay, Result: m.result}, nil
	}
	out.Lease.Fence = m.fence
	return out, nil
}

// undo releases a primary claim that must not stand, even if ctx ended.
// With unmark, it then also undoes the holder's mark, as Release does for
// a first attempt, in one try bounded by unmarkTimeout (PostgreSQL may be
// the reason the claim failed, and every claim fails so while it cannot
// be reached: retries would hold each for seconds): a mark whose reply
// was lost is then gone, and if it cannot be, it refuses other payloads
// until it expires.
func (g *wrappedStore) undo(ctx context.Context, l guard.Lease, unmark bool) {
	bg := context.WithoutCancel(ctx)
	rctx, cancel := context.WithTimeout(bg, 5*time.Second)
	err := adapter.Settle(rctx, adapter.SettleBudget, func(ctx context.Context) error { return g.primary.Release(ctx, l) })
	cancel()
	if err == nil && unmark {
		uctx, cancel := context.WithTimeout(bg, unmarkTimeout)
		_ = g.b.unmark(uctx, l, true, false)
		cancel()
	}
}

// unmarkTimeout bounds a try to end a holder's lease on its mark, and
// unmarkBudget the tries together.
const (
	unmarkTimeout = 2 * time.Second
	unmarkBudget  = 2 * unmarkTimeout
)

// Complete, Fail and Release retry the primary while it cannot be reached
// (adapter.Settle, within adapter.SettleBudget): a claim left pending
// strands its key for a whole lease (every retry meanwhile is told it is
// in progress), though the backstop could answer it at once.
func (g *wrappedStore) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	return adapter.Settle(ctx, adapter.SettleBudget, func(ctx context.Context) error { return g.primary.Complete(ctx, lease, result, ttl) })
}

// Fail also ends the holder's lease on its mark, so the next attempt need
// not wait for it (retried for a few seconds while PostgreSQL cannot take
// it; if it still cannot, the next attempt is told the key is in progress
// until the lease would have ended; the failure stands). So it does when primary answers ErrLeaseLost (it lost
// the holder's record, say), or cannot be reached (should it come back
// empty, its next claim is not told the key is in progress): the holder
// runs nothing any more.
func (g *wrappedStore) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	err := adapter.Settle(ctx, adapter.SettleBudget, func(ctx context.Context) error { return g.primary.Fail(ctx, lease, reason, ttl) })
	if holderDone(err) {
		g.unmark(ctx, lease, false, true)
	}
	return err
}

// Release also ends the holder's lease on its mark, and undoes the mark
// when it released a first attempt, which the primary then forgets: a key
// released before any effect is as if never claimed, and a request with
// another payload may take it. (The write is retried for a few seconds
// while PostgreSQL cannot take it; if it still cannot, the mark stays
// until it expires and refuses other payloads as a mismatch
// meanwhile, and the next claim is told the key is in progress until the
// lease would have ended; the release stands.) So it does when primary
// answers ErrLeaseLost or cannot be reached, but then the mark stays:
// primary did not forget the key for this release.
func (g *wrappedStore) Release(ctx context.Context, lease guard.Lease) error {
	err := adapter.Settle(ctx, adapter.SettleBudget, func(ctx context.Context) error { return g.primary.Release(ctx, lease) })
	if holderDone(err) {
		g.unmark(ctx, lease, err == nil && g.forgot(ctx, lease.Key), false)
	}
	return err
}

// forgot reports whether primary forgot key, as it does when a first
// attempt is released before any effect. One it kept (failed, with the
// steps it recorded: a step's effect happened, though no backstop row of
// it exists) keeps its mark too, or another payload could take the key
// once primary lost it. Told nothing (primary unreachable, or another
// claim already made), the mark is kept: it only refuses other payloads
// until it expires.
func (g *wrappedStore) forgot(ctx context.Context, key guard.Key) bool {
	_, err := g.primary.Get(ctx, key)
	return errors.Is(err, guard.ErrNotFound)
}

// holderDone reports whether a holder's Fail or Release that primary
// answered with err ends its lease on its mark: when primary took it;
// when primary answered ErrLeaseLost, having lost the holder's record
// (Redis forgot the key while the holder ran: the mark, which still bears
// the holder's token, is the only trace of its lease) or given the key to
// another holder (whose mark, once made, bears another token, which
// unmark leaves alone); and when primary could not be reached (should it
// come back empty, its next claim must not be told the key is in
// progress). Either way the holder runs nothing any more, and a mark left
// leased would answer every claim of the key InProgress for the rest of a
// lease nobody holds.
func holderDone(err error) bool {
	return err == nil || errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, guard.ErrUnavailable)
}

// unmark ends the holder's lease on its mark (and with forget, undoes
// the mark of a first attempt) once primary took its Fail or Release,
// even if ctx ended: the write to primary stands either way. It is
// retried while PostgreSQL cannot take it (a statement cut off by
// statement_timeout or an operator's cancel, a connection lost mid-
// statement, a server restarting), each try on a context of its own
// bounded by unmarkTimeout, for up to unmarkBudget, as a holder's
// completion is retried (adapter.Settle): a mark left leased answers
// every claim of the key InProgress for the rest of a lease nobody holds
// (docs/design.md, the backstop).
func (g *wrappedStore) unmark(ctx context.Context, lease guard.Lease, forget, failed bool) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unmarkBudget)
	defer cancel()
	_ = adapter.Settle(uctx, unmarkBudget, func(uctx context.Context) error {
		tctx, cancel := context.WithTimeout(uctx, unmarkTimeout)
		defer cancel()
		return g.b.unmark(tctx, lease, forget, failed)
	})
}

// Extend extends the lease in primary and then, once that succeeded, the
// holder's mark in PostgreSQL, so the mark outlives the lease by the
// backstop's TTL however long the holder keeps the key: otherwise, after
// Redis forgot the key, another payload could take it from a holder still
// running. The mark's extension is one try bounded by markExtendTimeout
// and half of what is left of ctx (a holder's keepalive must have its
// answer before the old lease ends). If it fails, Extend returns an error
// wrapping guard.ErrUnavailable though primary extended the lease: the
// mark keeps the lease it had, and a holder told its lease was extended
// would run past the mark's, when a claim of the key after Redis lost it
// is no longer kept out. Told unavailable, guard's keepalive tries again
// while its lease lasts, and ends the holder's run at the lease's deadline
// if the mark was never extended (the holder's commit needs PostgreSQL
// too). A mark that is gone or committed, or whose lease the holder's
// Fail or Release ended, is not an error (and is not extended); one that bears
// another holder's token (which took the key over in PostgreSQL once this
// mark's lease lapsed) is guard.ErrLeaseLost.
func (g *wrappedStore) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	if err := g.primary.Extend(ctx, lease, d); err != nil {
		return err
	}
	return g.extendMark(ctx, lease, d)
}

// extendMark is Extend's extension of the holder's mark, once primary
// extended its lease by d.
func (g *wrappedStore) extendMark(ctx context.Context, lease guard.Lease, d time.Duration) error {
	bound := markExtendTimeout
	if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(dl)/2)
	}
	if bound <= 0 {
		return fmt.Errorf("%w: backstop: no time left to extend the holder's mark of %s", guard.ErrUnavailable, lease.Key)
	}
	mctx, cancel := context.WithTimeout(ctx, bound)
	err := g.b.extendMark(mctx, lease, d)
	cancel()
	if errors.Is(err, guard.ErrLeaseLost) {
		return err // another holder took the key over in PostgreSQL: stop
	}
	if err != nil && !errors.Is(err, guard.ErrUnavailable) {
		// Whatever kept the mark from being extended, the lease on it was not.
		err = fmt.Errorf("%w: %w", guard.ErrUnavailable, err)
	}
	if err != nil {
		return fmt.Errorf("backstop: the lease was extended, its holder's mark was not: %w", err)
	}
	return nil
}

// markExtendTimeout bounds Extend's try to extend the holder's mark.
const markExtendTimeout = time.Second

func (g *wrappedStore) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	rec, err := g.primary.Get(ctx, key)
	if !errors.Is(err, guard.ErrNotFound) {
		return rec, err
	}
	brec, found, lerr := g.b.peek(ctx, key)
	if lerr != nil {
		return guard.Record{}, fmt.Errorf("backstop: %w", lerr)
	}
	if !found {
		return guard.Record{}, err
	}
	return brec, nil
}

// undoneErr is the error of a claim that holds nothing to release: one
// whose mark failed and which Wrap has undone, or an Exhausted key's. The
// guard must not take it for a claim whose answer was lost and release
// it (that release would retry the mark's undo for seconds, on a database
// that does not answer). It matches what the error it wraps matches among
// the guard's sentinels and the context's errors, and hides the rest (a
// connection reset, an EOF) from errors.Is and errors.As.
type undoneErr struct{ err error }

func (e undoneErr) Error() string { return e.err.Error() }

func (e undoneErr) Is(target error) bool {
	for _, s := range []error{guard.ErrUnavailable, guard.ErrCorrupt, context.Canceled, context.DeadlineExceeded} {
		if target == s {
			return errors.Is(e.err, s)
		}
	}
	return false
}
