// Package storetest is the contract every guard.Store passes: the state
// machine of docs/design.md, idempotent retries of every call, compare-and-set on
// the owner token, lease recovery, retention, and races that count effects.
//
// A store's test calls Run with a Harness:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			New:     func(t *testing.T) guard.Store { return newStore(t) },
//			Advance: storetest.Wait,
//		})
//	}
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// Harness tells Run how to drive one Store implementation.
type Harness struct {
	// New returns an empty store for one test. Stores from different calls
	// must not see each other's keys (use a fresh prefix or schema).
	New func(t *testing.T) guard.Store
	// Advance lets d pass for the store's leases and retention: FastForward
	// on miniredis, Wait on a real server.
	Advance func(t *testing.T, d time.Duration)
	// Lease is the lease used where one must run out. Default 500ms.
	// A case that needs a call to reach the store within a lease (or a
	// lease and a retention) runs again with 2, 4 and 8 times it when a
	// loaded machine held the call back past that (onTime).
	Lease time.Duration
	// TTL is the retention used where a record must expire. Default 1s.
	TTL time.Duration
	// FencesOutliveRecords: the store keeps a key's fence after its record
	// expired (pgstore keeps the row of an expired record until Purge;
	// backstop.Wrap's leases bear the backstop's fence, its row kept so),
	// so a claim that finds the key absent takes a fence above the last
	// holder's, and Get need not show the lease's fence (Wrap's shows the
	// primary's record). Otherwise that claim starts again at fence 1
	// (docs/design.md, "The state machine", rule 4). After a released
	// first attempt every store gives a fence above the released holder's.
	FencesOutliveRecords bool
	// Keys and Duplicates size the many-keys race (default 1,000 × 8).
	Keys, Duplicates int
	// Parallel runs the contract's cases, and those of its cases (Steps',
	// Batch'…), up to parallelCases at a time, each on a store of its own
	// (New): most of them wait for a lease or a retention to run out. The
	// races, which count effects under load, run after the other cases of
	// their list. For a harness whose Advance waits in real time (Wait),
	// not one that moves a clock its stores share. A case that needs its
	// calls answered within a span of real time runs again with a longer
	// lease when the load made it late (Lease).
	Parallel bool
	// Corruptions are ways to store a record the store cannot read, one
	// subtest each: every call on such a key must fail with an error
	// wrapping guard.ErrCorrupt that names the key, run nothing and change
	// nothing. None: the case is skipped.
	Corruptions []Corruption
}

// Corruption stores, for one key, a record its store cannot read.
type Corruption struct {
	Name string
	// Write stores the unreadable record for key in s and returns a
	// check that it is still there, unchanged.
	Write func(t *testing.T, s guard.Store, key guard.Key) (unchanged func() bool)
}

// Wait is an Advance for real servers: it lets d (and a margin for clock
// granularity) pass in real time.
func Wait(t *testing.T, d time.Duration) {
	time.Sleep(d + 50*time.Millisecond) // waiting for server-side expiry, not for another goroutine
}

func (h Harness) withDefaults() Harness {
	if h.Lease <= 0 {
		h.Lease = 500 * time.Millisecond
	}
	if h.TTL <= 0 {
		h.TTL = time.Second
	}
	if h.Keys <= 0 {
		h.Keys = 1000
	}
	if h.Duplicates <= 0 {
		h.Duplicates = 8
	}
	return h
}

// Run runs the whole contract as subtests of t.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Advance == nil {
		t.Fatal("storetest: Harness.New and Harness.Advance are required")
	}
	h = h.withDefaults()
	c := contract{h: h}
	if h.Parallel {
		c.slots = make(chan struct{}, parallelCases)
	}
	c.inSlots(t, []testCase{
		{"ClaimNew", c.claimNew},
		{"ClaimRepeatedSameToken", c.claimRepeated},
		{"ClaimWhileHeld", c.claimWhileHeld},
		{"Mismatch", c.mismatch},
		{"CompleteThenReplay", c.completeThenReplay},
		{"CompleteRepeated", c.completeRepeated},
		{"StaleTokenChangesNothing", c.staleToken},
		{"FailThenRetry", c.failThenRetry},
		{"Exhausted", c.exhausted},
		{"ReleaseFirstAttempt", c.releaseFirst},
		{"ReleaseLaterAttempt", c.releaseLater},
		{"RetriedAfterTakeover", c.retriedAfterTakeover}, // retries.go
		{"ClaimResentAfterItsEnd", c.claimResentAfterItsEnd},
		{"Endings", c.endings}, // endings.go
		{"LeaseExpiryRecovery", c.leaseRecovery},
		{"LeaseExpiryRecoveryShortTTL", c.leaseRecoveryShortTTL},
		{"ExtendKeepsLease", c.extendKeeps},
		{"BadDurations", c.badDurations},
		{"InvalidKeys", c.invalidKeys},
		{"Retention", c.retention},
		{"ScopesNeverMeet", c.scopes},
		{"OddKeyBytes", c.oddKeys},
		{"LongFingerprints", c.longFingerprints},
		{"TokenShapes", c.tokenShapes},
		{"LargeValues", c.largeValues},
		{"BinaryValues", c.binaryValues}, // bytes.go
		{"CorruptRecords", c.corruptRecords},
		{"Steps", c.steps},                                 // steps.go
		{"Batch", c.batch},                                 // batch.go
		{"MismatchEveryState", c.mismatchEveryState},       // mismatch_states.go
		{"FormerHolders", c.formerHolders},                 // former_holders.go
		{"ExpiredLeaseStillHeld", c.expiredLeaseStillHeld}, // expired_lease.go
		{"ReleaseRetention", c.releaseRetention},           // release_retention.go
		{"Released", c.released},                           // released.go
		{"UnchangedRecordsExpire", c.unchangedExpiry},      // expiry.go
	})
	t.Run("RaceOneKey", c.raceOneKey)
	t.Run("RaceManyKeys", c.raceManyKeys)
}

