// Package consumerx makes a consumer's effect happen once per message,
// however often an at-least-once broker delivers it.
//
// A Processor runs the user's Handler under a guard key made of the
// consumer group and the message id: the first delivery runs it, a later
// delivery of the same message is a Duplicate and is acknowledged without
// running. A failing handler is retried up to a maximum number of attempts,
// then the message is dead-lettered. Adapters for Redis Streams, Watermill,
// NATS JetStream and Kafka live in the subpackages redisstream, watermillx,
// jetstreamx and kafkax; each imports only its own broker.
//
// Shutdown is not failure: when the context a consumer passes to Process
// ends (it is shutting down, or a rebalance took its partition) while the
// handler runs, and the handler then returns an error, the claim is
// released instead of failed. No attempt is counted (unless it was the
// first and it recorded a step: the release keeps the steps in a record
// failed at attempt 1, as every release does), nothing is dead-lettered,
// and the outcome is Interrupted (not acknowledged), so the message runs
// again on its next delivery. A handler that returns nil
// after the context ended still completes the message; a handler's error
// while the consumer's context is live counts as an attempt, as does a
// run cut short by the guard's lease or MaxRun.
//
// The guard makes the effect happen once as long as each run's completion
// is recorded; a completion the store refuses is tried again for up to
// CompleteRetry. A consumer that dies between its effect and the
// recording, or a store down for longer, leaves a pending claim that is
// taken over after the guard's lease.
// Effects that must be exactly once even then write
// LeaseFrom(ctx).Fence along with them (see the backstop package).
package consumerx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/idemguard/idemguard/consumerx/internal/panicerr"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/inventory"
)

// Key scopes. A message of group G is guarded under the key
// guard.Key{Scope: ScopePrefix + G, ID: id}, so groups never share records.
const (
	ScopePrefix           = "consumer:"
	DeadLetterScopePrefix = "consumer-dead:" // records of dead-lettering, one per (group, id, fingerprint)
)

// DefaultMaxAttempts is the number of runs a failing message gets when
// neither Options.MaxAttempts nor the guard's MaxAttempts sets one.
const DefaultMaxAttempts = 5

// ErrNoKey is the cause of dead-lettering a message whose id is empty or
// whose Options.Key or Options.Fingerprint function failed: returned an
// error, or panicked (the cause then matches guard.ErrPanicked too, and
// errors.As finds the *guard.PanicError with the value and the stack).
var ErrNoKey = errors.New("consumerx: message has no usable id")

// Options configure a Processor. The zero value is ready to use.
type Options struct {
	// Key returns the id the message is deduplicated by. Default: msg.ID,
	// the broker's id. Use a field of the payload or a header when the
	// producer may send one logical message as several broker messages.
	// An error, or an id the guard cannot store (empty, over
	// guard.MaxIDLen bytes, control characters), dead-letters the message
	// with a cause wrapping ErrNoKey or guard.ErrInvalidKey; so does a
	// panic of the function (ErrNoKey), which goes no further: the other
	// messages of a batch run as they would have.
	Key func(Message) (string, error)
	// Fingerprint returns the digest a redelivery is compared with.
	// Default: SHA-256 of Payload, so an id reused with a different payload
	// is dead-lettered with a cause wrapping guard.ErrMismatch instead of
	// being taken for a duplicate. Return a constant ("") when one id may
	// legitimately carry a changed payload: it is then a duplicate. If it
	// panics for a message, the message is dead-lettered with a cause
	// wrapping ErrNoKey, as for a failed Key.
	Fingerprint func(Message) string
	// MaxAttempts bounds how often a failing message runs before it is
	// dead-lettered. Zero takes the guard's Options.MaxAttempts, or
	// DefaultMaxAttempts (5) if that is zero too; a negative value means
	// no limit (the message is retried for ever).
	MaxAttempts int
	// DeadLetter receives a message that cannot succeed, with the cause:
	// an error matching guard.ErrExhausted (errors.As gives the
	// *guard.ExhaustedError with Attempts and LastError; when the last
	// attempt ran in this delivery the handler's own error is wrapped too),
	// guard.ErrMismatch, guard.ErrInvalidKey or ErrNoKey. It is called once
	// per (group, id, fingerprint) however often the message comes back (it
	// runs under a guard key of its own; a message without a usable id,
	// once per (group, Message.ID, fingerprint), or on every delivery if
	// Message.ID is empty too); if it returns an error (or panics: the
	// error then matches guard.ErrPanicked) the message is not
	// acknowledged and dead-lettering is retried on the next delivery.
	// Its ctx carries the lease of that dead-letter record
	// (LeaseFrom, when the call is deduplicated): a DeadLetter that does
	// several things records each with guard.Step, so that a retry does not
	// repeat the ones done. Nil: the message is logged at Error level and
	// acknowledged.
	DeadLetter func(ctx context.Context, msg Message, cause error) error
	// OnOutcome, if set, hears the outcome of every delivery (for metrics
	// and tests), after the work and before the adapter acknowledges. err
	// is the one Process returns. A panic of it goes no further: it is
	// logged at Error level and the outcome stands (the message's record
	// is already written; the other messages of a batch are heard and
	// acknowledged as they would have been).
	OnOutcome func(ctx context.Context, msg Message, o Outcome, err error)
	// Logger receives duplicates (Info), messages in progress elsewhere
	// (Debug), failures (Warn) and dead letters (Error). Default
	// slog.Default().
	Logger *slog.Logger
	// Inventory, if set, lists the group in an idempotency inventory when
	// the Processor is made (by NewProcessor, Wrap or an adapter's New; a
	// watermillx middleware without a Group makes one per router handler
	// when its first message comes): every message deduplicated (hard),
	// keyed by the message id (or computed, with Key), one scope for the
	// whole group (global), the guard's TTL.
	Inventory *inventory.Inventory
	// MessageType names the group's messages in the inventory (a topic,
	// stream or event name). Default "message".
	MessageType string
}

