package memstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// TestSameAsRedisStore runs random sequences of claims, completes, fails,
// releases, extends, gets and the passing of time on a memstore and on the
// Redis store (its Lua scripts on miniredis, whose clock the test moves),
// and requires the same answer from both to every call: outcome, fence,
// attempt, result, lease and retention left, error class. Callers include
// holders, previous holders retrying, strangers, other fingerprints and
// hand-built leases.
//
// Kept out, where the stores may differ and both keep the contract:
//   - how long, to the millisecond, a record claimed for 24 hours and
//     not yet completed or failed is kept: a TTL over an hour compares
//     only as "over an hour". Claims also ask for 1, 2 and 7 seconds,
//     compared exactly, which runs reach: both stores keep the record to
//     the end of its lease (an extended lease's end, earlier or later
//     than the claim's) and the claim's TTL after it.
//   - writes with an empty token (see pick).
func TestSameAsRedisStore(t *testing.T) {
	seen := map[string]int{} // answers compared, by kind: the log shows what the runs reached
	defer func() { t.Logf("answers compared: %v", seen) }()
	rapid.Check(t, func(rt *rapid.T) {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			rt.Fatal(err)
		}
		defer mr.Close()
		client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		defer client.Close()
		rs := guard.NewRedisStore(client, guard.RedisOptions{Unpipelined: true})
		clk := newClock()
		ms := memstore.New(memstore.Options{Now: clk.Now})

		keys := []guard.Key{{Scope: "d", ID: "k0"}, {Scope: "d", ID: "k1"}}
		tokens := map[guard.Key][]string{} // tokens that claimed each key, in order
		last := map[guard.Key]guard.ClaimRequest{}
		repeatable := map[guard.Key]bool{} // no step saved since last[key] (time passing and extensions are fine)
		n := 0
		durations := func(label string, ds ...time.Duration) time.Duration {
			return rapid.SampledFrom(ds).Draw(rt, label)
		}
		// pick is a token a write is made with: a claimant of the key
		// (holder or earlier) or a stranger. Not the empty token: a Fail
		// or Release with one answers OK from the Redis store when the
		// record's ptok is empty (a lease recovered or a key never taken
		// over), though it changes nothing; the memstore answers
		// ErrLeaseLost (TestRetryAfterTakeover).
		pick := func(key guard.Key) string {
			cands := append([]string{"stranger"}, tokens[key]...)
			return rapid.SampledFrom(cands).Draw(rt, "token")
		}
		writeLease := func(key guard.Key) guard.Lease {
			return guard.Lease{Key: key, Token: pick(key)}
		}
		compareErr := func(what string, r, m error) {
			if class(r) != class(m) {
				rt.Fatalf("%s: redis %v, memstore %v", what, r, m)
			}
			seen[what+" "+class(m)]++
		}
		claim := func(r guard.ClaimRequest) {
			ro, rerr := rs.Claim(ctx, r)
			mo, merr := ms.Claim(ctx, r)
			compareErr("claim", rerr, merr)
			if !sameOutcome(ro, mo) {
				rt.Fatalf("claim %+v:\n redis    %+v\n memstore %+v", r, ro, mo)
			}
			kind := mo.Status.String()
			if mo.Lease.Recovered {
				kind += " recovered"
			}
			seen["claim "+kind]++
			last[r.Key], repeatable[r.Key] = r, true
		}

		rt.Repeat(map[string]func(*rapid.T){
			"claim": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				n++
				tok := fmt.Sprintf("T%d", n)
				tokens[key] = append(tokens[key], tok)
				claim(guard.ClaimRequest{
					Key:         key,
					Token:       tok,
					Fingerprint: rapid.SampledFrom([]string{"fp", "fp", "fp", "other"}).Draw(rt, "fp"),
					Lease:       durations("lease", time.Second, 3*time.Second),
					TTL:         rapid.SampledFrom([]time.Duration{time.Second, 2 * time.Second, 7 * time.Second, 24 * time.Hour}).Draw(rt, "ttl"),
					MaxAttempts: rapid.SampledFrom([]int{0, 0, 2, 3}).Draw(rt, "max"),
				})
			},
			"claim again": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				if !repeatable[key] {
					rt.Skip("no claim to repeat without time passing")
				}
				claim(last[key])
			},
			"complete": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				l := writeLease(key)
				n++
				res := []byte(fmt.Sprintf("r%d", n))
				if rapid.Bool().Draw(rt, "empty") {
					res = nil
				}
				ttl := durations("ttl", time.Second, 5*time.Second)
				compareErr("complete", rs.Complete(ctx, l, res, ttl), ms.Complete(ctx, l, res, ttl))
			},
			"fail": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				l := writeLease(key)
				n++
				reason := fmt.Sprintf("e%d", n)
				ttl := durations("ttl", time.Second, 5*time.Second)
				compareErr("fail", rs.Fail(ctx, l, reason, ttl), ms.Fail(ctx, l, reason, ttl))
			},
			"release": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				l := writeLease(key)
				compareErr("release", rs.Release(ctx, l), ms.Release(ctx, l))
			},
			"extend": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				l := writeLease(key)
				d := durations("d", time.Second, 4*time.Second)
				compareErr("extend", rs.Extend(ctx, l, d), ms.Extend(ctx, l, d))
			},
			"step": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				l := writeLease(key)
				st := guard.StepResult{Name: rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "name"),
					Result: []byte(rapid.SampledFrom([]string{"1", "2", ""}).Draw(rt, "result"))}
				// Mostly the next step after those the record holds.
				held := 0
				if rec, err := ms.Get(ctx, key); err == nil {
					held = len(rec.Steps)
				}
				i := rapid.SampledFrom([]int{held, held, held, 0, 1, 2, 3}).Draw(rt, "index")
				rerr, merr := rs.SaveStep(ctx, l, i, st), ms.SaveStep(ctx, l, i, st)
				compareErr("step", rerr, merr)
				if rerr != nil && merr != nil && rerr.Error() != merr.Error() {
					rt.Fatalf("step: redis %v, memstore %v", rerr, merr)
				}
				delete(repeatable, key) // a repeated claim now reports the steps too; fine, but keep repeats plain
			},
			"advance": func(rt *rapid.T) {
				d := durations("by", 500*time.Millisecond, time.Second, 2*time.Second, 5*time.Second, 61*time.Second)
				mr.FastForward(d)
				clk.Advance(d)
			},
			"": func(rt *rapid.T) { // after every step: both stores read the same records
				for _, key := range keys {
					rr, rerr := rs.Get(ctx, key)
					mm, merr := ms.Get(ctx, key)
					compareErr("get "+key.ID, rerr, merr)
					if !sameRecord(rr, mm) {
						rt.Fatalf("get %s:\n redis    %+v\n memstore %+v", key, rr, mm)
					}
				}
				if err := memstore.CheckInvariants(ms); err != nil {
					rt.Fatal(err)
				}
			},
		})
	})
}

