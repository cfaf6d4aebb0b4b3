package adapter

import (
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func TestRunTimesAverage(t *testing.T) {
	var rt RunTimes
	if _, ok := rt.Typical("a"); ok {
		t.Fatal("a name never run has a typical time")
	}
	rt.Observe("a", 4*time.Second)
	if d, ok := rt.Typical("a"); !ok || d != 4*time.Second {
		t.Fatalf("first run: %v %v, want 4s", d, ok)
	}
	rt.Observe("a", 0)
	if d, _ := rt.Typical("a"); d != 3*time.Second { // a quarter of the way to the newest
		t.Fatalf("after 4 s and 0: %v, want 3s", d)
	}
	for range 40 {
		rt.Observe("a", time.Second)
	}
	if d, _ := rt.Typical("a"); d < time.Second || d > time.Second+time.Millisecond {
		t.Fatalf("after runs of 1 s: %v", d)
	}
	if _, ok := rt.Typical("b"); ok {
		t.Fatal("b shares a's time")
	}
}

func TestRunTimesBounded(t *testing.T) {
	var rt RunTimes
	for i := range 3 * MaxRunTimes {
		rt.Observe("r-"+strconv.Itoa(i), time.Second)
		if n := rt.Len(); n > MaxRunTimes {
			t.Fatalf("%d names kept after %d", n, i+1)
		}
	}
	last := "r-" + strconv.Itoa(3*MaxRunTimes-1)
	if _, ok := rt.Typical(last); !ok {
		t.Fatal("the newest name was dropped")
	}
}

// TestRunTimesConcurrent is for -race: many handlers record at once.
func TestRunTimesConcurrent(t *testing.T) {
	var rt RunTimes
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				rt.Observe("m-"+strconv.Itoa((g*500+i)%(MaxRunTimes+7)), time.Duration(i)*time.Millisecond)
				rt.Typical("m-1")
			}
		})
	}
	wg.Wait()
	if n := rt.Len(); n == 0 || n > MaxRunTimes {
		t.Fatalf("%d names", n)
	}
}

// view returns a string that shares b's bytes, as a fasthttp request's
// strings share its reused buffers.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// The table keeps names of its own: a name passed to Observe that shares
// a buffer reused later (a fasthttp view) changes no key of the table,
// whether the name is new to it or known (Go's maps replace the key of an
// entry they assign to), and recording a known name allocates nothing.
func TestRunTimesKeepsOwnNames(t *testing.T) {
	var rt RunTimes
	buf := []byte("/orders")
	rt.Observe(view(buf), time.Second) // new
	copy(buf, "/refund")
	if _, ok := rt.Typical("/orders"); !ok {
		t.Fatal("a new name was kept as the caller's buffer, which then changed")
	}
	copy(buf, "/orders")
	rt.Observe(view(buf), time.Second) // known
	copy(buf, "/refund")
	if _, ok := rt.Typical("/orders"); !ok {
		t.Fatal("a known name's key was replaced by the caller's buffer, which then changed")
	}
	if _, ok := rt.Typical("/refund"); ok {
		t.Fatal("a name never observed has a typical time")
	}
	if n := testing.AllocsPerRun(100, func() { rt.Observe("/orders", time.Second) }); n != 0 {
		t.Errorf("Observe of a known name: %.1f allocations, want 0", n)
	}
}
