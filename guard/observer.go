package guard

import "context"

// EventKind names what happened to a key.
type EventKind uint8

// Event kinds, one per outcome an operator may want to count or log.
const (
	EventAcquired    EventKind = iota + 1 // a claim was taken; the effect runs
	EventRecovered                        // a claim was taken over from a holder whose lease ran out
	EventReplayed                         // a stored result was returned without running the effect
	EventInProgress                       // a claim met a live holder
	EventMismatch                         // a claim met another fingerprint
	EventExhausted                        // a claim met a key out of attempts
	EventCompleted                        // a result was stored
	EventFailed                           // an attempt failed and was recorded as failed
	EventReleased                         // a claim was undone (panic, or the caller chose to)
	EventLeaseLost                        // the holder lost its lease
	EventUnavailable                      // the store could not be reached
	EventCorrupt                          // a stored record could not be read (ErrCorrupt); nothing ran
)

var eventNames = [...]string{"", "acquired", "recovered", "replayed", "in_progress", "mismatch",
	"exhausted", "completed", "failed", "released", "lease_lost", "unavailable", "corrupt"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing that happened to a key.
type Event struct {
	Kind    EventKind
	Key     Key
	Attempt int   // the attempt, where one is known
	Err     error // the error, for failures, lease loss and unavailability
}

// Observer hears every Event of a Guard. It is called synchronously: on the
// caller's goroutine, or for the heartbeat's events (a lease lost, an
// extension refused) on the heartbeat's, before the call they belong to
// returns. It must be quick, must not wait for that call, and must be
// safe for concurrent use.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }
