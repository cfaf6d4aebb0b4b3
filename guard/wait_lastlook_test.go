package guard_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// getHooked calls afterGet after each Get the store answered, counts the
// Gets whose context had already ended when Wait made them, and keeps the
// last Get's error.
type getHooked struct {
	guard.Store
	afterGet func(n int32)
	gets     atomic.Int32
	deadGets atomic.Int32
	lastErr  atomic.Pointer[error]
}

func (h *getHooked) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	n := h.gets.Add(1)
	if ctx.Err() != nil {
		h.deadGets.Add(1)
	}
	rec, err := h.Store.Get(ctx, key)
	h.lastErr.Store(&err)
	if h.afterGet != nil {
		h.afterGet(n)
	}
	return rec, err
}

// slowLastLook reports whether h's last Get, made with a live context,
// failed: its read did not answer in time on a loaded machine.
func (h *getHooked) slowLastLook() bool {
	e := h.lastErr.Load()
	return e != nil && *e != nil
}

// Wait's last look reads the record: it comes a little before the
// deadline, with time to answer, so a result stored after the look before
// it is heard. (It was made at the deadline under a context that ended
// there, and could never read: Wait answered *InProgressError for a key
// whose result had been stored for most of a poll interval.) The holder
// completes right after the look before the last (less than a poll
// apart from the deadline); a round in which a loaded machine left that
// last look no time, or its read no time to answer, proves nothing and
// runs again with a longer Timeout.
func TestWaitLastLookReads(t *testing.T) {
	testenv.OnTime(t, "a Timeout", 300*time.Millisecond, 4, func(timeout time.Duration) (late bool) {
		real := realStore(t)
		h := &getHooked{Store: real}
		g := guard.New(h, guard.Options{Lease: time.Minute})
		key := guard.Key{Scope: "wait-last-look", ID: t.Name() + time.Now().Format("150405.000000000")}
		lease := holdKey(t, g, key)
		deadline := time.Now().Add(timeout) // Wait's, or a little before it
		var completed, tooLate atomic.Bool
		h.afterGet = func(int32) {
			left := time.Until(deadline)
			if completed.Load() || left > 110*time.Millisecond { // the next look is not the last
				return
			}
			tooLate.Store(left < 40*time.Millisecond)
			if err := real.Complete(context.Background(), lease, []byte("done"), time.Hour); err != nil {
				t.Errorf("holder's complete: %v", err)
			}
			completed.Store(true)
		}
		out, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: timeout})
		if h.deadGets.Load() > 0 {
			t.Fatalf("Wait made %d of %d looks under a context that had ended: they could not read the record", h.deadGets.Load(), h.gets.Load())
		}
		if err == nil && out.Status == guard.Replay {
			return false
		}
		if !completed.Load() || tooLate.Load() || h.slowLastLook() {
			return true
		}
		t.Fatalf("Wait answered %v (status %v) with %d looks: its last look did not hear the result stored before it", err, out.Status, h.gets.Load())
		return false
	})
}

// A Timeout shorter than the first poll: Wait still reads the record once,
// under a live context, and replays a key completed before it was called
// (unless that read could not answer in time on a loaded machine). (It
// read only under a context that had ended, and answered in progress.)
func TestWaitShortTimeoutLooks(t *testing.T) {
	real := realStore(t)
	h := &getHooked{Store: real}
	g := guard.New(h, guard.Options{Lease: time.Minute})
	key := guard.Key{Scope: "wait-last-look", ID: t.Name() + time.Now().Format("150405.000000000")}
	lease := holdKey(t, g, key)
	if err := g.Complete(bg, lease, []byte("done")); err != nil {
		t.Fatal(err)
	}
	out, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: 5 * time.Millisecond})
	if h.gets.Load() == 0 || h.deadGets.Load() > 0 {
		t.Fatalf("Wait made %d looks, %d of them under a context that had ended: it never read the record", h.gets.Load(), h.deadGets.Load())
	}
	if (err != nil || out.Status != guard.Replay) && !h.slowLastLook() {
		t.Fatalf("Wait on a completed key answered %v (status %v) though its look read the record", err, out.Status)
	}
}
