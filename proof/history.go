package proof

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
)

// OpKind names a Store call.
type OpKind uint8

// The calls a Recorder records.
const (
	OpClaim OpKind = iota + 1
	OpComplete
	OpFail
	OpRelease
	OpExtend
	OpGet
	OpStep // guard.StepStore.SaveStep (history_steps.go)
)

var opNames = [...]string{"", "claim", "complete", "fail", "release", "extend", "get", "step"}

// String names the call, e.g. "claim".
func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return "op?"
}

// Input is what a recorded call asked.
type Input struct {
	Op          OpKind
	Key         guard.Key
	Token       string
	Fingerprint string // claim
	MaxAttempts int    // claim
	Value       string // complete: the result; fail: the reason; step: its result
	Name        string // step: its name
	Index       int    // step: how many steps come before it
}

// Output is how a recorded call ended.
type Output struct {
	// Unknown: the call returned an error that says nothing about the key
	// (unavailable, timed out): it may or may not have taken effect. Its
	// return is placed at the end of the history, as Jepsen does.
	Unknown bool
	// Bad: the call returned an error no correct store gives (a corrupt
	// reply, a script error). No model step accepts it.
	Bad bool
	Err string // the error's text, for the visualisation

	OK bool // complete/fail/release/extend/step: true = OK, false = LOST
	// Order: a step refused for the record's steps (guard.ErrStepOrder).
	Order bool

	// claim
	Status    guard.Status
	Fence     int64
	Attempt   int
	Recovered bool
	Result    string // replay: the stored result
	LastError string // exhausted: the last failure
	Steps     string // acquired: the steps reported (see stepsString)

	// get
	Found  bool
	Record Snapshot
}

// Snapshot is a record as the model keeps it (and as Get reports it).
type Snapshot struct {
	State       guard.State // 0: absent
	Token       string
	Fingerprint string
	Fence       int64
	Attempt     int
	Recovered   bool
	Result      string
	LastError   string
	// Steps are the steps recorded, in order (see stepsString): a
	// step's result, once stored, never changes.
	Steps string
	// Ptok is the token of the holder that ended its claim by fail or
	// release before the current holder took the key (on an absent key:
	// the token that released it). A retry of that fail or release still
	// answers OK. Get does not report it.
	Ptok string
}

// Recorder is a guard.Store that passes every call to another Store and
// records it, with its invocation and return times and its outcome, as a
// porcupine history. It is safe for concurrent use.
type Recorder struct {
	inner guard.Store
	start time.Time

	// CallTimeout, if positive, bounds every call's context. Keep it under
	// the guard's lease: go-redis re-sends a script after a lost reply, and
	// a claim re-sent after the lease it took ran out (and another holder
	// recovered the key) answers IN_PROGRESS for a claim that took effect.
	// Zero leaves contexts as they are.
	CallTimeout time.Duration

	mu  sync.Mutex
	ops []porcupine.Operation
}

var _ guard.Store = (*Recorder)(nil)

// NewRecorder returns a Recorder over inner, with an empty history.
func NewRecorder(inner guard.Store) *Recorder {
	return &Recorder{inner: inner, start: time.Now()}
}

type clientKey struct{}

// WithClient marks ctx with the id of the client (a goroutine or process)
// that makes the calls, for the visualisation's rows.
func WithClient(ctx context.Context, id int) context.Context {
	return context.WithValue(ctx, clientKey{}, id)
}

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *Recorder) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.CallTimeout > 0 {
		return context.WithTimeout(ctx, r.CallTimeout)
	}
	return ctx, func() {}
}

func (r *Recorder) record(ctx context.Context, in Input, call int64, out Output, err error) {
	ret := r.now()
	switch {
	case err == nil:
	case errors.Is(err, guard.ErrLeaseLost):
		out = Output{OK: false}
	case errors.Is(err, guard.ErrNotFound) && in.Op == OpGet:
		out = Output{Found: false}
	case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		out = Output{Unknown: true, Err: err.Error()}
	default:
		out = Output{Bad: true, Err: err.Error()}
	}
	id, _ := ctx.Value(clientKey{}).(int)
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
	r.mu.Unlock()
}

// History returns the calls recorded so far. Calls whose outcome is
// Unknown return after every other call.
func (r *Recorder) History() []porcupine.Operation {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	var end int64
	for _, op := range ops {
		end = max(end, op.Return)
	}
	for i := range ops {
		if ops[i].Output.(Output).Unknown {
			ops[i].Return = end + 1
		}
	}
	return ops
}

// Claim implements guard.Store.
func (r *Recorder) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	in := Input{Op: OpClaim, Key: req.Key, Token: req.Token, Fingerprint: req.Fingerprint, MaxAttempts: req.MaxAttempts}
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	o, err := r.inner.Claim(cctx, req)
	out := Output{Status: o.Status, Result: string(o.Result), LastError: o.LastError, Steps: stepsString(o.Steps)}
	switch o.Status {
	case guard.Acquired:
		out.Fence, out.Attempt, out.Recovered = o.Lease.Fence, o.Lease.Attempt, o.Lease.Recovered
	case guard.Exhausted:
		out.Attempt = o.Attempts
	}
	r.record(ctx, in, call, out, err)
	return o, err
}

// Complete implements guard.Store.
func (r *Recorder) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	err := r.inner.Complete(cctx, lease, result, ttl)
	r.record(ctx, Input{Op: OpComplete, Key: lease.Key, Token: lease.Token, Value: string(result)}, call, Output{OK: true}, err)
	return err
}

// Fail implements guard.Store.
func (r *Recorder) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	err := r.inner.Fail(cctx, lease, reason, ttl)
	r.record(ctx, Input{Op: OpFail, Key: lease.Key, Token: lease.Token, Value: reason}, call, Output{OK: true}, err)
	return err
}

// Release implements guard.Store.
func (r *Recorder) Release(ctx context.Context, lease guard.Lease) error {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	err := r.inner.Release(cctx, lease)
	r.record(ctx, Input{Op: OpRelease, Key: lease.Key, Token: lease.Token}, call, Output{OK: true}, err)
	return err
}

// Extend implements guard.Store.
func (r *Recorder) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	err := r.inner.Extend(cctx, lease, d)
	r.record(ctx, Input{Op: OpExtend, Key: lease.Key, Token: lease.Token}, call, Output{OK: true}, err)
	return err
}

// Get implements guard.Store.
func (r *Recorder) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	rec, err := r.inner.Get(cctx, key)
	out := Output{Found: true, Record: Snapshot{
		State: rec.State, Token: rec.Token, Fingerprint: rec.Fingerprint, Fence: rec.Fence,
		Attempt: rec.Attempt, Recovered: rec.Recovered, Result: string(rec.Result), LastError: rec.LastError,
		Steps: stepsString(rec.Steps),
	}}
	r.record(ctx, Input{Op: OpGet, Key: key}, call, out, err)
	return rec, err
}
