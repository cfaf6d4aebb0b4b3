package proof

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// checkHistory fails t if rec's history is not linearizable.
func checkHistory(t *testing.T, rec *Recorder) {
	t.Helper()
	h := rec.History()
	res, path, err := Check(h, time.Minute)
	if err != nil {
		t.Error(err)
	}
	if res != porcupine.Ok {
		t.Errorf("history of %d calls is %s (not linearizable), visualisation: %s\n%s", len(h), res, path, Explain(h, time.Minute))
	}
}

// Powertools TS 5714: a holder whose lease ran out completes late, racing
// another request that recovers the key. Its completion must never
// overwrite a completed result, and the key must never complete twice:
// either the late complete lands first and the other request replays it,
// or the recovery lands first and the late complete is refused.
func TestLateCompleteRacesRecovery(t *testing.T) {
	const keys = 200
	const lease = time.Second
	bk := newBank(t)
	rec := NewRecorder(guardenv.Store(t, guard.RedisOptions{}))
	g := guard.New(rec, guard.Options{Lease: lease, TTL: time.Hour})
	ctx := context.Background()
	fp := "fp"

	// A claims every key, makes the effect, and stalls past its lease
	// before completing (no heartbeat: a paused process).
	type held struct {
		lease guard.Lease
		value []byte
	}
	hs := make([]held, keys)
	for i := range hs {
		k := guard.Key{Scope: "pt5714", ID: fmt.Sprint(i)}
		out, err := g.Claim(WithClient(ctx, 0), k, fp)
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s: %+v, %v", k, out, err)
		}
		v, err := bk.effect(fp, 1)(ctx, out.Lease)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = held{out.Lease, v}
	}
	time.Sleep(lease + 20*time.Millisecond) // the stall: every lease runs out

	type outcome struct {
		lateErr error
		res     guard.Result
		err     error
		ran     bool
	}
	outs := make([]outcome, keys)
	start := make(chan struct{})
	// Left to race, the late complete (one round trip) lands first nearly
	// always; for every other key it waits until B has recovered the key
	// and runs its effect, so that the recovery-first branch is exercised
	// (a complete.lua that does not check the token passed otherwise).
	recovering := make([]chan struct{}, keys)
	for i := range recovering {
		recovering[i] = make(chan struct{})
	}
	var wg sync.WaitGroup
	for i := range hs {
		wg.Add(2)
		go func() { // A's late complete
			defer wg.Done()
			<-start
			if i%2 == 1 {
				select {
				case <-recovering[i]:
				case <-time.After(30 * time.Second): // B never ran: its checks below say so
				}
			}
			outs[i].lateErr = g.Complete(WithClient(ctx, 1), hs[i].lease, hs[i].value)
		}()
		go func() { // B: the retry that finds the abandoned claim
			defer wg.Done()
			<-start
			eff := bk.effect(fp, 2)
			for range 20 { // a store too busy to answer in time is asked again
				outs[i].res, outs[i].err = g.Do(WithClient(ctx, 2), hs[i].lease.Key, fp, func(ctx context.Context, l guard.Lease) ([]byte, error) {
					if !outs[i].ran {
						close(recovering[i])
					}
					outs[i].ran = true
					return eff(ctx, l)
				})
				if !errors.Is(outs[i].err, guard.ErrUnavailable) {
					break
				}
			}
		}()
	}
	close(start)
	wg.Wait()

	rows := bk.rows(t, "pt5714")
	lateWon, recoveryWon, unknown := 0, 0, 0
	for i, o := range outs {
		k := hs[i].lease.Key
		if o.err != nil {
			t.Errorf("%s: B's Do: %v", k, o.err)
			continue
		}
		switch {
		case o.lateErr == nil: // the late complete landed first
			lateWon++
			if o.ran || !o.res.Replayed {
				t.Errorf("%s: late complete succeeded and B ran again (%+v): two completions", k, o.res)
			}
		case errors.Is(o.lateErr, guard.ErrLeaseLost): // B recovered first
			recoveryWon++
			if !o.ran || o.res.Lease.Fence != hs[i].lease.Fence+1 || !o.res.Lease.Recovered {
				t.Errorf("%s: late complete refused but B did not recover: %+v", k, o.res)
			}
		case errors.Is(o.lateErr, guard.ErrUnavailable):
			unknown++ // the store was too busy to answer: either may have won
		default:
			t.Errorf("%s: late complete: %v", k, o.lateErr)
		}
		// Either way the one result is A's: the backstop row made B's
		// run answer with A's committed value.
		if string(o.res.Value) != string(hs[i].value) {
			t.Errorf("%s: B got %q, want A's committed %q", k, o.res.Value, hs[i].value)
		}
		r, err := g.Get(ctx, k)
		if err != nil || r.State != guard.StateCompleted || string(r.Result) != string(hs[i].value) {
			t.Errorf("%s: record %+v, %v; want completed with %q", k, r, err, hs[i].value)
		}
		if len(rows[k.ID]) != 1 {
			t.Errorf("%s: %d business rows, want 1", k, len(rows[k.ID]))
		}
	}
	t.Logf("late complete won %d races, recovery won %d, %d unknown (store busy)", lateWon, recoveryWon, unknown)
	if recoveryWon+unknown < keys/2 {
		t.Errorf("recovery won %d (and %d unknown) of the %d keys whose late complete waited for it", recoveryWon, unknown, keys/2)
	}
	checkHistory(t, rec)
}

