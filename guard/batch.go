package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"
)

// BatchItem is one key of a DoBatch: the key and the fingerprint Do would
// take.
type BatchItem struct {
	Key         Key
	Fingerprint string
}

// BatchFunc is the effect DoBatch runs for items[i], under lease. Its
// context is as Func's: it ends, with a cause matching ErrLeaseLost, at
// that lease's own deadline unless the lease was extended in time, when
// that lease alone is found lost, and at MaxRun counted from when this
// effect started (the cause then matches ErrMaxRun too); it also ends
// with DoBatch's ctx. Effects of one batch may run at once (see
// BatchOptions.Concurrency): fn must be safe for that. lease records
// steps (Step) as Do's does, and a later attempt of the key resumes after
// them.
type BatchFunc func(ctx context.Context, i int, lease Lease) ([]byte, error)

// BatchOptions configure one DoBatch. The zero value runs the effects one
// at a time, in the order of the items, each whatever the others did.
type BatchOptions struct {
	// Concurrency is how many effects run at once. Zero, negative or 1:
	// one at a time, in the order of the items.
	Concurrency int
	// Ordered runs the effects one at a time, in the order of the items
	// (Concurrency is then 1), and stops at the first item that neither
	// succeeds nor replays: an invalid key, a claim answered otherwise
	// (in progress, mismatch, exhausted, unavailable), an effect that
	// returns an error or panics, a lease lost before its effect began.
	// No later item's effect runs: a later item whose key was claimed is
	// released, as if never claimed, and reports ErrSkipped; the others
	// report what their claim answered. For consumers that must keep the
	// order of a partition.
	Ordered bool
	// CallOptions change the guard's Options for every claim of the
	// batch, as for DoWith. The zero value keeps the guard's.
	CallOptions
}

// BatchResult is DoBatch's answer for one item: what Do would have
// returned for it.
type BatchResult struct {
	Result
	Err error
}

var (
	// ErrPanicked: the item's effect panicked (or, run concurrently with
	// others, called runtime.Goexit). DoBatch released its claim, as Do
	// does, and reports it as the item's error, a *PanicError, instead
	// of panicking: the other items of the batch still end as they should.
	ErrPanicked = errors.New("idemguard: effect panicked")
	// ErrSkipped: an Ordered batch stopped before the item, whose effect
	// did not run; its claim, if it was made, was released.
	ErrSkipped = errors.New("idemguard: not run: an earlier item of the ordered batch did not succeed")
)

// PanicError is the error of a DoBatch item whose effect panicked. It
// matches ErrPanicked, and unwraps to the panic's value when that is an
// error.
type PanicError struct {
	Key   Key
	Value any    // what the effect panicked with; errGoexit for runtime.Goexit
	Stack []byte // the effect's goroutine's stack when it panicked
}

var errGoexit = errors.New("runtime.Goexit called")

func (e *PanicError) Error() string {
	return fmt.Sprintf("%s: %s: %v (claim released)", ErrPanicked, e.Key, e.Value)
}

// Is makes errors.Is(err, ErrPanicked) true.
func (e *PanicError) Is(target error) bool { return target == ErrPanicked }