func class(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, guard.ErrLeaseLost):
		return "lease lost"
	case errors.Is(err, guard.ErrNotFound):
		return "not found"
	case errors.Is(err, guard.ErrStepOrder):
		return "step order"
	}
	return "error: " + err.Error()
}

func sameOutcome(a, b guard.Outcome) bool {
	la, lb := a.Lease, b.Lease
	return a.Status == b.Status && bytes.Equal(a.Result, b.Result) && (a.Result == nil) == (b.Result == nil) &&
		a.LeaseLeft == b.LeaseLeft && a.Attempts == b.Attempts && a.LastError == b.LastError && sameSteps(a.Steps, b.Steps) &&
		la.Key == lb.Key && la.Token == lb.Token && la.Fence == lb.Fence && la.Attempt == lb.Attempt && la.Recovered == lb.Recovered
}

func sameRecord(a, b guard.Record) bool {
	return a.Key == b.Key && a.State == b.State && a.Fingerprint == b.Fingerprint && a.Token == b.Token &&
		a.Fence == b.Fence && a.Attempt == b.Attempt && a.Recovered == b.Recovered &&
		bytes.Equal(a.Result, b.Result) && (a.Result == nil) == (b.Result == nil) &&
		a.LastError == b.LastError && a.LeaseLeft == b.LeaseLeft && sameTTL(a.TTL, b.TTL) && sameSteps(a.Steps, b.Steps)
}

func sameSteps(a, b []guard.StepResult) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Result, b[i].Result) {
			return false
		}
	}
	return true
}

// sameTTL: equal, or both still on the retention a claim asked for (see
// TestSameAsRedisStore).
func sameTTL(a, b time.Duration) bool {
	return a == b || (a > time.Hour && b > time.Hour)
}