type contract struct {
	h Harness
	// slots bound the cases running at once under Harness.Parallel: a
	// case takes one to run, and gives it up while its own cases run.
	// nil: one case at a time.
	slots chan struct{}
}

// parallelCases is how many cases run at once under Harness.Parallel.
const parallelCases = 4

// testCase is a case of the contract, a subtest.
type testCase struct {
	name string
	fn   func(*testing.T)
}

// run runs cases as subtests of t, the cases of a case (Steps'): one
// after another; or, with Harness.Parallel, in the contract's slots,
// the one the calling case holds given up meanwhile.
func (c contract) run(t *testing.T, cases []testCase) {
	if c.slots == nil {
		c.inSlots(t, cases)
		return
	}
	<-c.slots
	c.inSlots(t, cases)
	c.slots <- struct{}{}
}

// inSlots runs each of cases as a subtest of t in a slot of the
// contract's (t.Run from goroutines of its own, which -parallel, bounding
// the tests that compute, does not count: they mostly sleep), or without
// Harness.Parallel one after another.
func (c contract) inSlots(t *testing.T, cases []testCase) {
	if c.slots == nil {
		for _, tc := range cases {
			t.Run(tc.name, tc.fn)
		}
		return
	}
	var wg sync.WaitGroup
	for _, tc := range cases {
		c.slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-c.slots }()
			t.Run(tc.name, tc.fn)
		})
	}
	wg.Wait()
}

var ctx = context.Background()

func newKey(t *testing.T) guard.Key {
	return guard.Key{Scope: "contract", ID: t.Name() + "/" + rand.Text()[:10]}
}

func (c contract) req(key guard.Key, token string) guard.ClaimRequest {
	return guard.ClaimRequest{Key: key, Token: token, Fingerprint: "fp", Lease: c.h.Lease, TTL: time.Hour}
}

func claim(t *testing.T, s guard.Store, r guard.ClaimRequest) guard.Outcome {
	t.Helper()
	out, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatalf("Claim(%s, %s): %v", r.Key, r.Token, err)
	}
	return out
}

func acquire(t *testing.T, s guard.Store, r guard.ClaimRequest) guard.Lease {
	t.Helper()
	out := claim(t, s, r)
	if out.Status != guard.Acquired {
		t.Fatalf("Claim(%s, %s) = %v, want acquired", r.Key, r.Token, out.Status)
	}
	if out.Lease.Key != r.Key || out.Lease.Token != r.Token {
		t.Fatalf("lease names %s/%s, want %s/%s", out.Lease.Key, out.Lease.Token, r.Key, r.Token)
	}
	return out.Lease
}

func get(t *testing.T, s guard.Store, key guard.Key) guard.Record {
	t.Helper()
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return rec
}

func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mustLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("%s = %v, want ErrLeaseLost", what, err)
	}
}

func (c contract) claimNew(t *testing.T) {
	// Get must reach the store before the lease ends to see some of it
	// left: onTime runs again with a longer lease when it did not.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := c.h.New(t), newKey(t)
		if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("Get of a new key = %v, want ErrNotFound", err)
		}
		r := c.req(key, "A")
		r.Lease = lease
		began := time.Now()
		l := acquire(t, s, r)
		if l.Fence != 1 || l.Attempt != 1 || l.Recovered {
			t.Fatalf("first lease = %+v, want fence 1, attempt 1, not recovered", l)
		}
		rec := get(t, s, key)
		if rec.State != guard.StatePending || rec.Token != "A" || rec.Fence != 1 || rec.Attempt != 1 || rec.Fingerprint != "fp" {
			t.Fatalf("record = %+v", rec)
		}
		if rec.Key != key {
			t.Fatalf("record key = %s, want %s", rec.Key, key)
		}
		if rec.LeaseLeft <= 0 || rec.LeaseLeft > lease {
			if rec.LeaseLeft <= 0 && late(began, lease) {
				return true
			}
			t.Fatalf("lease left = %s, want in (0, %s]", rec.LeaseLeft, lease)
		}
		return false
	})
}