// Unwrap returns the panic's value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// DoBatch runs fn once for each of items, as Do does for each key: the
// same claims, replays, leases, fencing, failures and releases, with one
// answer per item, and no item's answer depends on another's effect (see
// BatchOptions.Ordered for the exception callers ask for). What it saves
// is round trips: on a BatchStore (RedisStore is one) the claims of the
// batch go out together (RedisStore: one pipeline, and a second only for
// keys that need the claim script: another holder's, failed or released
// ones), the leases are extended together, and the completions, failures
// and releases go out together once every effect has returned. A store
// without batches gets its own per-key calls, up to 16 at once; one of
// them that panics panics DoBatch on the caller's goroutine, as a store's
// panic panics Do.
//
// No claim is sent once ctx has ended, as in Do: each item whose claim
// was not sent (all of them, if ctx ended before the call; those of the
// later rounds of a repeated key, below, if it ended during an earlier
// round) reports ctx's cause. Claims already sent when ctx ends are
// waited for (up to the lease's first deadline), and the keys they took
// released: a cancelled batch leaves no key pending. Each acquired item's
// effect runs under its own lease and context (see BatchFunc); up to
// opts.Concurrency at once. The leases of items waiting for their turn,
// and of items whose effect has returned, are extended with the others
// until the batch's writes end them; an item whose lease was lost, or
// whose turn came after ctx ended, does not run: its claim is released
// and its error says why (the lease's cause, or ctx's).
//
// An item's effect that panics has its claim released, as in Do, but the
// panic does not go on: the item's error is a *PanicError (ErrPanicked)
// with the value and the stack, and the other items end normally.
// Re-panic with PanicError.Value to crash as Do would. Effects run one at
// a time run on the caller's goroutine: one that calls runtime.Goexit
// (t.FailNow, say) ends it as it would end Do's caller, after the claims
// of the items claimed with it are ended (the effects that returned
// completed or failed, the others released); run concurrently, it ends
// only its own goroutine and its item reports a *PanicError.
//
// A key that appears more than once in items is claimed again only after
// the batch's earlier occurrence has ended (completed, failed or
// released): the items are split, in order, into runs of distinct keys,
// each a round of claims, effects and writes. The results are in the
// order of items. A nil fn is a programmer's error: DoBatch panics
// before it claims any key.
func (g *Guard) DoBatch(ctx context.Context, items []BatchItem, fn BatchFunc, opts BatchOptions) []BatchResult {
	if fn == nil {
		panic("guard.DoBatch: nil BatchFunc")
	}
	res := make([]BatchResult, len(items))
	r := &batchRun{g: g, bs: batchStoreOf(g.store), ctx: ctx, items: items, fn: fn, res: res,
		conc: max(opts.Concurrency, 1), ordered: opts.Ordered, maxAttempts: opts.maxAttempts(g.opts.MaxAttempts)}
	if r.ordered {
		r.conc = 1
	}
	n := len(items)
	for i := range items {
		if err := items[i].Key.Validate(); err != nil {
			res[i].Err = err
			if r.ordered {
				n = i // the batch stops at the first invalid key
				for j := i + 1; j < len(items); j++ {
					res[j].Err = skipped(items[j].Key)
				}
				break
			}
		}
	}
	for start := 0; start < n; {
		if r.ctx.Err() != nil {
			// As Do's claim, none is sent once ctx has ended: nothing to
			// wait for, release or observe.
			for i := start; i < n; i++ {
				if res[i].Err == nil {
					res[i].Err = fmt.Errorf("claim %s: not sent: %w", items[i].Key, context.Cause(r.ctx))
				}
			}
			break
		}
		end := distinctRun(items, start, n)
		if !r.segment(start, end) {
			for i := end; i < n; i++ {
				res[i].Err = skipped(items[i].Key)
			}
			break
		}
		start = end
	}
	return res
}

// tokenChars is the length of an owner token: rand.Text's.
const tokenChars = 26

