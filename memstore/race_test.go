package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/memstore"
)

var errFirstTry = errors.New("first try fails")

// TestRaceThroughGuard: 64 goroutines run Guard.Do on 1,000 keys, 8
// duplicates each, until every duplicate has the key's result. A key's
// first run fails, is rejected (release), panics, or succeeds, by key;
// meanwhile another goroutine moves the clock and fills the store with
// short-lived keys, so the sweep runs among them. Every key must have
// exactly one successful effect, every duplicate its result, and the
// record the fence and attempts its history gives.
func TestRaceThroughGuard(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	g := guard.New(s, guard.Options{Lease: time.Hour, TTL: time.Hour})
	const keys, dups, workers = 1000, 8, 64
	key := func(i int) guard.Key { return guard.Key{Scope: "race", ID: fmt.Sprint(i)} }
	runs := make([]atomic.Int64, keys)    // calls of fn
	effects := make([]atomic.Int64, keys) // successful effects

	fn := func(i int) guard.Func {
		return func(ctx context.Context, l guard.Lease) ([]byte, error) {
			if runs[i].Add(1) == 1 {
				switch i % 4 {
				case 0:
					return nil, errFirstTry // recorded as failed: attempt 2 follows
				case 1:
					return nil, fmt.Errorf("busy: %w", guard.ErrRejected) // released: as if never claimed
				case 2:
					panic(errFirstTry) // released by Do, panic goes on
				}
			}
			effects[i].Add(1)
			return fmt.Appendf(nil, "v%d", i), nil
		}
	}
	do := func(i int) (res guard.Result, err error) {
		defer func() {
			if p := recover(); p != nil {
				if p != errFirstTry {
					panic(p)
				}
				err = errFirstTry
			}
		}()
		return g.Do(ctx, key(i), "fp", fn(i))
	}

	stop := make(chan struct{})
	var janitor sync.WaitGroup
	janitor.Add(1)
	go func() { // time moves and short-lived keys come and go while the race runs
		defer janitor.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			k := guard.Key{Scope: "janitor", ID: fmt.Sprint(n)}
			r := req(k, "J")
			r.Lease, r.TTL = time.Millisecond, time.Millisecond
			if _, err := s.Claim(ctx, r); err != nil {
				t.Error(err)
				return
			}
			if err := s.Complete(ctx, lease(k, "J"), []byte("j"), time.Millisecond); err != nil {
				t.Error(err)
				return
			}
			clk.Advance(time.Millisecond)
			_ = s.Stats()
		}
	}()

	jobs := make(chan int)
	var wg sync.WaitGroup
	var answered, retries atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				deadline := time.Now().Add(time.Minute) // generous: a loaded 2-core machine under -race
				for {
					if time.Now().After(deadline) {
						t.Errorf("key %d: no result within a minute", i)
						break
					}
					res, err := do(i)
					if err == nil {
						if string(res.Value) != fmt.Sprintf("v%d", i) {
							t.Errorf("key %d: result %q", i, res.Value)
						}
						answered.Add(1)
						break
					}
					if !errors.Is(err, guard.ErrInProgress) && !errors.Is(err, errFirstTry) && !errors.Is(err, guard.ErrRejected) {
						t.Errorf("key %d: %v", i, err)
						break
					}
					retries.Add(1)
					runtime.Gosched() // let the holder finish
				}
			}
		}()
	}
	for i := range keys {
		for range dups { // back to back, so they meet on different workers
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	close(stop)
	janitor.Wait()

	if got := answered.Load(); got != keys*dups {
		t.Fatalf("answered %d of %d calls", got, keys*dups)
	}
	for i := range keys {
		if n := effects[i].Load(); n != 1 {
			t.Fatalf("key %d: %d effects, want 1", i, n)
		}
		rec, err := s.Get(ctx, key(i))
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		wantFence, wantAttempt := int64(1), 1
		switch i % 4 {
		case 0: // failed once, then retried
			wantFence, wantAttempt = 2, 2
		case 1, 2: // released once (a first attempt again, at the next fence)
			wantFence = 2
		}
		if rec.State != guard.StateCompleted || rec.Fence != wantFence || rec.Attempt != wantAttempt {
			t.Fatalf("key %d (kind %d): %+v, want completed with fence %d, attempt %d", i, i%4, rec, wantFence, wantAttempt)
		}
	}
	t.Logf("%d calls answered, %d retried (in progress or first-run failures)", answered.Load(), retries.Load())
}

// TestLeasesNeverOverlap: on the real clock, holders that fail, release
// or die (and are recovered once their lease ran out) never hold the key
// at once, and fences grow.
func TestLeasesNeverOverlap(t *testing.T) {
	storetest.LeasesNeverOverlap(t, memstore.New(memstore.Options{}), 50*time.Millisecond, 16, 2*time.Second)
}