func (c contract) claimRepeated(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	first := acquire(t, s, c.req(key, "A"))
	again := acquire(t, s, c.req(key, "A"))
	if again != first {
		t.Fatalf("repeated claim = %+v, want %+v", again, first)
	}
	// Also after a failure and recovery: the retry of the recovering claim.
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
	b1 := acquire(t, s, c.req(key, "B"))
	b2 := acquire(t, s, c.req(key, "B"))
	if b1 != b2 || b1.Fence != 2 {
		t.Fatalf("repeated recovering claim = %+v then %+v, want equal with fence 2", b1, b2)
	}
}

func (c contract) claimWhileHeld(t *testing.T) {
	// The second claim must reach the store before the first lease ends:
	// onTime runs again with a longer lease when it did not.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := c.h.New(t), newKey(t)
		r := c.req(key, "A")
		r.Lease = lease
		began := time.Now()
		acquire(t, s, r)
		r.Token = "B"
		out := claim(t, s, r)
		if out.Status != guard.InProgress {
			if late(began, lease) {
				return true
			}
			t.Fatalf("second claim = %v, want in progress", out.Status)
		}
		if out.LeaseLeft <= 0 || out.LeaseLeft > lease {
			t.Fatalf("lease left = %s, want in (0, %s]", out.LeaseLeft, lease)
		}
		if rec := get(t, s, key); rec.Token != "A" || rec.Fence != 1 {
			t.Fatalf("in-progress claim changed the record: %+v", rec)
		}
		return false
	})
}

func (c contract) mismatch(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	other := c.req(key, "B")
	other.Fingerprint = "other"
	if out := claim(t, s, other); out.Status != guard.Mismatch {
		t.Fatalf("claim with another fingerprint while pending = %v, want mismatch", out.Status)
	}
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("secret"), time.Hour))
	out := claim(t, s, other)
	if out.Status != guard.Mismatch || out.Result != nil {
		t.Fatalf("claim with another fingerprint after completion = %+v, want mismatch without result", out)
	}
}

func (c contract) completeThenReplay(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	result := []byte("ok\x00\xff\n binary")
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, result, time.Hour))
	rec := get(t, s, key)
	if rec.State != guard.StateCompleted || !bytes.Equal(rec.Result, result) || rec.LeaseLeft != 0 {
		t.Fatalf("completed record = %+v", rec)
	}
	for _, tok := range []string{"B", "A"} {
		out := claim(t, s, c.req(key, tok))
		if out.Status != guard.Replay || !bytes.Equal(out.Result, result) {
			t.Fatalf("claim by %s after completion = %+v, want replay of %q", tok, out, result)
		}
	}
	// An empty result is a result.
	key2 := newKey(t)
	acquire(t, s, c.req(key2, "A"))
	mustOK(t, "complete empty", s.Complete(ctx, guard.Lease{Key: key2, Token: "A"}, nil, time.Hour))
	if out := claim(t, s, c.req(key2, "B")); out.Status != guard.Replay || len(out.Result) != 0 {
		t.Fatalf("replay of empty result = %+v", out)
	}
}

func (c contract) completeRepeated(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("r"), time.Hour))
	mustOK(t, "complete again", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("r"), time.Hour))
	if rec := get(t, s, key); string(rec.Result) != "r" {
		t.Fatalf("result after repeated complete = %q", rec.Result)
	}
}