// newTokens returns n owner tokens, each as rand.Text makes one (26
// characters of the base32 alphabet, 130 random bits), one after another
// in one string.
func newTokens(n int) string {
	b := make([]byte, n*tokenChars)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	for i := range b {
		b[i] = base32Alphabet[b[i]&31]
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

func skipped(key Key) error { return fmt.Errorf("%w: %s", ErrSkipped, key) }

// distinctRun returns the end of the run of items from start on (up to n)
// whose keys are distinct.
func distinctRun(items []BatchItem, start, n int) int {
	if n-start <= 32 {
		for j := start + 1; j < n; j++ {
			for k := start; k < j; k++ {
				if items[k].Key == items[j].Key {
					return j
				}
			}
		}
		return n
	}
	seen := make(map[Key]struct{}, n-start)
	for j := start; j < n; j++ {
		if _, dup := seen[items[j].Key]; dup {
			return j
		}
		seen[items[j].Key] = struct{}{}
	}
	return n
}

// batchRun is one DoBatch.
type batchRun struct {
	g       *Guard
	bs      BatchStore
	ctx     context.Context
	items   []BatchItem
	fn      BatchFunc
	res     []BatchResult
	conc    int
	ordered bool
	// maxAttempts is the attempt limit each claim sends (0: none).
	maxAttempts int
	// exited: an effect run on the caller's goroutine called
	// runtime.Goexit, which is ending that goroutine.
	exited bool
}

// ends appends the writes that end the claims of runs: a completion, a
// failure, or a release (an effect that was rejected, did not run, or did
// not return).
func (r *batchRun) ends(writes []Write, runs []ran) []Write {
	for _, x := range runs {
		x.lease.steps.end()
		w := Write{Lease: *x.lease}
		switch {
		case x.stopped, !x.returned, errors.Is(x.err, ErrRejected):
			w.Kind = WriteRelease
		case x.err != nil:
			w.Kind, w.Reason, w.TTL = WriteFail, x.err.Error(), r.g.opts.TTL
		default:
			w.Kind, w.Result, w.TTL = WriteComplete, x.value, r.g.opts.TTL
		}
		writes = append(writes, w)
	}
	return writes
}

// abandon ends the claims of a segment whose caller's goroutine is ending
// (runtime.Goexit in an effect run on it), as they would have ended: the
// effects that returned are completed or failed, the others released, as
// Do releases its claim then. Nobody hears the results.
func (r *batchRun) abandon(k *keepalive, b *beat, runs []ran, writes []Write) {
	b.halt()
	first := len(writes)
	writes = r.ends(writes, runs)
	b.endFreeing(writes[first:])
	wctx := k.detach()
	for j, err := range r.bs.WriteBatch(wctx, writes) {
		// A run whose lost lease the heartbeat observed is not observed
		// lost again by the write that ends it (as in segment).
		r.g.wrote(r.ctx, &writes[j], bounded(wctx, err), j >= first && b.lossObserved(j-first))
	}
	b.stop()
	k.stop()
}

// ran is how one acquired item's turn ended.
type ran struct {
	item     int    // index into items
	lease    *Lease // its lease: in the segment's claim outcomes
	value    []byte
	err      error
	returned bool // fn returned (value, err)
	stopped  bool // not run, or panicked: release the claim
}

// segment claims, runs and ends items[start:end], whose keys are distinct;
// it reports false when an Ordered batch stopped in it.
func (r *batchRun) segment(start, end int) bool {
	g := r.g
	reqs := make([]ClaimRequest, 0, end-start)
	pos := make([]int, 0, end-start)
	for i := start; i < end; i++ {
		if r.res[i].Err != nil { // invalid key (not Ordered)
			continue
		}
		// As Guard.request, with the tokens made below, all at once.
		reqs = append(reqs, ClaimRequest{Key: r.items[i].Key, Fingerprint: r.items[i].Fingerprint,
			Lease: g.opts.Lease, TTL: g.opts.TTL, MaxAttempts: r.maxAttempts})
		pos = append(pos, i)
	}
	if len(reqs) == 0 {
		return true
	}
	toks := newTokens(len(reqs))
	for j := range reqs {
		reqs[j].Token = toks[j*tokenChars : (j+1)*tokenChars]
	}

	// One keepalive bounds the claims (and later the writes), as in Do;
	// unlike Do's, the claims' context does not end with ctx: once sent,
	// their answers are waited for (up to the lease's first deadline), so
	// that a batch cancelled meanwhile releases every key it took instead
	// of leaving them pending until their leases run out. Nor does the
	// context report ctx's deadline (detachedClaim, as Hold's): a client
	// that sets its socket deadlines from it would give up on the answers
	// at ctx's deadline all the same.
	valid := time.Now().Add(g.validity)
	k := g.newKeepalive(r.ctx, valid)
	k.detachedClaim = true
	k.claim()
	outs, errs := r.bs.ClaimBatch((*callCtx)(k), reqs)
	timedOut := k.timedOut()
	late := timedOut || !time.Now().Before(valid)
	k.halt()

	var (
		runs   = make([]ran, 0, len(reqs))
		writes = make([]Write, 0, len(reqs))
		lateAt []int   // items whose Acquired came too late, released below
		lost   []Write // releases of claims whose answers were lost (unheard)
		stop   = len(pos)
		// logs are the step logs of the acquired leases (Step), as Do's
		// keepalive holds its lease's: made with room for every claim, so
		// the leases' pointers into it stay put.
		logs []stepLog
	)
	for j := range reqs {
		i, out, err := pos[j], &outs[j], errs[j] // ran points at its lease: in outs
		if err != nil && timedOut && !errors.Is(err, ErrUnavailable) {
			err = g.claimTimedOut(err)
		}
		if err != nil && !timedOut && unheard(err) {
			lost = append(lost, Write{Kind: WriteRelease, Lease: Lease{Key: reqs[j].Key, Token: reqs[j].Token}})
		}
		if err == nil && out.Status == Acquired && late {
			// Nobody runs the effect: give the key back, attempt
			// uncounted, rather than leave it to run out.
			writes = append(writes, Write{Kind: WriteRelease, Lease: out.Lease})
			lateAt = append(lateAt, i)
			continue
		}
		err = g.claimedAt(r.ctx, &reqs[j], out, err, valid)
		switch {
		case err != nil:
			r.res[i].Err = err
			if r.ordered && stop == len(pos) {
				stop = j
			}
		case out.Status == Replay:
			r.res[i].Result = Result{Value: out.Result, Replayed: true}
		case r.ordered && j > stop:
			// After the stop: not run, given back.
			writes = append(writes, Write{Kind: WriteRelease, Lease: out.Lease})
			r.res[i].Err = skipped(out.Lease.Key)
		default:
			if logs == nil {
				logs = make([]stepLog, 0, len(reqs))
			}
			logs = append(logs, stepLog{g: g, known: out.Steps})
			out.Lease.steps = &logs[len(logs)-1]
			runs = append(runs, ran{item: i, lease: &out.Lease})
		}
	}
	if len(lost) > 0 {
		g.releaseUnheardBatch(r.ctx, r.bs, lost)
	}
	// A late answer is late for every claim of the segment: its releases
	// come first among the writes, and no ordered item runs after one.
	stopped := stop < len(pos) || r.ordered && len(lateAt) > 0

	var b *beat
	if len(runs) > 0 {
		b = g.newBeat(r.ctx, r.bs, len(runs), func(j int) *Lease { return runs[j].lease })
		for j := range logs { // logs[j] is runs[j]'s
			logs[j].holder, logs[j].item = b, j
		}
		defer func() {
			if r.exited {
				r.abandon(k, b, runs, writes)
			}
		}()
		stopped = r.runAll(b, runs) || stopped
		b.halt()
	}
	if len(runs) == 0 && len(writes) == 0 {
		k.stop()
		return !stopped
	}

	// End every claim in one batch of writes, detached from ctx as Do's.
	first := len(writes)
	writes = r.ends(writes, runs)
	if b != nil {
		b.endFreeing(writes[first:])
	}
	wctx := k.detach()
	werrs := r.bs.WriteBatch(wctx, writes)
	for j := range writes {
		werrs[j] = bounded(wctx, werrs[j])
	}
	if b != nil {
		b.stop()
	}
	k.stop()

	for j, i := range lateAt {
		w, werr := &writes[j], werrs[j]
		err := g.lateClaim(w.Lease.Key)
		if werr != nil && !errors.Is(werr, ErrLeaseLost) {
			err = fmt.Errorf("%w (releasing it: %w)", err, werr)
		}
		g.observe(r.ctx, Event{Kind: EventUnavailable, Key: w.Lease.Key, Attempt: w.Lease.Attempt, Err: err})
		r.res[i].Err = err
	}
	for j := len(lateAt); j < first; j++ { // skipped after an Ordered stop
		g.wrote(r.ctx, &writes[j], werrs[j], false)
	}
	for j, x := range runs {
		w, werr := &writes[first+j], werrs[first+j]
		res := &r.res[x.item]
		res.Result = Result{Value: x.value, Lease: *x.lease}
		werr = g.wrote(r.ctx, w, werr, b != nil && b.lossObserved(j))
		switch {
		case !x.returned:
			res.Err = x.err // the cause it did not run, or its panic
		case werr != nil && x.err != nil:
			res.Err = errors.Join(x.err, werr)
		case werr != nil:
			res.Err = werr
		default:
			res.Err = x.err
		}
	}
	return !stopped
}

// claimedAt is claimed (the answer not late) for the outcome at out,
// which it answers in place: an Acquired or a Replay without error, a
// batch's common answers, are observed as claimed observes them and cost
// no copy of the outcome (passed and returned by value, with the request,
// the copies were the most of segment's own CPU in kafkax's
// BenchmarkConsume, and segment's stack frame the largest of the batch);
// any other answer goes through claimed.
func (g *Guard) claimedAt(ctx context.Context, req *ClaimRequest, out *Outcome, err error, valid time.Time) error {
	if err == nil {
		switch out.Status {
		case Acquired:
			out.Lease.Deadline = valid
			if out.Lease.Recovered {
				g.observe(ctx, Event{Kind: EventRecovered, Key: req.Key, Attempt: out.Lease.Attempt})
			}
			g.observe(ctx, Event{Kind: EventAcquired, Key: req.Key, Attempt: out.Lease.Attempt})
			return nil
		case Replay:
			g.observe(ctx, Event{Kind: EventReplayed, Key: req.Key})
			return nil
		}
	}
	return g.claimedCopy(ctx, req, out, err, valid)
}

// claimedCopy is claimedAt's other answers: its copies of the outcome
// stay in its own stack frame, off the common path's.
//
//go:noinline
func (g *Guard) claimedCopy(ctx context.Context, req *ClaimRequest, out *Outcome, err error, valid time.Time) error {
	*out, err = g.claimed(ctx, *req, *out, err, valid, false)
	return err
}

// wrote observes a write of the batch as Complete, Fail or Release would,
// and returns its error as they do (nil when it succeeded); lossSeen: the
// batch's heartbeat already observed the write's lease lost.
func (g *Guard) wrote(ctx context.Context, w *Write, err error, lossSeen bool) error {
	l := w.Lease
	if err != nil {
		g.observeWriteErr(ctx, l, err, lossSeen)
		return fmt.Errorf("%s %s: %w", w.Kind, l.Key, err)
	}
	switch w.Kind {
	case WriteComplete:
		g.observe(ctx, Event{Kind: EventCompleted, Key: l.Key, Attempt: l.Attempt})
	case WriteFail:
		g.observe(ctx, Event{Kind: EventFailed, Key: l.Key, Attempt: l.Attempt, Err: errors.New(w.Reason)})
	case WriteRelease:
		g.observe(ctx, Event{Kind: EventReleased, Key: l.Key, Attempt: l.Attempt})
	}
	return nil
}

// runAll runs the acquired items' effects, up to r.conc at once, and
// reports whether an Ordered batch stopped. One at a time, they run on
// the caller's goroutine; more, on goroutines of their own that end with
// the batch.
func (r *batchRun) runAll(b *beat, runs []ran) (stopped bool) {
	if r.conc == 1 {
		for j := range runs {
			if stopped {
				break
			}
			x := &runs[j]
			r.runOne(b, j, x, nil)
			stopped = r.ordered && (x.err != nil || !x.returned)
		}
	} else {
		stopped = r.runWorkers(b, runs)
	}
	if stopped {
		for j := range runs {
			if x := &runs[j]; !x.returned && x.err == nil {
				x.stopped, x.err = true, skipped(x.lease.Key)
			}
		}
	}
	return stopped
}

// runWorkers runs the effects on r.conc goroutines.
func (r *batchRun) runWorkers(b *beat, runs []ran) (stopped bool) {
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	// done records how item x's turn ended.
	done := func(x *ran) {
		if r.ordered && (x.err != nil || !x.returned) {
			mu.Lock()
			stopped = true
			mu.Unlock()
		}
	}
	var worker func()
	worker = func() {
		defer wg.Done()
		for {
			mu.Lock()
			j := next
			if stopped {
				j = len(runs)
			}
			next++
			mu.Unlock()
			if j >= len(runs) {
				return
			}
			x := &runs[j]
			r.runOne(b, j, x, func() {
				// runtime.Goexit ends this goroutine with the effect:
				// another takes its place.
				done(x)
				wg.Add(1)
				go worker()
			})
			done(x)
		}
	}
	for range min(r.conc, len(runs)) {
		wg.Add(1)
		go worker()
	}
	wg.Wait()
	return stopped
}

// runOne runs item x (the j-th lease of b), unless its lease was lost or
// ctx ended before its turn. If the effect calls runtime.Goexit, runOne
// calls goexit before the goroutine ends, or, on the caller's goroutine
// (goexit nil), marks the batch exited.
func (r *batchRun) runOne(b *beat, j int, x *ran, goexit func()) {
	if err := r.ctx.Err(); err != nil {
		x.stopped, x.err = true, fmt.Errorf("%s: not run: %w", x.lease.Key, context.Cause(r.ctx))
		return
	}
	ctx, err := b.begin(j)
	if err != nil {
		x.stopped, x.err = true, fmt.Errorf("%s: not run: %w", x.lease.Key, err)
		return
	}
	defer func() {
		b.finish(j) // ended (returned or not): held until the writes
		if x.returned {
			return
		}
		p := recover()
		x.stopped, x.err = true, &PanicError{Key: x.lease.Key, Value: p, Stack: debug.Stack()}
		switch {
		case p != nil:
		case goexit != nil:
			x.err.(*PanicError).Value = errGoexit
			goexit()
		default:
			x.err.(*PanicError).Value = errGoexit
			r.exited = true
		}
	}()
	x.value, x.err = r.fn(ctx, x.item, *x.lease)
	x.returned = true
}
