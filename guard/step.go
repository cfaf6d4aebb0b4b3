package guard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
)

// Recovery points (steps) and keys that follow an effect downstream.
//
// An effect that does several things in turn (reserve stock, charge a
// card, write the order) is all or nothing to the guard: when its holder
// dies after the charge, the next attempt runs the whole effect again.
// Step splits it into recovery points, as brandur's rocket-rides-atomic
// does with Postgres: each step's result is stored with the key's record
// before Step returns, and a later attempt of the same key (after a crash,
// a lost lease, a failed attempt) gets the stored result without running
// the step again, and goes on from there. A step's effect can still run
// twice when its holder dies after the effect and before the result is
// stored; a step that calls a service taking its own idempotency key
// passes it Lease.KeyFor(step), which is the same in every attempt, so
// the service makes that effect once too.

// Limits on steps.
const (
	// MaxStepNameLen is the longest step name, in bytes.
	MaxStepNameLen = 64
	// MaxSteps is the most steps one key records.
	MaxSteps = 64
)

// Step errors. Check them with errors.Is.
var (
	// ErrStepOrder: an attempt asked for its steps in another order than
	// an earlier attempt of the key recorded them (a step of another name
	// at the same place), asked for one name twice, or began a step while
	// another was running. The error is a *StepOrderError when it names
	// the recorded step. The step did not run.
	ErrStepOrder = errors.New("idemguard: steps asked in another order than recorded")
	// ErrStepsUnsupported: the guard's store keeps no steps (KeepsSteps
	// reports false: it is not a StepStore, or a StepStore that wraps
	// stores keeping none). The step did not run.
	ErrStepsUnsupported = errors.New("idemguard: the store keeps no steps")
)

// StepOrderError is a step asked where the record holds another. It
// matches ErrStepOrder.
type StepOrderError struct {
	Key      Key
	Index    int    // the step's place, from 0
	Asked    string // the name asked for
	Recorded string // the name recorded there; "" when the record holds fewer steps
	Steps    int    // how many steps the record holds
}

func (e *StepOrderError) Error() string {
	if e.Recorded == "" {
		return fmt.Sprintf("%s: %s step %d %q asked, the record holds %d steps", ErrStepOrder, e.Key, e.Index, e.Asked, e.Steps)
	}
	return fmt.Sprintf("%s: %s step %d is %q in the record, %q asked", ErrStepOrder, e.Key, e.Index, e.Recorded, e.Asked)
}

// Is makes errors.Is(err, ErrStepOrder) true.
func (e *StepOrderError) Is(target error) bool { return target == ErrStepOrder }

// StepResult is one recorded step: its name and the result Step stored.
type StepResult struct {
	Name   string
	Result []byte
}

// StepStore is a Store that keeps steps with its records. RedisStore and
// memstore.Store are StepStores; a store that is not gives
// ErrStepsUnsupported from Step, before the step runs.
//
// A StepStore may also have a method KeepsSteps() bool. A wrapper that is
// a StepStore whatever it wraps (fallback.Store), or that forwards the
// steps of the store it wraps, should have it and answer whether the
// stores it writes steps to keep them (the function KeepsSteps of each).
// Step treats a StepStore whose KeepsSteps answers false as a store that
// keeps no steps; one without the method keeps them.
//
// The rules, held by storetest's step cases:
//   - A claim that acquires a key reports in Outcome.Steps the steps the
//     record holds, in order: those of earlier attempts (failed, released,
//     or taken over after their lease ran out), or, for the same claim sent
//     again, its own. A new key, and one whose record expired, has none.
//     Nothing else is revealed: a mismatch, a replay or an in-progress
//     answer carries no steps.
//   - Completing a key drops its steps (the result replays from then on);
//     failing keeps them. Releasing a claim whose record holds steps
//     cannot undo their effects: the record becomes failed, keeping them,
//     its attempt uncounted when it was not the first.
type StepStore interface {
	Store
	// SaveStep records step (index steps recorded before it) for the
	// holder of lease: a compare-and-set on the owner token of a pending
	// record that holds exactly index steps. It returns ErrLeaseLost when
	// the caller does not hold the key (nothing is written), and a
	// *StepOrderError when the record holds another number of steps or
	// another step at index. Saving a step the record already holds at
	// index, byte for byte, answers the holder nil: it is this call sent
	// again. A caller that no longer holds the key gets ErrLeaseLost
	// whatever it sends, a step byte for byte one it or another holder
	// recorded included, so a step that gates an effect lets through only
	// the holder.
	SaveStep(ctx context.Context, lease Lease, index int, step StepResult) error
}