// Processor runs handlers once per (group, message id). It is safe for
// concurrent use.
type Processor struct {
	g     *guard.Guard
	call  guard.CallOptions // claims of messages: the effective MaxAttempts
	group string
	scope string
	max   int // effective attempt limit; 0 = none
	opts  Options
	log   *slog.Logger
}

// deadCall: claims of dead-lettering have no attempt limit.
var deadCall = guard.CallOptions{MaxAttempts: -1}

// NewProcessor returns a Processor for consumer group group that claims
// messages through g (its store, lease, TTL and Observer), with the
// attempt limit of Options.MaxAttempts for this group's claims only (see
// guard.CallOptions): other callers of g keep g's. The group must be
// non-empty and fit a guard.Key scope; a nil g or a bad group is an error.
func NewProcessor(g *guard.Guard, group string, opts Options) (*Processor, error) {
	if g == nil {
		return nil, errors.New("consumerx: nil guard")
	}
	if group == "" {
		return nil, errors.New("consumerx: empty group")
	}
	for _, s := range []string{ScopePrefix + group, DeadLetterScopePrefix + group} {
		if err := (guard.Key{Scope: s, ID: "x"}).Validate(); err != nil {
			return nil, fmt.Errorf("consumerx: group %q: %w", group, err)
		}
	}
	max := opts.MaxAttempts
	switch {
	case max < 0:
		max = 0
	case max == 0:
		max = g.Options().MaxAttempts
		if max == 0 {
			max = DefaultMaxAttempts
		}
	}
	call := guard.CallOptions{MaxAttempts: max}
	if max == 0 {
		call.MaxAttempts = -1 // no limit, whatever the guard's
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Processor{
		g:     g,
		call:  call,
		group: group,
		scope: ScopePrefix + group,
		max:   max,
		opts:  opts,
		log:   log.With("group", group),
	}
	p.register()
	return p, nil
}

// Wrapped is a Handler wrapped by Wrap: it runs the handler at most once
// per message and says what the adapter should do with the delivery.
type Wrapped func(ctx context.Context, msg Message) (Outcome, error)

// Wrap returns h wrapped to run once per (group, message id): a
// Processor's Process with h. It returns an error where NewProcessor does
// (nil guard, bad group: a group name often comes from configuration) and
// for a nil h.
func Wrap(g *guard.Guard, group string, h Handler, opts Options) (Wrapped, error) {
	if h == nil {
		return nil, errors.New("consumerx: nil handler")
	}
	p, err := NewProcessor(g, group, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, msg Message) (Outcome, error) { return p.Process(ctx, msg, h) }, nil
}

// Group returns the processor's consumer group.
func (p *Processor) Group() string { return p.group }

// MaxAttempts returns the attempt limit in force; 0 means none.
func (p *Processor) MaxAttempts() int { return p.max }

// Key returns the guard key msg is processed under.
func (p *Processor) Key(msg Message) (guard.Key, error) {
	id := msg.ID
	if p.opts.Key != nil {
		var err error
		if id, err = p.userKey(msg); err != nil {
			return guard.Key{}, fmt.Errorf("%w: key function: %w", ErrNoKey, err)
		}
	}
	if id == "" {
		return guard.Key{}, fmt.Errorf("%w: empty id", ErrNoKey)
	}
	k := guard.Key{Scope: p.scope, ID: id}
	if err := k.Validate(); err != nil {
		return guard.Key{}, err
	}
	return k, nil
}

// userKey calls Options.Key, its panic made an error.
func (p *Processor) userKey(msg Message) (id string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &funcPanicked{&guard.PanicError{Value: v, Stack: debug.Stack()}}
		}
	}()
	return p.opts.Key(msg)
}

