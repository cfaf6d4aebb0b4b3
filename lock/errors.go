package lock

import (
	"errors"
	"fmt"

	"github.com/go-redsync/redsync/v4"
)

// Sentinel errors. Check them with errors.Is. The errors this package
// returns also wrap redsync's own (errors.As with *redsync.ErrTaken or
// *redsync.RedisError finds them) for callers that want the node details.
var (
	// ErrNotObtained: another holder has the lock (or competing attempts
	// split the nodes between them and nobody got a quorum; or, with
	// Options.Fencing, the fence round found its number on a node already,
	// as after another holder's round; or the lock's validity ran out
	// while the fence was taken). TryObtain and TryDo return it after one attempt;
	// Obtain and Do after Options.Tries attempts, or together with ctx's
	// error when ctx ended while waiting.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrUnavailable: fewer than a quorum of nodes answered (or, taking a
	// fence, a node whose counter was read did not answer the write), so
	// nothing could be decided: the lock was not obtained (or not
	// extended, or not released). It is not known whether anyone else
	// holds it.
	ErrUnavailable = errors.New("lock: quorum of nodes unavailable")
	// ErrLost: the caller no longer holds the lock: it expired, was taken
	// over, or could not be extended before its validity ran out. Do
	// cancels fn's context with this cause.
	ErrLost = errors.New("lock: lost")
	// ErrInvalidName: the lock name is empty, longer than MaxNameLen, or
	// ends in ":fence" or ":fence:round".
	ErrInvalidName = errors.New("lock: invalid name")
)

// tally counts what the nodes answered, from the (joined) error redsync
// returns: nodes that could not be reached, nodes where the key held
// another value (or none, for an extension), nodes where it had expired.
type tally struct {
	unreachable int // *redsync.RedisError: no answer, or an error reply
	taken       int // *redsync.ErrNodeTaken, or the nodes of *redsync.ErrTaken
	expired     int // redsync.ErrLockAlreadyExpired
	other       int // anything else (redsync.ErrFailed, redsync.ErrExtendFailed)
}

func count(err error) tally {
	var t tally
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		switch e := err.(type) { // redsync returns pointers; values are matched too
		case *redsync.RedisError, redsync.RedisError:
			t.unreachable++
			return
		case *redsync.ErrNodeTaken, redsync.ErrNodeTaken:
			t.taken++
			return
		case *redsync.ErrTaken:
			t.taken += len(e.Nodes)
			return
		case redsync.ErrTaken:
			t.taken += len(e.Nodes)
			return
		}
		if err == redsync.ErrLockAlreadyExpired {
			t.expired++
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		t.other++
	}
	walk(err)
	return t
}

// acquireErr turns a failed acquisition attempt into ErrUnavailable (too
// few nodes answered to grant anyone the lock) or ErrNotObtained.
func (l *Locker) acquireErr(name string, err error) error {
	t := count(err)
	if l.nodes-t.unreachable < l.quorum {
		return fmt.Errorf("%w: lock %q: %d of %d nodes unreachable or answering an error: %w", ErrUnavailable, name, t.unreachable, l.nodes, err)
	}
	return fmt.Errorf("%w: lock %q: %w", ErrNotObtained, name, err)
}

// extendErr turns a failed extension into ErrLost (no quorum can hold the
// caller's value any more, or the validity was spent) or ErrUnavailable
// (too few nodes answered; the lock may still be held until it expires).
func (l *Locker) extendErr(name string, err error) error {
	t := count(err)
	if t.taken+t.expired > l.nodes-l.quorum || errors.Is(err, redsync.ErrExtendFailed) {
		return fmt.Errorf("%w: lock %q: not held on a quorum of nodes: %w", ErrLost, name, err)
	}
	return fmt.Errorf("%w: lock %q: extend: %w", ErrUnavailable, name, err)
}

// releaseErr turns a failed release into ErrLost (the lock had already
// expired or been taken over on too many nodes) or ErrUnavailable. held:
// the release was sent within the lock's validity, so a node whose key
// was gone had deleted it already (a deletion sent twice), and counts as
// released: nil if that makes a quorum.
func (l *Locker) releaseErr(name string, err error, held bool) error {
	t := count(err)
	if held {
		if l.nodes-t.unreachable-t.taken-t.other >= l.quorum {
			return nil
		}
		t.expired = 0
	}
	if t.taken+t.expired > l.nodes-l.quorum {
		return fmt.Errorf("%w: lock %q: not held at release: %w", ErrLost, name, err)
	}
	return fmt.Errorf("%w: lock %q: release: %w", ErrUnavailable, name, err)
}
