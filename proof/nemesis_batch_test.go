package proof

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// doBatch runs Guard.DoBatch over two to six of keys (now and then one
// twice), up to three effects at once; each item's effect is doOnce's:
// it sometimes fails or panics before the business effect, and records
// its window. It returns the keys the batch saw completed.
func doBatch(ctx context.Context, t *testing.T, g *guard.Guard, wins *Windows, bk *bank, keys []guard.Key, fp func(guard.Key) string,
	r *rand.Rand, st *stats) []guard.Key {
	items := make([]guard.BatchItem, 2+r.IntN(5))
	modes := make([]int, len(items))
	thinks := make([]time.Duration, len(items))
	effects := make([]guard.Func, len(items))
	for i := range items {
		k := keys[r.IntN(len(keys))]
		if i > 0 && r.IntN(8) == 0 {
			k = items[r.IntN(i)].Key // a key twice in one batch
		}
		items[i] = guard.BatchItem{Key: k, Fingerprint: fp(k)}
		modes[i], thinks[i] = r.IntN(100), time.Duration(r.IntN(10))*time.Millisecond
		effects[i] = bk.effect(fp(k), 0)
	}
	res := g.DoBatch(ctx, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		win := wins.Open(l)
		defer win.Close()
		if l.Recovered {
			st.recovered.Add(1)
		}
		if !wait.For(ctx, thinks[i]) || !win.Live(ctx) {
			return nil, context.Cause(ctx)
		}
		switch {
		case modes[i] < 8:
			return nil, errTransient
		case modes[i] < 11:
			panic(errTransient)
		}
		v, err := effects[i](ctx, l)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errEffect, err)
		}
		return v, nil
	}, guard.BatchOptions{Concurrency: 1 + r.IntN(3)})
	st.batches.Add(1)
	var done []guard.Key
	for i, x := range res {
		countErr(st, x.Err)
		switch err := x.Err; {
		case err == nil:
			done = append(done, items[i].Key)
			if x.Replayed {
				st.replays.Add(1)
			}
		case errors.Is(err, guard.ErrPanicked):
			st.panics.Add(1)
		case errors.Is(err, errTransient), errors.Is(err, errEffect):
			st.fnErrors.Add(1)
		case errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrUnavailable),
			errors.Is(err, guard.ErrLeaseLost), errors.Is(err, context.Canceled):
		default:
			t.Errorf("DoBatch %s: unexpected error %v", items[i].Key, err)
		}
	}
	return done
}

// longBatch runs Guard.DoBatch over two of the long effects' keys at
// once: each acts every 2ms while its own context is live, for 0.5-2.5
// long leases, kept alive by the batch's one heartbeat (through the faults
// and, on the cut proxy, partitions), then fails.
func longBatch(ctx context.Context, t *testing.T, g *guard.Guard, wins *Windows, keys []guard.Key, r *rand.Rand, st *stats) {
	a := r.IntN(len(keys))
	b := (a + 1 + r.IntN(len(keys)-1)) % len(keys)
	items := []guard.BatchItem{{Key: keys[a], Fingerprint: "fp-long"}, {Key: keys[b], Fingerprint: "fp-long"}}
	work := []time.Duration{longLease/2 + time.Duration(r.Int64N(int64(2*longLease))), longLease/2 + time.Duration(r.Int64N(int64(2*longLease)))}
	res := g.DoBatch(ctx, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		st.long.Add(1)
		win := wins.Open(l)
		defer win.Close()
		if l.Recovered {
			st.recovered.Add(1)
		}
		if !win.Steps(ctx, work[i], 2*time.Millisecond) {
			return nil, context.Cause(ctx)
		}
		return nil, errTransient
	}, guard.BatchOptions{Concurrency: 2})
	st.batches.Add(1)
	for i, x := range res {
		countErr(st, x.Err)
		switch err := x.Err; {
		case errors.Is(err, errTransient), errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrUnavailable),
			errors.Is(err, guard.ErrLeaseLost):
		default:
			t.Errorf("long batch on %s: unexpected error %v", items[i].Key, err)
		}
	}
}

// manualBatch claims two to four keys as manualClaim does, holds them
// (now and then past the lease), makes each one's business effect and
// ends them all with one WriteBatch of the store: completions (fails where
// the effect failed) that go, on Redis, as one run of complete_batch.lua.
// A holder whose lease ran out and was taken over meanwhile must learn
// LOST, key by key, and change nothing: DoBatch's short effects never
// outlive a lease, so without this shape no batched completion would
// meet a key taken over.
func manualBatch(ctx context.Context, g *guard.Guard, bs guard.BatchStore, bk *bank, keys []guard.Key, fp func(guard.Key) string,
	lease time.Duration, r *rand.Rand, st *stats) {
	var leases []guard.Lease
	taken := map[guard.Key]bool{}
	for range 2 + r.IntN(3) {
		k := keys[r.IntN(len(keys))]
		if taken[k] {
			continue
		}
		taken[k] = true
		out, err := g.Claim(ctx, k, fp(k))
		countErr(st, err)
		if err == nil && out.Status == guard.Acquired {
			leases = append(leases, out.Lease)
		}
	}
	if len(leases) == 0 {
		return
	}
	hold := time.Duration(r.IntN(10)) * time.Millisecond
	if r.IntN(2) == 0 {
		hold = lease + time.Duration(r.Int64N(int64(lease/2))) // outlive the lease: a paused process
	}
	time.Sleep(hold) // the holder working (or paused) for this long
	ws := make([]guard.Write, len(leases))
	for i, l := range leases {
		if l.Recovered {
			st.recovered.Add(1)
		}
		v, err := bk.effect(fp(l.Key), 0)(ctx, l)
		if err != nil {
			ws[i] = guard.Write{Kind: guard.WriteFail, Lease: l, Reason: err.Error(), TTL: g.Options().TTL}
			continue
		}
		ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: l, Result: v, TTL: g.Options().TTL}
	}
	st.batches.Add(1)
	for _, err := range bs.WriteBatch(ctx, ws) {
		countErr(st, err)
	}
}