// funcPanicked is the panic of a user's Key, Fingerprint or DeadLetter
// function: it
// matches guard.ErrPanicked, and errors.As finds the *guard.PanicError.
type funcPanicked struct{ p *guard.PanicError }

func (e *funcPanicked) Error() string { return fmt.Sprintf("panicked: %v", e.p.Value) }
func (e *funcPanicked) Unwrap() error { return e.p }

// Process runs h for msg unless msg's (group, id) already ran, and reports
// what to do with the delivery; see Outcome. ctx is the consumer's own
// context: if it has ended when h returns an error, the claim is released
// and the outcome is Interrupted (see the package doc). The error says
// why for InProgress (a *guard.InProgressError), Failed (the handler's or
// the store's error), DeadLettered (the cause given to DeadLetter) and
// Interrupted (the handler's error, or the context's); it is nil for
// Processed and Duplicate. A panic in h releases the claim and goes on;
// a panic of Options.Key, Fingerprint or DeadLetter does not go on, it
// is the message's (see ErrNoKey and Options.DeadLetter). A nil h is a
// programmer's error: Process panics before it claims the key.
func (p *Processor) Process(ctx context.Context, msg Message, h Handler) (Outcome, error) {
	if h == nil {
		panic("consumerx: Process: nil Handler")
	}
	o, _, err := p.ProcessResult(ctx, msg, func(ctx context.Context, msg Message) ([]byte, error) {
		return nil, h(ctx, msg)
	})
	return o, err
}

// ProcessResult is Process for a handler with a result: the result of the
// run that succeeded is returned for Processed and, read from the store,
// for every Duplicate. A nil fn is a programmer's error: ProcessResult
// panics before it claims the key.
func (p *Processor) ProcessResult(ctx context.Context, msg Message, fn ResultFunc) (o Outcome, result []byte, err error) {
	if fn == nil {
		panic("consumerx: ProcessResult: nil ResultFunc")
	}
	o, result, err = p.process(ctx, msg, fn)
	p.report(ctx, msg, o, err)
	return o, result, err
}

// report logs a delivery's outcome and tells Options.OnOutcome.
func (p *Processor) report(ctx context.Context, msg Message, o Outcome, err error) {
	switch o {
	case Duplicate:
		if p.log.Enabled(ctx, slog.LevelInfo) {
			p.log.InfoContext(ctx, "consumerx: duplicate message acknowledged without running", "id", msg.ID)
		}
	case InProgress:
		if p.log.Enabled(ctx, slog.LevelDebug) {
			p.log.DebugContext(ctx, "consumerx: message in progress elsewhere, left for redelivery", "id", msg.ID, "err", err)
		}
	case Failed:
		if errors.Is(err, guard.ErrPanicked) {
			p.log.ErrorContext(ctx, "consumerx: handler panicked, left for retry", "id", msg.ID, "err", err)
			break
		}
		p.log.WarnContext(ctx, "consumerx: message failed, left for retry", "id", msg.ID, "err", err)
	case Interrupted:
		p.log.InfoContext(ctx, "consumerx: consumer stopped while the handler ran; claim released, left for redelivery", "id", msg.ID, "err", err)
	}
	if p.opts.OnOutcome != nil {
		p.onOutcome(ctx, msg, o, err)
	}
}

// handlerError marks the handler's own error, so that Process can tell it
// from an error of the store. One that wraps guard.ErrRejected (a
// lock.Guarded section in the handler, say) does not unwrap: the guard
// would release the claim, uncounted, and a handler rejected every time
// would never be dead-lettered; every handler error is a failed attempt.
// Process returns the handler's error itself.
type handlerError struct {
	err      error
	rejected bool // err matches guard.ErrRejected: hidden from the guard
}