// Powertools TS 5675: a duplicate rejected because the original is in
// progress must never release, complete or fail the original's claim.
func TestRejectedDuplicateLeavesOriginal(t *testing.T) {
	rec := NewRecorder(guardenv.Store(t, guard.RedisOptions{}))
	g := guard.New(rec, guard.Options{Lease: 300 * time.Millisecond, TTL: time.Hour})
	ctx := context.Background()
	key := guard.Key{Scope: "pt5675", ID: "order-1"}

	var effects atomic.Int64
	running, finish := make(chan guard.Lease), make(chan struct{})
	origDone := make(chan error, 1)
	go func() {
		res, err := g.Do(WithClient(ctx, 0), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			effects.Add(1)
			running <- l
			<-finish // the original works longer than its lease; its heartbeat keeps it
			return []byte("original"), nil
		})
		if err == nil && string(res.Value) != "original" {
			err = fmt.Errorf("original's Do answered %q", res.Value)
		}
		origDone <- err
	}()
	orig := <-running

	// 16 goroutines send duplicates for longer than a lease. Each is
	// rejected; each then tries, through the store, to end a claim with
	// its own token: release, complete, fail. All must be refused.
	var wg sync.WaitGroup
	var rejected atomic.Int64
	deadline := time.Now().Add(450 * time.Millisecond)
	for c := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx := WithClient(ctx, c+1)
			for n := 0; time.Now().Before(deadline); n++ {
				_, err := g.Do(cctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
					effects.Add(1)
					return []byte("duplicate"), nil
				})
				var ip *guard.InProgressError
				if !errors.As(err, &ip) {
					t.Errorf("duplicate Do: %v, want in progress", err)
					return
				}
				rejected.Add(1)
				tok := fmt.Sprintf("dup-%d-%d", c, n)
				out, err := rec.Claim(cctx, guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
				if err != nil || out.Status != guard.InProgress {
					t.Errorf("duplicate claim: %+v, %v", out, err)
					return
				}
				for name, err := range map[string]error{
					"release":  rec.Release(cctx, guard.Lease{Key: key, Token: tok}),
					"complete": rec.Complete(cctx, guard.Lease{Key: key, Token: tok}, []byte("dup"), time.Hour),
					"fail":     rec.Fail(cctx, guard.Lease{Key: key, Token: tok}, "dup", time.Hour),
				} {
					if !errors.Is(err, guard.ErrLeaseLost) {
						t.Errorf("rejected duplicate's %s: %v, want ErrLeaseLost", name, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	r, err := g.Get(ctx, key)
	if err != nil || r.State != guard.StatePending || r.Token != orig.Token || r.Fence != orig.Fence {
		t.Fatalf("after %d rejected duplicates the record is %+v, %v; want the original's pending claim", rejected.Load(), r, err)
	}
	close(finish)
	if err := <-origDone; err != nil {
		t.Fatalf("original: %v", err)
	}
	if r, _ := g.Get(ctx, key); r.State != guard.StateCompleted || string(r.Result) != "original" {
		t.Fatalf("record %+v, want completed with the original's result", r)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("the effect ran %d times, want 1", n)
	}
	t.Logf("%d duplicates rejected while the original ran", rejected.Load())
	checkHistory(t, rec)
}
