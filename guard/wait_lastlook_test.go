package guard_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// getHooked calls afterGet after each Get the store answered, and counts
// the Gets whose context had already ended when Wait made them.
type getHooked struct {
	guard.Store
	afterGet func(n int32)
	gets     atomic.Int32
	deadGets atomic.Int32
}

func (h *getHooked) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	n := h.gets.Add(1)
	if ctx.Err() != nil {
		h.deadGets.Add(1)
	}
	rec, err := h.Store.Get(ctx, key)
	if h.afterGet != nil {
		h.afterGet(n)
	}
	return rec, err
}

// Wait's last look reads the record: it comes a little before the
// deadline, with time to answer, so a result stored after the look before
// it is heard. (It was made at the deadline under a context that ended
// there, and could never read: Wait answered *InProgressError for a key
// whose result had been stored for most of a poll interval.)
func TestWaitLastLookReads(t *testing.T) {
	real := realStore(t)
	h := &getHooked{Store: real}
	g := guard.New(h, guard.Options{Lease: time.Minute})
	key := guard.Key{Scope: "wait-last-look", ID: t.Name() + time.Now().Format("150405.000000000")}
	lease := holdKey(t, g, key)

	var storedAt atomic.Int64
	h.afterGet = func(n int32) {
		if n == 1 { // the holder completes right after Wait's first look
			if err := real.Complete(context.Background(), lease, []byte("done"), time.Hour); err != nil {
				t.Errorf("holder's complete: %v", err)
			}
			storedAt.Store(time.Now().UnixNano())
		}
	}
	out, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: 30 * time.Millisecond})
	returned := time.Now()
	if err != nil || out.Status != guard.Replay {
		t.Fatalf("Wait answered %v (status %v) %s after the result was stored, with %d looks of which %d under an ended context: "+
			"its last look, at the deadline, could not read the record",
			err, out.Status, returned.Sub(time.Unix(0, storedAt.Load())).Round(time.Millisecond), h.gets.Load(), h.deadGets.Load())
	}
}

// A Timeout shorter than the first poll: Wait still reads the record once,
// and replays a key completed before it was called. (It never read, and
// answered in progress.)
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
	if err != nil || out.Status != guard.Replay {
		t.Fatalf("Wait on a completed key answered %v (status %v); looks %d, under an ended context %d", err, out.Status, h.gets.Load(), h.deadGets.Load())
	}
}