func newHandlerError(err error) *handlerError {
	return &handlerError{err: err, rejected: errors.Is(err, guard.ErrRejected)}
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error {
	if e.rejected {
		return nil
	}
	return e.err
}

// withHandlerError is err, which wraps a handlerError hiding the
// handler's error h (one matching guard.ErrRejected), unwrapping to h too.
type withHandlerError struct{ err, h error }

func (e *withHandlerError) Error() string   { return e.err.Error() }
func (e *withHandlerError) Unwrap() []error { return []error{e.err, e.h} }

// interrupted is a handler's error returned after the consumer's context
// ended: it matches guard.ErrRejected, so Guard.Do releases the claim
// instead of failing it, and the handler's error.
type interrupted struct{ err error }

func (e *interrupted) Error() string {
	return "consumerx: consumer stopped while the handler ran: " + e.err.Error()
}
func (e *interrupted) Unwrap() []error { return []error{guard.ErrRejected, e.err} }

func (p *Processor) process(ctx context.Context, msg Message, fn ResultFunc) (Outcome, []byte, error) {
	key, err := p.Key(msg)
	fp, ferr := p.fingerprint(msg)
	if err == nil {
		err = ferr
	}
	if err != nil {
		return p.deadLetter(ctx, msg, guard.Key{}, fp, err)
	}
	r := run{key: key, fp: fp}
	res, err := p.g.DoWith(ctx, key, r.fp, func(lctx context.Context, lease guard.Lease) ([]byte, error) {
		return r.handle(ctx, lctx, lease, msg, fn, nil)
	}, p.call)
	return p.settle(ctx, msg, &r, res, err)
}

// run is what one message's turn under the guard left behind.
type run struct {
	key     guard.Key
	fp      string
	lease   guard.Lease // the handler's, for LeaseFrom
	lctx    leaseCtx    // the handler's context
	ran     bool
	attempt int
	// retry bounds recomplete: one budget for a whole batch.
	retry   *completeBudget
	retried bool // its refused completion was tried again already (ProcessBatch)
	// pastStop: an Ordered batch's stop came before it (ProcessBatch): a
	// last attempt's failure waits for the message's turn to be
	// dead-lettered, as a claim answered exhausted does.
	pastStop bool
	herr     *handlerError
	stopped  *interrupted
	// lossSeen: the handler's context had ended for its lease when it
	// returned: the guard's heartbeat (or a step) found the lease lost,
	// and its Observer heard EventLeaseLost then.
	lossSeen bool
}

// refused reports whether err, the guard's answer for r, is a success of
// r's handler whose completion the store refused for a moment: one to
// record again (recomplete).
func (r *run) refused(err error) bool {
	return r.ran && r.herr == nil && r.stopped == nil && !errors.Is(err, guard.ErrPanicked) &&
		errors.Is(err, guard.ErrUnavailable) && !errors.Is(err, guard.ErrLeaseLost)
}

// handle runs fn (or h, when fn is nil) for msg under lease, with the
// lease's context lctx; ctx is the consumer's own.
func (r *run) handle(ctx, lctx context.Context, lease guard.Lease, msg Message, fn ResultFunc, h Handler) ([]byte, error) {
	r.ran, r.attempt, r.lease = true, lease.Attempt, lease
	r.lctx = leaseCtx{Context: lctx, lease: &r.lease}
	var (
		v   []byte
		err error
	)
	if fn != nil {
		v, err = fn(&r.lctx, msg)
	} else {
		err = r.call(msg, h)
	}
	r.lossSeen = lctx.Err() != nil && errors.Is(context.Cause(lctx), guard.ErrLeaseLost)
	if err != nil {
		if ctx.Err() != nil {
			// Shutdown, not failure: release the claim.
			r.stopped = &interrupted{err}
			return nil, r.stopped
		}
		r.herr = newHandlerError(err)
		return nil, r.herr
	}
	return v, nil
}

// call runs a batch's handler h for msg, with the run's context, and
// turns a panic into a failure of the run (a *panicerr.Error): it is then
// counted as an attempt like any handler error, so a message that always
// panics is dead-lettered after MaxAttempts instead of coming back for
// ever (holding back a Kafka partition). runtime.Goexit is not a panic:
// it goes on, and the guard releases the claim.
func (r *run) call(msg Message, h Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = panicerr.New(r.key, v)
		}
	}()
	return h(&r.lctx, msg)
}