// KeepsSteps reports whether s keeps steps: s is a StepStore and, if it
// has a method KeepsSteps() bool (see StepStore), that answers true. Step
// runs a step only over a store that keeps steps; a wrapper's KeepsSteps
// method answers it for the stores it sends steps to.
func KeepsSteps(s Store) bool {
	ss, ok := s.(StepStore)
	if !ok {
		return false
	}
	k, ok := ss.(interface{ KeepsSteps() bool })
	return !ok || k.KeepsSteps()
}

// CheckStep reports whether a step can be stored: a name of 1 to
// MaxStepNameLen bytes of valid UTF-8 without control characters, and an
// index from 0 to MaxSteps−1. Stores call it; the error wraps
// ErrInvalidKey (a step's name is part of the key its result is kept
// under, and of Lease.KeyFor).
func CheckStep(index int, name string) error {
	if index < 0 || index >= MaxSteps {
		return fmt.Errorf("%w: step %d: a key records at most %d steps", ErrInvalidKey, index, MaxSteps)
	}
	if err := checkPart("step name", name, MaxStepNameLen); err != nil {
		return err
	}
	return nil
}

// Step runs fn once for the key lease holds and the step name, inside the
// effect of Guard.Do (or after Guard.Claim), and returns its result.
//
// The first time, fn runs and its result, encoded, is stored with the
// key's record before Step returns: a compare-and-set on the holder's
// token, so a holder that lost its lease stores nothing and gets an error
// matching ErrLeaseLost. Every later attempt of the same key (after a
// crash, a lost lease, a failed or released attempt) gets the stored
// result without running fn. Completing the key drops its steps: from
// then on the key replays the effect's result.
//
// Steps are recorded in order: an attempt must ask for them in the order
// earlier attempts recorded them, or it gets ErrStepOrder (a
// *StepOrderError) without running fn. An attempt may stop asking before
// the last recorded step (the effect took another path); the steps it did
// not ask for stay recorded until the key completes. A name is asked at
// most once per attempt; steps run one after another, not nested.
//
// T is stored as its bytes when it is []byte, else as JSON
// (encoding/json; so is a []byte held by an interface T, which comes back
// as JSON decodes it into T). Step returns the stored bytes decoded, the first time
// too, so a first run and a resumed one see the same value. An encoding
// error is returned like fn's: nothing is stored.
//
// fn's error is returned as it is and nothing is stored: the step runs
// again in the next attempt. Step does not run fn when ctx is done (it
// returns an error with ctx's cause, matching ErrLeaseLost when the lease
// was lost), nor after a step of this attempt found its lease lost or
// could not tell whether its result was stored (ErrUnavailable): the
// effect should return the error, so the next attempt learns from its
// claim what was stored; nor, whatever ctx, once the holder ended its
// claim (Complete, Fail or Release, or the write Do and DoBatch make when
// the effect returned): it holds the key no longer, and the error matches
// ErrLeaseLost. The result is written even if ctx ends while fn runs,
// bounded like Guard.Complete.
//
// Step needs a Lease from Guard.Do, DoBatch, Claim, Hold or Wait, over
// a store that keeps steps (KeepsSteps); with another store it returns
// ErrStepsUnsupported without running fn. A step whose effect goes
// to a service that takes an idempotency key should pass it
// lease.KeyFor(name): if the holder dies after the service acted and
// before the result was stored, the next attempt runs the step again with
// the same key, and the service answers it without acting twice.
//
// Each step costs one round trip to the store, and its bytes (name,
// result, a few bytes of length) in the record until the key completes
// (README, Steps). A nil fn is a programmer's error: Step panics before
// it reads or writes anything.
func Step[T any](ctx context.Context, lease Lease, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	if fn == nil {
		panic("guard.Step: nil func")
	}
	var zero T
	// Decided by T, not by the value fn returns: a []byte in an
	// interface T goes as JSON, which decodes back into T.
	bytesT := reflect.TypeFor[T]() == reflect.TypeFor[[]byte]()
	raw, err := lease.steps.run(ctx, lease, name, func(ctx context.Context) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		if bytesT {
			b := any(v).([]byte)
			if b == nil {
				b = []byte{}
			}
			return b, nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("idemguard: step %q: encoding its result: %w", name, err)
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	if bytesT {
		return any(raw).(T), nil
	}
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return zero, fmt.Errorf("%w: %s step %q: stored result does not decode as %T: %w", ErrCorrupt, lease.Key, name, v, err)
	}
	return v, nil
}

// stepLog is a holder's view of its key's steps: those its claim reported
// and those it recorded since. One is shared by every copy of a Lease
// that Guard.Do or Guard.Claim handed out. Do keeps it in the run's
// keepalive, so a key that uses no steps costs no allocation for it.
type stepLog struct {
	g *Guard

	mu    sync.Mutex
	known []StepResult // recorded, in order
	next  int          // steps this attempt asked for so far
	asked []string     // their names
	busy  string       // the step running, if any
	// stop is why no further step may run in this attempt: the lease was
	// lost, or a step's outcome is unknown.
	stop error
	// ended: the holder ended its claim (Complete, Fail or Release, the
	// write Do or DoBatch makes when the effect returns): it holds the
	// key no longer, so no step runs under the lease any more.
	ended bool
	// holder, if set, keeps the lease alive (Do's, Hold's or Keep's
	// keepalive, DoBatch's beat, as its item-th lease): a step that finds
	// the lease lost tells it, so the effect's context ends at once, as it
	// does when the heartbeat finds the loss, and that one loss is
	// observed once.
	holder lossSink
	item   int
	// lossSeen: a loss of the lease was observed (EventLeaseLost) other
	// than by its holder: by a step without one, by Extend, or by a write
	// refused for it; a later refusal for the same loss is not observed
	// again (Lease.lossObserved).
	lossSeen bool
}

// lossObserved reports whether a loss of l's lease was observed already:
// by the heartbeat that keeps it (Do's, Hold's, Keep's or KeepAlive's, a
// batch's), by a step, by Extend, or by a write that ended the claim. A
// Lease built by hand knows of none.
func (l Lease) lossObserved() bool {
	s := l.steps
	if s == nil {
		return false
	}
	s.mu.Lock()
	seen, holder, item := s.lossSeen, s.holder, s.item
	s.mu.Unlock()
	return seen || holder != nil && holder.lossObservedFor(item)
}

// markLossObserved records that a loss of l's lease was observed.
func (l Lease) markLossObserved() {
	if s := l.steps; s != nil {
		s.mu.Lock()
		s.lossSeen = true
		s.mu.Unlock()
	}
}

// errClaimEnded is the error of a step asked under a lease whose holder
// ended its claim.
var errClaimEnded = fmt.Errorf("%w: its holder ended the claim (Complete, Fail or Release)", ErrLeaseLost)

// end marks the claim the log belongs to ended by its holder, as the
// write that ends it is about to be sent: a step asked after it does not
// run. s may be nil (a Lease built by hand).
func (s *stepLog) end() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

// lossSink is what keeps a lease alive, told by a step that found it lost.
type lossSink interface {
	// stepLost ends the item-th lease's effect context with err and
	// reports whether the loss was observed already.
	stepLost(item int, err error) (observed bool)
	// lossObservedFor reports whether the item-th lease's loss was
	// observed.
	lossObservedFor(item int) bool
}

// run is Step on raw bytes.
func (s *stepLog) run(ctx context.Context, lease Lease, name string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("idemguard: step %q needs a Lease from Guard.Do or Guard.Claim (this one was built by hand)", name)
	}
	s.mu.Lock()
	i := s.next
	if err := CheckStep(i, name); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("step %s: %w", lease.Key, err)
	}
	switch {
	case s.busy != "":
		busy := s.busy
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s step %q began while step %q runs: steps run one after another", ErrStepOrder, lease.Key, name, busy)
	case s.ended:
		s.mu.Unlock()
		return nil, fmt.Errorf("step %s %q not run: %w", lease.Key, name, errClaimEnded)
	case s.stop != nil:
		err := s.stop
		s.mu.Unlock()
		return nil, fmt.Errorf("step %s %q not run: an earlier step of this attempt: %w", lease.Key, name, err)
	}
	for _, n := range s.asked {
		if n == name {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %s step %q asked twice in one attempt", ErrStepOrder, lease.Key, name)
		}
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("step %s %q not run: %w", lease.Key, name, context.Cause(ctx))
	}
	if i < len(s.known) {
		rec := s.known[i]
		if rec.Name != name {
			s.mu.Unlock()
			return nil, &StepOrderError{Key: lease.Key, Index: i, Asked: name, Recorded: rec.Name, Steps: len(s.known)}
		}
		s.next++
		s.asked = append(s.asked, name)
		s.mu.Unlock()
		return bytes.Clone(rec.Result), nil
	}
	if !KeepsSteps(s.g.store) {
		s.mu.Unlock()
		return nil, fmt.Errorf("step %s %q: %w (%T)", lease.Key, name, ErrStepsUnsupported, s.g.store)
	}
	store := s.g.store.(StepStore) // KeepsSteps: a StepStore
	s.busy = name
	s.mu.Unlock()
	defer func() { // also when fn panics
		s.mu.Lock()
		s.busy = ""
		s.mu.Unlock()
	}()

	result, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	result = bytes.Clone(result) // fn's slice may change after it returned
	wctx, cancel := s.g.detached(ctx)
	err = bounded(wctx, store.SaveStep(wctx, lease, i, StepResult{Name: name, Result: result}))
	cancel()

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("step %s %q: %w", lease.Key, name, err)
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrUnavailable) {
			s.stop = err
		}
		observed := false
		if errors.Is(err, ErrLeaseLost) {
			observed = s.lossSeen
			if s.holder != nil && s.holder.stepLost(s.item, err) {
				observed = true
			}
			s.lossSeen = true
		}
		if !observed {
			s.g.observeErr(ctx, lease.Key, lease.Attempt, err)
		}
		return nil, err
	}
	s.known = append(s.known[:i], StepResult{Name: name, Result: result})
	s.next++
	s.asked = append(s.asked, name)
	return bytes.Clone(result), nil
}