func (c contract) staleToken(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	before := get(t, s, key)
	mustLost(t, "complete with stale token", s.Complete(ctx, guard.Lease{Key: key, Token: "X"}, []byte("x"), time.Hour))
	mustLost(t, "fail with stale token", s.Fail(ctx, guard.Lease{Key: key, Token: "X"}, "x", time.Hour))
	mustLost(t, "extend with stale token", s.Extend(ctx, guard.Lease{Key: key, Token: "X"}, time.Hour))
	mustLost(t, "release with stale token", s.Release(ctx, guard.Lease{Key: key, Token: "X"}))
	after := get(t, s, key)
	if after.State != before.State || after.Token != before.Token || after.Fence != before.Fence ||
		after.Attempt != before.Attempt || after.Result != nil || after.LeaseLeft > before.LeaseLeft {
		t.Fatalf("stale writes changed the record: before %+v, after %+v", before, after)
	}
	// On a completed record, too.
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("a"), time.Hour))
	mustLost(t, "complete completed with stale token", s.Complete(ctx, guard.Lease{Key: key, Token: "X"}, []byte("x"), time.Hour))
	mustLost(t, "release completed with stale token", s.Release(ctx, guard.Lease{Key: key, Token: "X"}))
	mustLost(t, "release completed by owner", s.Release(ctx, guard.Lease{Key: key, Token: "A"}))
	mustLost(t, "fail completed by owner", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "late", time.Hour))
	mustLost(t, "extend completed by owner", s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, time.Hour))
	if rec := get(t, s, key); rec.State != guard.StateCompleted || string(rec.Result) != "a" {
		t.Fatalf("completed record changed: %+v", rec)
	}
	// On an absent key, writes other than release are lost.
	gone := newKey(t)
	mustLost(t, "complete absent", s.Complete(ctx, guard.Lease{Key: gone, Token: "A"}, nil, time.Hour))
	mustLost(t, "extend absent", s.Extend(ctx, guard.Lease{Key: gone, Token: "A"}, time.Hour))
	if _, err := s.Get(ctx, gone); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("writes to an absent key created it: %v", err)
	}
}

func (c contract) failThenRetry(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
	mustOK(t, "fail again", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
	rec := get(t, s, key)
	if rec.State != guard.StateFailed || rec.LastError != "boom" || rec.Attempt != 1 || rec.LeaseLeft != 0 {
		t.Fatalf("failed record = %+v", rec)
	}
	l := acquire(t, s, c.req(key, "B"))
	if l.Fence != 2 || l.Attempt != 2 || l.Recovered {
		t.Fatalf("retry lease = %+v, want fence 2, attempt 2, not recovered", l)
	}
	mustLost(t, "old holder completes after retry", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("a"), time.Hour))
	mustOK(t, "retry completes", s.Complete(ctx, guard.Lease{Key: key, Token: "B"}, []byte("b"), time.Hour))
	if out := claim(t, s, c.req(key, "C")); out.Status != guard.Replay || string(out.Result) != "b" {
		t.Fatalf("after retry = %+v, want replay of b", out)
	}
}

func (c contract) exhausted(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	r := func(tok string) guard.ClaimRequest { q := c.req(key, tok); q.MaxAttempts = 3; return q }
	for i, tok := range []string{"A", "B", "C"} {
		l := acquire(t, s, r(tok))
		if l.Attempt != i+1 {
			t.Fatalf("attempt = %d, want %d", l.Attempt, i+1)
		}
		mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: key, Token: tok}, fmt.Sprintf("boom %d", i+1), time.Hour))
	}
	out := claim(t, s, r("D"))
	if out.Status != guard.Exhausted || out.Attempts != 3 || out.LastError != "boom 3" {
		t.Fatalf("claim after 3 failures = %+v, want exhausted after 3 with boom 3", out)
	}
	if rec := get(t, s, key); rec.State != guard.StateFailed || rec.Attempt != 3 {
		t.Fatalf("exhausted claim changed the record: %+v", rec)
	}
	// A holder that dies on its last attempt exhausts the key too.
	key2 := newKey(t)
	q := c.req(key2, "A")
	q.MaxAttempts = 1
	acquire(t, s, q)
	c.h.Advance(t, c.h.Lease)
	q.Token = "B"
	if out := claim(t, s, q); out.Status != guard.Exhausted || out.Attempts != 1 {
		t.Fatalf("claim after the only attempt's lease ran out = %+v, want exhausted", out)
	}
}

func (c contract) releaseFirst(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	mustOK(t, "release", s.Release(ctx, guard.Lease{Key: key, Token: "A"}))
	mustOK(t, "release again", s.Release(ctx, guard.Lease{Key: key, Token: "A"}))
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get after release = %v, want ErrNotFound", err)
	}
	l := acquire(t, s, c.req(key, "B"))
	if l.Attempt != 1 || l.Recovered {
		t.Fatalf("claim after release = %+v, want a first attempt", l)
	}
	mustOK(t, "release of an absent key", s.Release(ctx, guard.Lease{Key: newKey(t), Token: "Z"}))
}

func (c contract) releaseLater(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
	second := acquire(t, s, c.req(key, "B"))
	mustOK(t, "release", s.Release(ctx, guard.Lease{Key: key, Token: "B"}))
	rec := get(t, s, key)
	if rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Fatalf("after releasing attempt 2 = %+v, want failed with 1 attempt", rec)
	}
	third := acquire(t, s, c.req(key, "C"))
	if third.Attempt != 2 || third.Fence <= second.Fence {
		t.Fatalf("claim after release = %+v, want attempt 2 and a fence above %d", third, second.Fence)
	}
}