// settle turns the guard's answer for msg's run r into the delivery's
// outcome; ctx is the consumer's own.
func (p *Processor) settle(ctx context.Context, msg Message, r *run, res guard.Result, err error) (Outcome, []byte, error) {
	key, ran, herr := r.key, r.ran, r.herr
	switch {
	case err == nil && res.Replayed:
		return Duplicate, res.Value, nil
	case err == nil:
		return Processed, res.Value, nil
	case r.stopped != nil:
		// Released (or, if the release was not recorded, left to run out
		// and be recovered).
		return Interrupted, nil, err
	case !ran && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Cause(ctx))):
		// Stopped before the handler ran (a batch names the context's
		// cause, which may be the consumer's own): nothing happened.
		return Interrupted, nil, err
	case !ran && errors.Is(err, guard.ErrSkipped):
		// An ordered batch stopped before it (a handler's own error that
		// wraps ErrSkipped is a failed attempt: below).
		return Skipped, nil, err
	case herr == nil && errors.Is(err, guard.ErrPanicked):
		// The guard's (runtime.Goexit in a batch's handler): released,
		// nothing is known of its effect but that it did not finish.
		return Failed, nil, err
	case r.refused(err) && !r.retried && p.recomplete(ctx, r, res) == nil:
		// The store refused the completion for a moment; tried again, it
		// took it.
		return Processed, res.Value, nil
	case ran && herr == nil:
		// The effect happened but was not recorded (lease lost or store
		// down): leave the message to a redelivery, which finds the record
		// (or, if the store is still down when the lease has run out, runs
		// it again: see the package doc).
		return Failed, nil, fmt.Errorf("consumerx: %s ran but its completion was not recorded: %w", key, err)
	case ran && err != error(herr):
		// The failure could not be recorded either.
		ferr := fmt.Errorf("consumerx: %s failed and the failure was not recorded: %w", key, err)
		if herr.rejected {
			// err wraps herr, which hides the handler's error from the
			// guard: the caller matches it still.
			ferr = &withHandlerError{ferr, herr.err}
		}
		return Failed, nil, ferr
	case ran:
		if p.max > 0 && r.attempt >= p.max && !r.pastStop {
			cause := &exhaustedCause{
				ExhaustedError: &guard.ExhaustedError{Key: key, Attempts: r.attempt, LastError: herr.Error()},
				err:            herr.err,
			}
			return p.deadLetter(ctx, msg, key, r.fp, cause)
		}
		return Failed, nil, herr.err
	case errors.Is(err, guard.ErrInProgress):
		return InProgress, nil, err
	case errors.Is(err, guard.ErrExhausted), errors.Is(err, guard.ErrMismatch), errors.Is(err, guard.ErrInvalidKey):
		return p.deadLetter(ctx, msg, key, r.fp, err)
	default:
		return Failed, nil, err
	}
}

// CompleteRetry is how long a Processor keeps trying to record a handler's
// success (or a dead letter sent) that the store refused (unreachable,
// restarting, failing over), for one message or for a whole batch's
// handlers (each dead letter's record has it from its own refusal), before
// it leaves the message Failed with its claim pending (a message of a batch whose time
// went on the messages before it still gets one try if the store took the
// last of theirs). The tries pause after each refusal (20ms, doubling up
// to 500ms), not before each message: once the store is back, a batch's
// completions are written one after another, or, when the guard's store
// has batches (guard.BatchStore, as the Redis store), all those still
// refused in one batch write per try (one round trip however many there
// are). A restarted or failed-over
// Redis answers within a second; the message's effect would otherwise run
// again once its lease ran out.
const CompleteRetry = 2 * time.Second

// completeBudget is how long the completions of one run, or of a whole
// batch, are tried again (until: CompleteRetry after the first refusal),
// whether the store took the last one tried (took), and the pause before
// the next try (wait, doubled after each refusal up to maxCompletePause;
// none once the store answered). A batch's runs are settled one after
// another, on one goroutine, sharing it: the pauses go by refusal, not by
// message, so once the store is back a batch's completions follow one
// another without one (with a pause before each, a batch of 100 spent the
// budget pausing).
type completeBudget struct {
	until time.Time
	took  bool
	wait  time.Duration
}

// newCompleteBudget is the budget of completions the store refused just
// now: the first try again comes after firstCompletePause.
func newCompleteBudget() *completeBudget {
	return &completeBudget{until: time.Now().Add(CompleteRetry), wait: firstCompletePause}
}

