package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// A forward step is recorded just before the first write of a request,
// and that write can still fail with nothing written (the connection was
// reset or closed, its deadline passed): the upstream then never saw the
// request. The attempt says so with a second step, "unsent" (for the n-th
// forward, "forward.n" and "unsent.n"), recorded before its key is
// released; a release keeps a record's steps (docs/design.md, "Steps and
// downstream keys"), so the next claim finds both, and records its own
// forward step after them instead of answering outcome-unknown. A forward
// step without its unsent step is one that may have been delivered; so is
// every forward whose unsent step could not be stored: when in doubt the
// key answers outcome-unknown, never a second send. The upstream's
// Idempotency-Key stays Lease.KeyFor("forward") for every forward.

// forwardMark is what a forward step holds: when it was recorded, and the
// fence of the claim that recorded it, so each claim's step is its own.
// Stores answer only the holder OK for a step byte for byte one the
// record holds (guard.StepStore); before they did, a step holding the
// time alone let a holder whose lease had run out record "its" step in
// the millisecond its successor did, take the successor's for its own,
// and send the request again. Records of earlier gateways hold the time
// alone (a JSON number).
type forwardMark struct {
	At    int64 `json:"at"` // Unix milliseconds
	Fence int64 `json:"fence"`
}

// UnmarshalJSON reads a mark, or the bare time earlier gateways stored.
func (m *forwardMark) UnmarshalJSON(b []byte) error {
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] != '{' {
		*m = forwardMark{}
		return json.Unmarshal(b, &m.At)
	}
	type plain forwardMark
	return json.Unmarshal(b, (*plain)(m))
}

// errPeek is the error a step's function returns to look for the step
// without recording it (guard.Step runs the function only for a step the
// record does not hold, and stores nothing when it fails).
var errPeek = errors.New("gateway: looking for a step, not recording it")

// forwardName and unsentName are the names of the n-th forward (from 1)
// and of the step that says it sent nothing.
func forwardName(n int) string {
	if n == 1 {
		return forwardStep
	}
	return forwardStep + "." + strconv.Itoa(n)
}

func unsentName(n int) string { return "unsent." + strconv.Itoa(n) }

// recordForward records this attempt's forward step after the forwards of
// earlier attempts that sent nothing. ran reports that it did; otherwise
// at is when the earliest forward that may have been delivered was
// recorded, or err why nothing could be recorded.
func (a *attempt) recordForward(now time.Time) (ran bool, at time.Time, err error) {
	for n := 1; ; n++ {
		ran = false
		mark, err := guard.Step(a.ctx, a.lease, forwardName(n), func(context.Context) (forwardMark, error) {
			// Only a step this attempt asks the store for may be one
			// whose store call failed after the store took it: a known
			// step (an earlier attempt's) is never marked unsent by it.
			ran, a.tryN = true, n
			return forwardMark{At: now.UnixMilli(), Fence: a.lease.Fence}, nil
		})
		switch {
		case err != nil:
			return false, time.Time{}, err
		case ran:
			a.forwardN = n
			return true, now, nil
		}
		_, err = guard.Step(a.ctx, a.lease, unsentName(n), func(context.Context) (int64, error) { return 0, errPeek })
		switch {
		case errors.Is(err, errPeek):
			return false, time.UnixMilli(mark.At), nil // that forward may have been delivered
		case err != nil:
			return false, time.Time{}, err
		}
	}
}

// earlierForward looks, recording nothing, for a forward of an earlier
// attempt that may have been delivered (a forward step without its unsent
// step), for an attempt that never came to record its own: its request
// never reached a write (the dial failed; the route's timeout, or the
// gateway's stop, came first), so recordForward never ran. found reports
// one, and at when it was recorded.
func (a *attempt) earlierForward() (found bool, at time.Time, err error) {
	ctx := context.WithoutCancel(a.ctx)
	for n := 1; ; n++ {
		mark, err := guard.Step(ctx, a.lease, forwardName(n), func(context.Context) (forwardMark, error) {
			return forwardMark{}, errPeek
		})
		switch {
		case errors.Is(err, errPeek):
			return false, time.Time{}, nil // every forward before sent nothing
		case err != nil:
			return false, time.Time{}, err
		}
		_, err = guard.Step(ctx, a.lease, unsentName(n), func(context.Context) (int64, error) { return 0, errPeek })
		switch {
		case errors.Is(err, errPeek):
			return true, time.UnixMilli(mark.At), nil // that forward may have been delivered
		case err != nil:
			return false, time.Time{}, err
		}
	}
}

// markUnsent records that this attempt's forward sent nothing, so that
// the next claim of the key may forward (see above). It reports whether
// the mark is stored; if not, the key must not be released as
// not-forwarded on the strength of it (a release would leave the forward
// step alone, and the next claim would answer outcome-unknown: safe, but
// then say so).
func (a *attempt) markUnsent() error {
	// The attempt's context may have ended (the route's timeout, the
	// gateway stopping): the mark is still written, under the lease.
	ctx := context.WithoutCancel(a.ctx)
	_, err := guard.Step(ctx, a.lease, unsentName(a.forwardN), func(context.Context) (int64, error) {
		return time.Now().UnixMilli(), nil
	})
	return err
}

// A forward step's store call can fail after the store took it: Redis
// answered after fallback's bound on a call (or the client's read
// timeout), on a loaded machine. The gate then refuses every write of the
// attempt (its stepErr), so nothing was sent, yet the record may hold the
// step, with no unsent mark (guard.Step stops an attempt's steps after an
// unavailable store), and the next claim would answer outcome-unknown
// for a request the upstream never saw. markLateUnsent marks it unsent
// straight through the store (guard.StepStore.SaveStep), at the index
// after it: a gateway's record holds its chain of steps alone (forward,
// unsent.1, forward.2, unsent.2, ...), so forwardName(n) is step 2n-2 and
// unsentName(n) step 2n-1. SaveStep is a compare-and-set on this claim's
// token and on the number of steps: it takes the mark only from the holder
// of a record holding exactly 2n-1 steps, and only for a forward step this
// attempt asked the store for (tryN; not one an earlier attempt recorded,
// which the claim answered), so the last of them is this attempt's. A record without it (the step
// was not stored, or not yet) refuses the mark; a step that lands after
// that is left unmarked, and the next claim answers outcome-unknown, the
// safe side. One write, no read: fallback lets a holder's writes through
// while its breaker is open, not reads.
func (a *attempt) markLateUnsent(store guard.Store) (marked bool, err error) {
	ss, ok := store.(guard.StepStore)
	if !ok || a.tryN == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), lateMarkTimeout)
	defer cancel()
	b, err := json.Marshal(time.Now().UnixMilli())
	if err != nil {
		return false, err
	}
	err = ss.SaveStep(ctx, a.lease, 2*a.tryN-1, guard.StepResult{Name: unsentName(a.tryN), Result: b})
	var order *guard.StepOrderError
	switch {
	case errors.As(err, &order):
		return false, nil // the forward step is not in the record
	case err != nil:
		return false, fmt.Errorf("gateway: marking a forward step whose store call failed unsent: %w", err)
	}
	return true, nil
}

// lateMarkTimeout bounds markLateUnsent's store call.
const lateMarkTimeout = 5 * time.Second
