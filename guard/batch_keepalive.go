package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// beat keeps the leases of one DoBatch alive: the batch's counterpart of
// keepalive's running phase, with the same rules for each lease, on one
// timer and one WriteBatch of extensions for the whole batch.
//
// Every lease was claimed by the same round trip, so they share their
// first deadline and their first extension, a third of a lease after the
// claim was sent. From then on each lease keeps a deadline of its own:
// (when the last extension that succeeded for it was sent) + Lease −
// LeaseMargin(Lease). Its effect's context, a child of the caller's, is
// cancelled with a cause matching ErrLeaseLost at that deadline, whatever
// an extension under way is doing; as soon as an extension finds that
// lease alone lost; and at MaxRun, counted from when its effect started
// (the cause then matches ErrMaxRun too) if the effect still runs then.
// Another lease of the batch is not touched by any of it. A failed or late
// extension never revives a lease. A lease whose effect has returned stays
// held, and extended, until the batch's writes end the claims: MaxRun no
// longer counts for it.
type beat struct {
	g      *Guard
	bs     BatchStore
	parent context.Context // the caller's context
	timer  *time.Timer

	mu   sync.Mutex
	idle sync.Cond // broadcast when a notification ends
	// ended: halted, the timer only ends each live lease's effect
	// context at its deadline while the batch's writes are under way.
	ended   bool
	stopped bool // the timer does nothing
	busy    bool // an extension is under way
	// notifying: how many timer callbacks are telling the Observer of
	// events, unlocked; halt waits for them, so the heartbeat's events
	// (lost leases) are observed before the batch returns (see
	// held.lossSeen).
	notifying int
	extStop   context.CancelFunc
	next      time.Time // when the next extension is due
	due       time.Time // when the timer was last set to fire
	held      []held
}

// held is one lease of the batch.
type held struct {
	lease  *Lease
	valid  time.Time // the deadline in force
	maxRun time.Time // zero until its effect starts, or with no MaxRun
	// live: still held as far as the client knows, so still extended.
	live bool
	// lossSeen: the heartbeat observed EventLeaseLost for it, so the
	// write that ends it does not observe the same loss again.
	lossSeen bool
	lastErr  error // the last failed extension's error, for the cause
	// ctx is its effect's context, a child of the caller's (guarded by
	// b.mu): it costs no context and no registration with the caller's
	// context, which the consumers of a process often share, unless the
	// effect asks for its Done channel.
	ctx effectCtx
}