// try waits out b's pause, while the budget has time left, and returns
// the context of the next try: until the budget's end, or, once it has
// passed, lastCompleteTry long for the one try past it (last) when the
// store took the try before. ok is false when no try is left.
func (b *completeBudget) try(ctx context.Context) (cctx context.Context, cancel context.CancelFunc, last, ok bool) {
	if b.until.IsZero() {
		// A batch's budget starts at its first refusal, not when the
		// batch's claims ended: a slow DeadLetter before it must not
		// spend it.
		b.until = time.Now().Add(CompleteRetry)
	}
	left := time.Until(b.until)
	switch {
	case left > 0:
		if b.wait > 0 {
			t := time.NewTimer(min(b.wait, left))
			<-t.C
		}
		cctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), b.until)
		return cctx, cancel, false, true
	case b.took:
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), lastCompleteTry)
		return cctx, cancel, true, true
	}
	return nil, nil, true, false
}

// Pauses between the tries again of refused completions.
const (
	firstCompletePause = 20 * time.Millisecond
	maxCompletePause   = 500 * time.Millisecond
)

// lastCompleteTry bounds the one try a completion gets once its batch's
// budget was spent on the messages before it, when the store took the
// last of theirs.
const lastCompleteTry = 500 * time.Millisecond

// recomplete tries again, until r.retry's end (set for a whole batch, or
// CompleteRetry from now), to record the success of r's handler, whose
// completion the store refused, pausing after each refusal (the budget's
// pauses: see completeBudget). A message whose batch spent the time on
// the messages before it still gets one try if the store took the last of
// theirs: it is back, and without the try the message would be left
// pending, its effect run again after the lease. Completing is a
// compare-and-set on the run's token that is safe to repeat: it fails
// with guard.ErrLeaseLost if another consumer took the message over
// meanwhile.
func (p *Processor) recomplete(ctx context.Context, r *run, res guard.Result) error {
	if r.retry == nil {
		r.retry = newCompleteBudget()
	}
	err := completeAgain(ctx, p.g, r.retry, res, context.DeadlineExceeded, r.lossSeen)
	if err == nil {
		p.log.InfoContext(ctx, "consumerx: completion recorded on a second try", "id", r.key.ID)
	}
	return err
}

// Recomplete records the completion of res (its Lease and Value) that
// the store refused with err a moment ago, trying again as a Processor
// tries its own: for up to CompleteRetry, pausing after each refusal
// (20ms, doubling up to 500ms), whether or not ctx ends meanwhile. It
// returns nil once recorded (and g's Observer hears EventCompleted),
// guard.ErrLeaseLost if another holder took the key over, else the last
// refusal (err if no try was made). For an
// adapter that completes a record of its own through the guard (a dead
// letter sent once), so that the next delivery does not do it again.
func Recomplete(ctx context.Context, g *guard.Guard, res guard.Result, err error) error {
	return completeAgain(ctx, g, newCompleteBudget(), res, err, false)
}

// completeAgain tries again, within b, to record res's completion, whose
// last refusal was err; see recomplete. lossSeen: the Observer heard the
// run's lease lost already (run.lossSeen).
func completeAgain(ctx context.Context, g *guard.Guard, b *completeBudget, res guard.Result, err error, lossSeen bool) error {
	ttl := g.Options().TTL
	for {
		cctx, cancel, last, ok := b.try(ctx)
		if !ok {
			return err
		}
		err = g.Store().Complete(cctx, res.Lease, res.Value, ttl)
		cancel()
		b.took = err == nil || errors.Is(err, guard.ErrLeaseLost) // the store answered
		switch {
		case err == nil:
			observeCompleted(ctx, g, res.Lease)
		case !lossSeen && errors.Is(err, guard.ErrLeaseLost):
			observeLeaseLost(ctx, g, res.Lease, err)
		}
		if b.took {
			b.wait = 0 // the next completion is tried at once
			return err
		}
		b.wait = min(max(2*b.wait, firstCompletePause), maxCompletePause)
		if last {
			return err // the one try past the budget
		}
	}
}

// observeCompleted tells g's Observer that lease's result was stored by a
// completion tried again (the store had refused the guard's own, which the
// Observer heard as EventUnavailable): the guard hears of a write made on
// its store only when it makes it.
func observeCompleted(ctx context.Context, g *guard.Guard, lease guard.Lease) {
	if o := g.Options().Observer; o != nil {
		o.Observe(ctx, guard.Event{Kind: guard.EventCompleted, Key: lease.Key, Attempt: lease.Attempt})
	}
}

// observeLeaseLost tells g's Observer that a completion tried again was
// refused because lease was lost (another holder took the key over, or
// the record is gone), as the guard observes a refusal of its own writes:
// the effect ran and is not recorded. The guard heard only the refusal
// of its own completion (EventUnavailable).
func observeLeaseLost(ctx context.Context, g *guard.Guard, lease guard.Lease, err error) {
	if o := g.Options().Observer; o != nil {
		o.Observe(ctx, guard.Event{Kind: guard.EventLeaseLost, Key: lease.Key, Attempt: lease.Attempt, Err: err})
	}
}