// KeyFor returns the key a step of this lease passes to a service that
// takes its own idempotency key (Stripe's Idempotency-Key, PayPal's
// PayPal-Request-Id, Adyen's idempotency-key, another idemguard service):
// DownstreamKey(l.Key, name). It is the same in every attempt of the key
// and differs for every step name and every key.
func (l Lease) KeyFor(name string) string { return DownstreamKey(l.Key, name) }

// DownstreamKey derives the idempotency key for the downstream call named
// name of the effect guarded by key: a UUID (RFC 9562 version 8, 122 bits
// of SHA-256 over the key's scope, ID and name), 36 characters of
// lower-case hex and hyphens. Every provider that takes a client's key
// accepts it: Stripe (at most 255 characters), PayPal, Adyen (at most 64),
// and APIs that require a UUID. For one that allows fewer characters
// (Amazon Pay: 32), drop the hyphens.
//
// The key is a function of its inputs only: the same in every attempt, in
// every process, after a restart. A client that reuses an idempotency key
// after the guard forgot it (Options.TTL) gets the same downstream key,
// which the service may still remember: it then answers with its earlier
// result, or an error when the request differs (Stripe: 400). Keep the
// guard's TTL at least as long as the service keeps its keys where that
// matters.
func DownstreamKey(key Key, name string) string {
	h := sha256.New()
	var n [4]byte
	h.Write([]byte("idemguard downstream key v1\x00"))
	for _, part := range []string{key.Scope, key.ID, name} {
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	var u [sha256.Size]byte
	h.Sum(u[:0])
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10
	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], u[10:16])
	return string(out[:])
}