func (c contract) leaseRecovery(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	c.h.Advance(t, c.h.Lease) // A stops heartbeating: it crashed
	b := acquire(t, s, c.req(key, "B"))
	if b.Fence != a.Fence+1 || b.Attempt != 2 || !b.Recovered {
		t.Fatalf("recovered lease = %+v, want fence %d, attempt 2, recovered", b, a.Fence+1)
	}
	mustLost(t, "old holder's extend", s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, c.h.Lease))
	mustLost(t, "old holder's complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("a"), time.Hour))
	mustLost(t, "old holder's fail", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "x", time.Hour))
	mustLost(t, "old holder's release", s.Release(ctx, guard.Lease{Key: key, Token: "A"}))
	mustOK(t, "new holder's complete", s.Complete(ctx, guard.Lease{Key: key, Token: "B"}, []byte("b"), time.Hour))
	if out := claim(t, s, c.req(key, "C")); out.Status != guard.Replay || string(out.Result) != "b" {
		t.Fatalf("after recovery = %+v, want replay of b", out)
	}
}

// leaseRecoveryShortTTL: a retention shorter than the lease does not
// cut the recovery of an abandoned claim short. A pending record is kept
// for the retention after its lease ends (the Redis store's key lives for
// retention + lease), so the next claim recovers it with fence+1 and
// attempt 2, and a store never forgets it at the lease's end, which would
// hand the next claim a first attempt again: the dead holder's fence
// repeated or its attempts (MaxAttempts) and steps lost. An extension
// moves the record's end with its lease: the extension, sent more than a
// retention after the claim, leaves the record to the claim's lease and
// retention (1.5 × lease) in a store that moves only the lease, and B's
// claim comes after that (1.6 × lease).
func (c contract) leaseRecoveryShortTTL(t *testing.T) {
	// Each claim and the extension must reach the store before the record's
	// retention (0.5 × lease) after the lease ends: onTime runs again with a
	// longer lease when a loaded machine missed that.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := c.h.New(t), newKey(t)
		r := c.req(key, "A")
		r.Lease, r.TTL = lease, lease/2
		began := time.Now()
		a := acquire(t, s, r)
		c.h.Advance(t, lease*3/5) // more than the retention
		extended := time.Now()
		if err := s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, lease); err != nil {
			if late(began, lease+r.TTL) {
				return true
			}
			t.Fatalf("extend: %v", err)
		}
		c.h.Advance(t, lease) // A stops heartbeating: it crashed
		r.Token = "B"
		claimed := time.Now()
		out := claim(t, s, r)
		if b := out.Lease; out.Status != guard.Acquired || b.Fence != a.Fence+1 || b.Attempt != 2 || !b.Recovered {
			if late(extended, lease+r.TTL) {
				return true
			}
			t.Fatalf("recovered claim with a TTL shorter than the lease = %+v, want acquired with fence %d, attempt 2, recovered", out, a.Fence+1)
		}
		c.h.Advance(t, lease)
		r.Token, r.MaxAttempts = "C", 2
		if out := claim(t, s, r); out.Status != guard.Exhausted || out.Attempts != 2 {
			if late(claimed, lease+r.TTL) {
				return true
			}
			t.Fatalf("claim after the last attempt's holder died = %+v, want exhausted after 2", out)
		}
		return false
	})
}

func (c contract) extendKeeps(t *testing.T) {
	// Each claim must reach the store before the lease the extension
	// before it gave ends: onTime runs again with a longer lease when a
	// claim did not.
	c.onTime(t, func(lease time.Duration) bool {
		s, key := c.h.New(t), newKey(t)
		r := c.req(key, "A")
		r.Lease = lease
		acquire(t, s, r)
		var extended time.Time
		for range 3 {
			c.h.Advance(t, lease/2)
			extended = time.Now()
			mustOK(t, "extend", s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, lease))
		}
		r.Token = "B"
		if out := claim(t, s, r); out.Status != guard.InProgress {
			if late(extended, lease) {
				return true
			}
			t.Fatalf("claim while the lease is extended = %v, want in progress", out.Status)
		}
		// A lease that ran out, unclaimed by anyone, still belongs to its holder.
		c.h.Advance(t, lease)
		extended = time.Now()
		mustOK(t, "extend after expiry, nobody took over", s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, lease))
		if out := claim(t, s, r); out.Status != guard.InProgress {
			if late(extended, lease) {
				return true
			}
			t.Fatalf("claim after re-extension = %v, want in progress", out.Status)
		}
		return false
	})
}

// mustRefuse: a call with a bad argument is refused with an error that
// is neither ErrLeaseLost (the caller still holds its key) nor
// ErrUnavailable (trying again cannot help).
func mustRefuse(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("%s = %v, want it refused", what, err)
	}
}