// recompleteAll is recomplete for the runs rs of a batch whose
// completions (of results res) the store refused, within b: when the
// guard's store has batches (guard.BatchStore) every round tries all
// that are still refused in one WriteBatch, one round trip however many
// there are (docs/design.md, "Batches"), with the pauses of recomplete
// between rounds, and one round past the budget if the store took some
// of the last; otherwise they are tried one after another, as
// recomplete tries one. errs[k] is rs[k]'s last answer: nil once
// recorded.
func (p *Processor) recompleteAll(ctx context.Context, b *completeBudget, rs []*run, res []guard.Result) (errs []error) {
	errs = make([]error, len(rs))
	bs, ok := p.g.Store().(guard.BatchStore)
	if !ok {
		for k, r := range rs {
			errs[k] = p.recomplete(ctx, r, res[k])
		}
		return errs
	}
	ttl := p.g.Options().TTL
	pending := make([]int, len(rs)) // of rs, the ones the store has not taken
	for k := range pending {
		pending[k] = k
	}
	var ws []guard.Write
	for len(pending) > 0 {
		cctx, cancel, last, ok := b.try(ctx)
		if !ok {
			for _, k := range pending {
				if errs[k] == nil {
					errs[k] = context.DeadlineExceeded
				}
			}
			return errs
		}
		ws = ws[:0]
		for _, k := range pending {
			ws = append(ws, guard.Write{Kind: guard.WriteComplete, Lease: res[k].Lease, Result: res[k].Value, TTL: ttl})
		}
		werrs := bs.WriteBatch(cctx, ws)
		cancel()
		took := false // the store answered one of them at least
		still := pending[:0]
		for w, k := range pending {
			err := werrs[w]
			errs[k] = err
			if err == nil || errors.Is(err, guard.ErrLeaseLost) {
				took = true
				if err == nil {
					observeCompleted(ctx, p.g, res[k].Lease)
					p.log.InfoContext(ctx, "consumerx: completion recorded on a second try", "id", rs[k].key.ID)
				} else if !rs[k].lossSeen {
					observeLeaseLost(ctx, p.g, res[k].Lease, err)
				}
				continue
			}
			still = append(still, k)
		}
		pending = still
		b.took = took
		if took {
			b.wait = 0 // the rest are tried again at once
		} else {
			b.wait = min(max(2*b.wait, firstCompletePause), maxCompletePause)
		}
		if last {
			break // the one round past the budget
		}
	}
	return errs
}

// exhaustedCause is the dead-letter cause of a message whose last allowed
// attempt failed in this delivery: it matches guard.ErrExhausted and the
// handler's error.
type exhaustedCause struct {
	*guard.ExhaustedError
	err error
}

func (e *exhaustedCause) Unwrap() []error { return []error{e.ExhaustedError, e.err} }

// deadLetter hands msg to Options.DeadLetter, once per (group, id,
// fingerprint). key is zero when the message has no usable id: its dead
// letter is then kept once per (group, broker id, fingerprint), so that a
// redelivery of a message already dead-lettered but not acknowledged (the
// consumer stopped, the acknowledgement was lost) is not dead-lettered
// again; a message without a broker id either is not deduplicated. A dead
// letter sent whose record the store refused is recorded again as a
// handler's success is (recomplete), for CompleteRetry from that refusal,
// in a batch too: left pending, it would be sent again once its lease ran
// out, and a batch's budget could be spent before (by a slow DeadLetter,
// by the messages before it), where the record's lease, just taken, has
// the time.
func (p *Processor) deadLetter(ctx context.Context, msg Message, key guard.Key, fp string, cause error) (Outcome, []byte, error) {
	if p.opts.DeadLetter == nil {
		p.log.ErrorContext(ctx, "consumerx: message dead-lettered (no DeadLetter set: dropped)", "id", msg.ID, "cause", cause)
		return DeadLettered, nil, cause
	}
	var dk guard.Key
	switch {
	case key.ID != "":
		dk = guard.Key{Scope: DeadLetterScopePrefix + p.group, ID: digest(key.ID, fp)}
	case msg.ID != "":
		// A control character no usable id holds keeps the broker's ids
		// apart from the ids keys are made of.
		dk = guard.Key{Scope: DeadLetterScopePrefix + p.group, ID: digest("\x00"+msg.ID, fp)}
	default:
		if err := p.sendDeadLetter(ctx, msg, cause); err != nil {
			return deadLetterFailed(ctx, err)
		}
		p.log.ErrorContext(ctx, "consumerx: message dead-lettered", "id", msg.ID, "cause", cause)
		return DeadLettered, nil, cause
	}
	sent := false
	res, err := p.g.DoWith(ctx, dk, "", func(lctx context.Context, lease guard.Lease) ([]byte, error) {
		err := p.sendDeadLetter(&leaseCtx{Context: lctx, lease: &lease}, msg, cause)
		sent = err == nil
		return nil, err
	}, deadCall)
	if err != nil && sent && errors.Is(err, guard.ErrUnavailable) && !errors.Is(err, guard.ErrLeaseLost) {
		// Sent, but its record refused for a moment: try it again.
		r := run{key: dk}
		if p.recomplete(ctx, &r, res) == nil {
			res, err = guard.Result{}, nil
		}
	}
	switch {
	case err == nil:
		if !res.Replayed {
			p.log.ErrorContext(ctx, "consumerx: message dead-lettered", "id", msg.ID, "cause", cause)
		}
		return DeadLettered, nil, cause
	case errors.Is(err, guard.ErrInProgress):
		return InProgress, nil, err
	default:
		return deadLetterFailed(ctx, err)
	}
}