// newBeat starts keeping n leases alive, lease(i) the i-th, which no one
// changes while b lives; each lease's Deadline is its first one, and each
// gets a context that is a child of parent.
func (g *Guard) newBeat(parent context.Context, bs BatchStore, n int, lease func(i int) *Lease) *beat {
	b := &beat{g: g, bs: bs, parent: parent, held: make([]held, n)}
	b.idle.L = &b.mu
	first := lease(0).Deadline
	for i := range n {
		l := lease(i)
		h := &b.held[i]
		h.lease, h.valid, h.live = l, l.Deadline, true
		h.ctx = effectCtx{mu: &b.mu, parent: parent}
		first = minTime(first, l.Deadline)
	}
	// Extend a third of a lease after the claim was sent.
	b.next = first.Add(-g.validity + g.opts.Lease/3)
	b.mu.Lock()
	now := time.Now()
	b.due = b.nextFire(now)
	b.timer = time.AfterFunc(b.due.Sub(now), b.fire)
	b.mu.Unlock()
	return b
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// begin marks the start of lease i's effect: MaxRun counts from now. It
// reports false, with the context cancelled and the cause returned, when
// the lease is no longer held or its deadline has passed: the effect must
// not run.
func (b *beat) begin(i int) (context.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := &b.held[i]
	now := time.Now()
	if h.live && !now.Before(h.valid) {
		b.lose(h, fmt.Errorf("%w: the lease's deadline %s had passed before the effect started",
			ErrLeaseLost, h.valid.Format(time.RFC3339Nano)))
	}
	if !h.live {
		h.ctx.errLocked()
		return &h.ctx, h.ctx.cause
	}
	if b.g.opts.MaxRun > 0 {
		h.maxRun = now.Add(b.g.opts.MaxRun)
		if h.maxRun.Before(b.due) {
			// The timer fires at due and sees this MaxRun then: set it
			// again only when the MaxRun comes first.
			b.arm(now)
		}
	}
	return &h.ctx, nil
}

// finish marks the end of lease i's effect: MaxRun no longer counts for
// it, and the lease is held, and extended, until the batch's writes end
// the claim (however long the batch's other effects take).
func (b *beat) finish(i int) {
	b.mu.Lock()
	b.held[i].maxRun = time.Time{}
	b.mu.Unlock()
}

// lose ends lease h: no more extensions, its context cancelled with
// cause. b.mu is held.
func (b *beat) lose(h *held, cause error) {
	h.live = false
	h.ctx.end(cause)
}

// stepLost: a step of lease i's effect found the lease lost (lossSink):
// its context ends now, and the write that ends it observes no second
// loss.
func (b *beat) stepLost(i int, err error) (observed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := &b.held[i]
	observed = h.lossSeen
	if h.live {
		b.lose(h, err)
	}
	h.lossSeen = true
	return observed
}

// lossObservedFor implements lossSink: lossObserved.
func (b *beat) lossObservedFor(i int) bool { return b.lossObserved(i) }

// lossObserved reports whether the heartbeat observed lease i lost
// (EventLeaseLost), as keepalive's does.
func (b *beat) lossObserved(i int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[i].lossSeen
}

// nextFire is when the timer is due: the next extension (unless one is
// under way), or the earliest deadline or MaxRun of a live lease; with
// no live lease, nothing is (not even the extension, whose time, once
// past, would fire the timer again and again). b.mu is held, or b is not
// shared yet.
func (b *beat) nextFire(now time.Time) time.Time {
	var next time.Time
	for i := range b.held {
		h := &b.held[i]
		if !h.live {
			continue
		}
		if next.IsZero() || h.valid.Before(next) {
			next = h.valid
		}
		if !b.ended && !h.maxRun.IsZero() && h.maxRun.Before(next) {
			next = h.maxRun
		}
	}
	if next.IsZero() {
		return now.Add(time.Hour) // nothing live: nothing due
	}
	if !b.ended && !b.busy && b.next.Before(next) {
		next = b.next
	}
	return next
}

// arm sets the timer for what is due next. b.mu is held.
func (b *beat) arm(now time.Time) {
	if !b.stopped {
		b.due = b.nextFire(now)
		b.timer.Reset(b.due.Sub(now))
	}
}

// fire is the timer's callback. It decides from the state alone what is
// due, so a late or spurious firing does no harm.
func (b *beat) fire() {
	b.mu.Lock()
	var evs []Event
	defer func() {
		if len(evs) == 0 {
			b.mu.Unlock()
			return
		}
		b.notifying++
		b.mu.Unlock()
		for _, ev := range evs {
			b.g.observe(b.parent, ev)
		}
		b.mu.Lock()
		b.notifying--
		b.idle.Broadcast()
		b.mu.Unlock()
	}()
	if b.stopped {
		return
	}
	now := time.Now()
	if b.ended {
		// The batch's writes are under way: a lease whose deadline passes
		// meanwhile has its effect's context ended, as the holder may
		// assume nothing past it; whether it was lost the write tells.
		for i := range b.held {
			if h := &b.held[i]; h.live && !now.Before(h.valid) {
				b.lose(h, fmt.Errorf("%w: the lease's deadline passed while the write that ends the claim was under way", ErrLeaseLost))
			}
		}
		b.arm(now)
		return
	}
	live := false
	for i := range b.held {
		h := &b.held[i]
		if !h.live {
			continue
		}
		var err error
		switch {
		case !h.maxRun.IsZero() && !now.Before(h.maxRun):
			err = fmt.Errorf("%w (%s): %w: the lease is no longer extended", ErrMaxRun, b.g.opts.MaxRun, ErrLeaseLost)
		case !now.Before(h.valid) && h.lastErr != nil:
			err = fmt.Errorf("%w: the lease's deadline passed without a successful extension: %w", ErrLeaseLost, h.lastErr)
		case !now.Before(h.valid):
			err = fmt.Errorf("%w: the lease's deadline passed without a successful extension", ErrLeaseLost)
		default:
			live = true
			continue
		}
		b.lose(h, err)
		h.lossSeen = true
		evs = append(evs, Event{Kind: EventLeaseLost, Key: h.lease.Key, Attempt: h.lease.Attempt, Err: err})
	}
	if !live || b.busy || now.Before(b.next) || len(evs) > 0 {
		// Early, or an extension is under way: wait. Or leases were found
		// lost: their events are observed first (halt waits for them, so
		// the batch does not return before), and the extensions go out
		// on the firing this arms, at once.
		b.arm(now)
		return
	}

	// Extensions are due. The timer keeps the deadlines while they run;
	// their context ends at the earliest one, so answers that would come
	// too late are not waited for where the client honours deadlines.
	b.busy = true
	b.arm(now)
	var (
		ws       []Write
		idx      []int
		earliest time.Time
	)
	for i := range b.held {
		h := &b.held[i]
		if h.live {
			ws = append(ws, Write{Kind: WriteExtend, Lease: *h.lease, TTL: b.g.opts.Lease})
			idx = append(idx, i)
			if earliest.IsZero() || h.valid.Before(earliest) {
				earliest = h.valid
			}
		}
	}
	ectx, ecancel := context.WithDeadline(context.WithoutCancel(b.parent), earliest)
	b.extStop = ecancel
	b.mu.Unlock()

	sent := time.Now()
	errs := b.bs.WriteBatch(ectx, ws)
	ecancel()

	b.mu.Lock()
	b.busy, b.extStop = false, nil
	if b.ended {
		return // halted: a late answer changes nothing
	}
	now = time.Now()
	retry := false
	for j, i := range idx {
		h := &b.held[i]
		if !h.live {
			continue // its deadline passed meanwhile: a late answer revives nothing
		}
		err := errs[j]
		if err != nil {
			err = fmt.Errorf("extend %s: %w", h.lease.Key, err)
		}
		switch {
		case err == nil && now.Before(h.valid):
			// The server pushed the lease out at or after sent.
			h.valid, h.lastErr = sent.Add(b.g.validity), nil
		case err == nil:
			err = fmt.Errorf("%w: an extension succeeded only after the lease's deadline", ErrLeaseLost)
			b.lose(h, err)
			h.lossSeen = true
			evs = append(evs, Event{Kind: EventLeaseLost, Key: h.lease.Key, Attempt: h.lease.Attempt, Err: err})
		case errors.Is(err, ErrLeaseLost):
			b.lose(h, err)
			h.lossSeen = true
			evs = append(evs, Event{Kind: EventLeaseLost, Key: h.lease.Key, Attempt: h.lease.Attempt, Err: err})
		default:
			// Unavailable or timed out: try again soon, while the lease lasts.
			h.lastErr, retry = err, true
			if kind, ok := errEventKind(err); ok { // as Do's heartbeat observes it
				evs = append(evs, Event{Kind: kind, Key: h.lease.Key, Attempt: h.lease.Attempt, Err: err})
			}
		}
	}
	b.next = sent.Add(b.g.opts.Lease / 3)
	if retry {
		soonest := now.Add(b.g.opts.Lease / 3)
		for _, i := range idx {
			if h := &b.held[i]; h.live && h.lastErr != nil {
				soonest = minTime(soonest, now.Add(max(min(b.g.opts.Lease/3, h.valid.Sub(now)/3), time.Millisecond)))
			}
		}
		b.next = soonest
	}
	b.arm(now)
}

// halt ends the heartbeat, tells a round of extensions under way to give
// up, and waits for the Observer to hear of the events the heartbeat
// found. The timer goes on only to end each live lease's effect context
// at its deadline (while the batch's writes are under way); stop ends it.
// It does not wait for
// the round's answers, as keepalive's quiesce does not: a client that
// ignores its context would hold the batch's writes past the leases. The
// answers, when they come, change nothing and are not observed (fire).
func (b *beat) halt() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	b.arm(time.Now()) // for the leases' deadlines only, from now on
	if b.extStop != nil {
		b.extStop()
	}
	for b.notifying > 0 {
		b.idle.Wait()
	}
}

// endFreeing ends the effect's context of each lease whose write, ws[j]
// for lease j, frees the key (a failure or a release): another claim can
// take the key as soon as the store has the write, before its answer is
// back (keepalive's detachFreeing). A completion's ends with stop.
func (b *beat) endFreeing(ws []Write) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for j := range ws {
		if ws[j].Kind != WriteComplete {
			b.held[j].ctx.end(nil)
		}
	}
}

// stop halts the heartbeat, stops its timer and cancels every effect's
// context.
func (b *beat) stop() {
	b.halt()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	b.timer.Stop()
	for i := range b.held {
		b.held[i].ctx.end(nil)
	}
}