// badDurations: a claim whose lease or retention is not positive, or
// whose MaxAttempts is negative, and a write whose retention or lease is
// not positive, are refused and change nothing. (Rounded up to the
// smallest unit instead, a completion would be forgotten at once and its
// effect run again; an extension would end the lease.)
func (c contract) badDurations(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	for what, r := range map[string]func(*guard.ClaimRequest){
		"zero lease":            func(r *guard.ClaimRequest) { r.Lease = 0 },
		"negative lease":        func(r *guard.ClaimRequest) { r.Lease = -time.Second },
		"zero TTL":              func(r *guard.ClaimRequest) { r.TTL = 0 },
		"negative TTL":          func(r *guard.ClaimRequest) { r.TTL = -time.Second },
		"negative max attempts": func(r *guard.ClaimRequest) { r.MaxAttempts = -1 },
	} {
		req := c.req(key, "bad")
		r(&req)
		_, err := s.Claim(ctx, req)
		mustRefuse(t, "claim with a "+what, err)
		if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("claim with a %s left a record: %v", what, err)
		}
	}

	req := c.req(key, "A")
	req.Lease = time.Minute // it must still be alive at the end, however slow the machine
	l := acquire(t, s, req)
	for _, d := range []time.Duration{0, -time.Second} {
		mustRefuse(t, fmt.Sprintf("complete with ttl %s", d), s.Complete(ctx, l, []byte("x"), d))
		mustRefuse(t, fmt.Sprintf("fail with ttl %s", d), s.Fail(ctx, l, "x", d))
		mustRefuse(t, fmt.Sprintf("extend by %s", d), s.Extend(ctx, l, d))
	}
	if rec := get(t, s, key); rec.State != guard.StatePending || rec.Token != "A" || rec.LeaseLeft < req.Lease/2 {
		t.Fatalf("record after refused writes = %+v, want pending for A with most of %s left", rec, req.Lease)
	}
	if out := claim(t, s, c.req(key, "B")); out.Status != guard.InProgress {
		t.Fatalf("claim after refused writes = %v, want in progress", out.Status)
	}
	mustOK(t, "complete", s.Complete(ctx, l, []byte("a"), time.Hour))
	if out := claim(t, s, c.req(key, "B")); out.Status != guard.Replay || string(out.Result) != "a" {
		t.Fatalf("claim after completion = %+v, want replay of a", out)
	}
}

// invalidKeys: a claim of a key Key.Validate refuses is refused with an
// error wrapping guard.ErrInvalidKey, and stores nothing, in a batch too.
func (c contract) invalidKeys(t *testing.T) {
	s := c.h.New(t)
	keys := map[string]guard.Key{
		"empty scope":       {Scope: "", ID: "x"},
		"empty id":          {Scope: "contract", ID: ""},
		"long id":           {Scope: "contract", ID: strings.Repeat("x", guard.MaxIDLen+1)},
		"control character": {Scope: "contract", ID: "a\nb"},
		"invalid UTF-8":     {Scope: "contract", ID: "a\xffb"},
	}
	bs, batches := s.(guard.BatchStore)
	for what, key := range keys {
		r := c.req(key, "A")
		if _, err := s.Claim(ctx, r); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("claim of a key with %s: %v, want ErrInvalidKey", what, err)
		}
		if batches {
			good := c.req(newKey(t), "B")
			out, errs := bs.ClaimBatch(ctx, []guard.ClaimRequest{r, good})
			if !errors.Is(errs[0], guard.ErrInvalidKey) {
				t.Errorf("batch claim of a key with %s: %v, want ErrInvalidKey", what, errs[0])
			}
			if errs[1] != nil || out[1].Status != guard.Acquired {
				t.Errorf("the good claim of the batch: %+v, %v", out[1], errs[1])
			}
		}
		if rec, err := s.Get(ctx, key); err == nil {
			t.Errorf("a claim of a key with %s stored %+v", what, rec)
		}
	}
}

func (c contract) retention(t *testing.T) {
	// Get must reach the store within the retention the completion gave:
	// onTime runs again with a longer one (as much longer as the lease)
	// when it did not.
	c.onTime(t, func(lease time.Duration) bool {
		ttl := c.h.TTL * (lease / c.h.Lease)
		s, key := c.h.New(t), newKey(t)
		acquire(t, s, c.req(key, "A"))
		completed := time.Now()
		mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("a"), ttl))
		rec, err := s.Get(ctx, key)
		if (errors.Is(err, guard.ErrNotFound) || err == nil && rec.TTL <= 0) && late(completed, ttl) {
			return true
		}
		if err != nil {
			t.Fatalf("Get(%s): %v", key, err)
		}
		if rec.TTL <= 0 || rec.TTL > ttl {
			t.Fatalf("record TTL = %s, want in (0, %s]", rec.TTL, ttl)
		}
		c.h.Advance(t, ttl)
		if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("Get after retention = %v, want ErrNotFound", err)
		}
		if l := acquire(t, s, c.req(key, "B")); l.Attempt != 1 {
			t.Fatalf("claim after retention = %+v, want a first attempt", l)
		}
		return false
	})
}