// sendDeadLetter calls Options.DeadLetter. A panic of it is a dead letter
// not sent, as an error is: it becomes an error matching
// guard.ErrPanicked, and goes no further (it would take down a whole
// batch, again on every delivery).
func (p *Processor) sendDeadLetter(ctx context.Context, msg Message, cause error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &funcPanicked{&guard.PanicError{Value: v, Stack: debug.Stack()}}
		}
	}()
	return p.opts.DeadLetter(ctx, msg, cause)
}

// deadLetterFailed is the outcome of a dead letter that was not sent
// (err): Interrupted if the consumer's context ctx has ended (shutdown is
// not failure), Failed otherwise. Either way the message is not
// acknowledged, and its next delivery dead-letters it.
func deadLetterFailed(ctx context.Context, err error) (Outcome, []byte, error) {
	err = fmt.Errorf("consumerx: dead letter: %w", err)
	if ctx.Err() != nil {
		return Interrupted, nil, err
	}
	return Failed, nil, err
}

// fingerprint returns msg's fingerprint, or an error wrapping ErrNoKey if
// Options.Fingerprint panicked.
func (p *Processor) fingerprint(msg Message) (fp string, err error) {
	if p.opts.Fingerprint != nil {
		defer func() {
			if v := recover(); v != nil {
				fp, err = "", fmt.Errorf("%w: fingerprint function: %w", ErrNoKey,
					&funcPanicked{&guard.PanicError{Value: v, Stack: debug.Stack()}})
			}
		}()
		return p.opts.Fingerprint(msg), nil
	}
	var b [fingerprintLen]byte
	return string(appendFingerprint(b[:0], msg.Payload)), nil
}

// fingerprintLen is the length of the default fingerprint: base64 of a
// SHA-256.
const fingerprintLen = 43

func appendFingerprint(dst, payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return base64.RawURLEncoding.AppendEncode(dst, sum[:])
}

// fingerprintsInto sets each run's fingerprint to its message's, as
// fingerprint makes it; the default ones share one allocation. errs, nil
// if there is none, holds the error of each message whose Fingerprint
// panicked.
func (p *Processor) fingerprintsInto(msgs []Message, runs []run) (errs []error) {
	if p.opts.Fingerprint != nil {
		for i := range msgs {
			var err error
			if runs[i].fp, err = p.fingerprint(msgs[i]); err != nil {
				if errs == nil {
					errs = make([]error, len(msgs))
				}
				errs[i] = err
			}
		}
		return errs
	}
	b := make([]byte, 0, fingerprintLen*len(msgs))
	for i := range msgs {
		b = appendFingerprint(b, msgs[i].Payload)
	}
	all := unsafe.String(unsafe.SliceData(b), len(b)) // b is not changed again
	for i := range runs {
		runs[i].fp = all[i*fingerprintLen : (i+1)*fingerprintLen]
	}
	return nil
}

// digest names the dead-letter record of (id, fingerprint).
func digest(id, fp string) string {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(id)))
	h.Write(n[:])
	h.Write([]byte(id))
	h.Write([]byte(fp))
	return hex.EncodeToString(h.Sum(nil))
}
