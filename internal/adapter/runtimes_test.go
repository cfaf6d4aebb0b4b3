package adapter

import (
	"strconv"
	"sync"
	"testing"
	"time"
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