func (c contract) scopes(t *testing.T) {
	s := c.h.New(t)
	a := guard.Key{Scope: "tenant-a", ID: "same-" + rand.Text()}
	b := guard.Key{Scope: "tenant-b", ID: a.ID}
	acquire(t, s, c.req(a, "A"))
	mustOK(t, "complete a", s.Complete(ctx, guard.Lease{Key: a, Token: "A"}, []byte("a"), time.Hour))
	acquire(t, s, c.req(b, "B"))
	// Scope and ID boundaries must not blur: ("ab","c") is not ("a","bc").
	x := guard.Key{Scope: "ab", ID: "c" + a.ID}
	y := guard.Key{Scope: "a", ID: "bc" + a.ID}
	acquire(t, s, c.req(x, "X"))
	acquire(t, s, c.req(y, "Y"))
}

func (c contract) oddKeys(t *testing.T) {
	s := c.h.New(t)
	for _, id := range []string{"{tag}", "}{", "ключ-" + rand.Text(), "a b:c*d?[e]", string(bytes.Repeat([]byte("x"), guard.MaxIDLen))} {
		key := guard.Key{Scope: "odd " + rand.Text()[:6], ID: id}
		acquire(t, s, c.req(key, "A"))
		mustOK(t, "complete "+id, s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte(id), time.Hour))
		if out := claim(t, s, c.req(key, "B")); out.Status != guard.Replay || string(out.Result) != id {
			t.Fatalf("key %q: %+v", id, out)
		}
		if rec := get(t, s, key); rec.Key != key {
			t.Fatalf("record key = %q, want %q", rec.Key, key)
		}
	}
}

// longFingerprints: fingerprints of any length are told apart, including
// long ones that differ only near their end (a store may keep a digest).
func (c contract) longFingerprints(t *testing.T) {
	s := c.h.New(t)
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, fp := range []string{"", "x", strings.Repeat("y", 16), strings.Repeat("y", 17), hex64, strings.Repeat("z", 5000)} {
		key := newKey(t)
		r := c.req(key, "A")
		r.Fingerprint = fp
		acquire(t, s, r)
		if rec := get(t, s, key); !rec.SameFingerprint(fp) {
			t.Fatalf("fingerprint of %d bytes reads back as %q", len(fp), rec.Fingerprint)
		}
		mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("r"), time.Hour))
		for _, other := range []string{fp + "!", "!" + fp, fp[:max(len(fp)-1, 0)] + "?"} {
			if other == fp {
				continue
			}
			o := c.req(key, "B")
			o.Fingerprint = other
			if out := claim(t, s, o); out.Status != guard.Mismatch || out.Result != nil {
				t.Fatalf("claim with fingerprint %q after %q = %+v, want mismatch", short(other), short(fp), out)
			}
			if rec := get(t, s, key); rec.SameFingerprint(other) {
				t.Fatalf("record of %q says it has fingerprint %q", short(fp), short(other))
			}
		}
		r.Token = "C"
		if out := claim(t, s, r); out.Status != guard.Replay || string(out.Result) != "r" {
			t.Fatalf("claim with the same fingerprint of %d bytes = %+v, want replay", len(fp), out)
		}
	}
}

func short(s string) string {
	if len(s) > 20 {
		return fmt.Sprintf("%s…(%d bytes)", s[:20], len(s))
	}
	return s
}

// tokenShapes: owner tokens of the shapes callers use read back exactly and
// are told apart.
func (c contract) tokenShapes(t *testing.T) {
	s := c.h.New(t)
	for _, tok := range []string{"A", rand.Text(), strings.ToLower(rand.Text()), rand.Text() + "=", "тoken with spaces", strings.Repeat("t", 200)} {
		key := newKey(t)
		l := acquire(t, s, c.req(key, tok))
		if rec := get(t, s, key); rec.Token != tok {
			t.Fatalf("token %q reads back as %q", tok, rec.Token)
		}
		// A token one character off is another holder.
		last := "A"
		if strings.HasSuffix(tok, last) {
			last = "B"
		}
		other := tok[:len(tok)-1] + last
		mustLost(t, "complete with a token one character off", s.Complete(ctx, guard.Lease{Key: key, Token: other}, []byte("x"), time.Hour))
		mustOK(t, "complete", s.Complete(ctx, l, []byte("ok"), time.Hour))
		mustOK(t, "complete again with a hand-built lease", s.Complete(ctx, guard.Lease{Key: key, Token: tok}, []byte("ok"), time.Hour))
	}
}

