package proof

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestWindowsOverlaps: the windows check the nemesis runs can fail. Two
// holders of one key acting at once are reported, every such pair (a
// long window against each later one it covers), and nothing else:
// windows that only touch, and windows of different keys, are not.
func TestWindowsOverlaps(t *testing.T) {
	k1, k2 := guard.Key{Scope: "w", ID: "1"}, guard.Key{Scope: "w", ID: "2"}
	ms := time.Millisecond
	w := NewWindows()
	w.byKey[k1] = []Window{
		{Key: k1, Fence: 3, Start: 50 * ms, End: 60 * ms},
		{Key: k1, Fence: 1, Start: 0, End: 100 * ms},
		{Key: k1, Fence: 2, Start: 10 * ms, End: 20 * ms},
		{Key: k1, Fence: 4, Start: 100 * ms, End: 120 * ms}, // starts as fence 1 ends: no overlap
	}
	w.byKey[k2] = []Window{
		{Key: k2, Fence: 1, Start: 0, End: 100 * ms},
		{Key: k2, Fence: 2, Start: 100 * ms, End: 200 * ms},
	}
	got := w.Overlaps()
	if len(got) != 2 {
		t.Fatalf("%d overlaps reported, want 2 (fence 1 with 2 and with 3 of %s): %q", len(got), k1, got)
	}
	if n, _ := w.Count(); n != 6 {
		t.Fatalf("Count = %d windows, want 6", n)
	}
}

// TestEffectWindowStopsAtCancellation: a window ends at the last action
// made with its context live; an effect that finds its context ended is
// marked cut and its window does not grow. Two effects opened on one key,
// the first acting after the second began, overlap.
func TestEffectWindowStopsAtCancellation(t *testing.T) {
	w := NewWindows()
	lease := func(tok string, fence int64) guard.Lease {
		return guard.Lease{Key: guard.Key{Scope: "w", ID: "k"}, Token: tok, Fence: fence}
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	a := w.Open(lease("A", 1))
	if !a.Live(ctxA) {
		t.Fatal("a live context reported ended")
	}
	cancelA()
	end := a.win.End
	if a.Live(ctxA) || !a.win.Cut || a.win.End != end {
		t.Fatalf("after cancellation: window %+v (end before %s), want cut and unchanged", a.win, end)
	}
	a.Close()
	b := w.Open(lease("B", 2))
	b.Close()
	if o := w.Overlaps(); len(o) != 0 {
		t.Fatalf("a window cut before the next began overlaps it: %q", o)
	}

	// C acts after D began: an overlap, whatever the clock's resolution
	// (C acts until its window ends after D's start).
	ctx := context.Background()
	c := w.Open(lease("C", 3))
	d := w.Open(lease("D", 4))
	for c.Live(ctx) && c.win.End <= d.win.Start {
	}
	c.Close()
	d.Close()
	if o := w.Overlaps(); len(o) != 1 {
		t.Fatalf("%d overlaps, want C's with D's: %q", len(o), o)
	}
}
