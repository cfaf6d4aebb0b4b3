package proof

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// TestCutWindowStillCounts: an effect that acted live after its successor
// began and only then saw its context end (the lease's deadline came too
// late) overlaps, cut or not. Most overlaps the nemesis can meet are of
// such windows: a holder whose context ends late still ends, and stops.
func TestCutWindowStillCounts(t *testing.T) {
	w := NewWindows()
	key := guard.Key{Scope: "w", ID: "cut"}
	ctxA, cancelA := context.WithCancel(context.Background())
	a := w.Open(guard.Lease{Key: key, Token: "A", Fence: 1})
	b := w.Open(guard.Lease{Key: key, Token: "B", Fence: 2})
	for a.Live(ctxA) && a.win.End <= b.win.Start {
	}
	cancelA()
	if a.Live(ctxA) {
		t.Fatal("a cancelled context reported live")
	}
	a.Close()
	b.Close()
	if n, cut := w.Count(); n != 2 || cut != 1 {
		t.Fatalf("Count = %d windows, %d cut; want 2, 1", n, cut)
	}
	if o := w.Overlaps(); len(o) != 1 {
		t.Fatalf("%d overlaps, want the cut window's with its successor's: %q", len(o), o)
	}
}