// largeValues: a large result and a long failure reason are kept whole.
func (c contract) largeValues(t *testing.T) {
	s := c.h.New(t)
	key := newKey(t)
	acquire(t, s, c.req(key, "A"))
	reason := strings.Repeat("why? ", 20000)
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, reason, time.Hour))
	if rec := get(t, s, key); rec.LastError != reason {
		t.Fatalf("reason of %d bytes reads back as %d bytes", len(reason), len(rec.LastError))
	}
	acquire(t, s, c.req(key, "B"))
	result := make([]byte, 1<<20)
	for i := range result {
		result[i] = byte(i * 7)
	}
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: key, Token: "B"}, result, time.Hour))
	out := claim(t, s, c.req(key, "C"))
	if out.Status != guard.Replay || !bytes.Equal(out.Result, result) {
		t.Fatalf("replay of a 1 MiB result: %v, %d bytes", out.Status, len(out.Result))
	}
	if rec := get(t, s, key); rec.LastError != reason || rec.Attempt != 2 {
		t.Fatalf("after completion: attempt %d, last error of %d bytes", rec.Attempt, len(rec.LastError))
	}
}

// corruptRecords: a record the store cannot read fails every call with
// ErrCorrupt naming the key; nothing runs and the record stays as it was.
func (c contract) corruptRecords(t *testing.T) {
	if len(c.h.Corruptions) == 0 {
		t.Skip("the harness gives no way to corrupt a record")
	}
	for _, cor := range c.h.Corruptions {
		t.Run(cor.Name, func(t *testing.T) {
			s, key := c.h.New(t), newKey(t)
			unchanged := cor.Write(t, s, key)
			corrupt := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), key.String()) {
					t.Errorf("%s of a corrupt record = %v, want ErrCorrupt naming %s", what, err, key)
				}
			}
			l := guard.Lease{Key: key, Token: "A"}
			for _, tok := range []string{"A", "B"} {
				r := c.req(key, tok)
				r.MaxAttempts = 5
				out, err := s.Claim(ctx, r)
				corrupt("Claim", err)
				if out.Status != 0 {
					t.Errorf("Claim of a corrupt record answered %v", out.Status)
				}
			}
			corrupt("Complete", s.Complete(ctx, l, []byte("x"), time.Hour))
			corrupt("Fail", s.Fail(ctx, l, "x", time.Hour))
			corrupt("Release", s.Release(ctx, l))
			corrupt("Extend", s.Extend(ctx, l, time.Minute))
			_, err := s.Get(ctx, key)
			corrupt("Get", err)
			g := guard.New(s, guard.Options{})
			_, err = g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				t.Error("Do ran its effect on a corrupt record")
				return nil, nil
			})
			corrupt("Guard.Do", err)
			if !unchanged() {
				t.Error("the corrupt record changed")
			}
		})
	}
}

// raceOneKey: 64 claimants at once on one key; exactly one acquires.
func (c contract) raceOneKey(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	const n = 64
	var effects, replays, busy atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				effects.Add(1)
				return []byte("done"), nil
			})
			switch {
			case errors.Is(err, guard.ErrInProgress):
				busy.Add(1)
			case err != nil:
				t.Errorf("Do: %v", err)
			case res.Replayed:
				if string(res.Value) != "done" {
					t.Errorf("replayed %q", res.Value)
				}
				replays.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if effects.Load() != 1 {
		t.Fatalf("effects = %d, want 1 (replays %d, in progress %d)", effects.Load(), replays.Load(), busy.Load())
	}
	if got := 1 + replays.Load() + busy.Load(); got != n {
		t.Fatalf("answers = %d, want %d", got, n)
	}
	res, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran after completion")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Value) != "done" {
		t.Fatalf("Do after the race = %+v, %v; want replay of done", res, err)
	}
}

// raceManyKeys: Keys keys, Duplicates concurrent calls each: one effect per key.
func (c contract) raceManyKeys(t *testing.T) {
	s := c.h.New(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	prefix := rand.Text()[:8]
	effects := make([]atomic.Int64, c.h.Keys)
	var total, answered atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				key := guard.Key{Scope: "race", ID: fmt.Sprintf("%s-%d", prefix, i)}
				_, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
					effects[i].Add(1)
					total.Add(1)
					return []byte("ok"), nil
				})
				if err != nil && !errors.Is(err, guard.ErrInProgress) {
					t.Errorf("Do(%s): %v", key, err)
				}
				answered.Add(1)
			}
		}()
	}
	// A key's duplicates go out back to back, so they meet on different workers.
	for i := range c.h.Keys {
		for range c.h.Duplicates {
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Fatalf("key %d ran %d times, want 1", i, n)
		}
	}
	if total.Load() != int64(c.h.Keys) || answered.Load() != int64(c.h.Keys*c.h.Duplicates) {
		t.Fatalf("effects %d of %d keys, answered %d", total.Load(), c.h.Keys, answered.Load())
	}
}
