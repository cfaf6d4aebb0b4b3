package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// released: what a released attempt leaves (docs/design.md, "The state
// machine": "release(token): pending → absent (a first attempt) or →
// failed with the attempt uncounted, as if never claimed"; guard.Store:
// Release "undoes the holder's claim as if it had never been made").
// (A mutation review of scripts/*.lua: each of these rules was pinned only
// by tests in package guard, on the Redis store and the memstore.)
func (c contract) released(t *testing.T) {
	c.run(t, []testCase{
		{"NoRecordToEnd", c.noRecordToEnd},
		{"FirstAttemptAgain", c.firstAttemptAgain},
		{"FirstAttemptAnyFingerprint", c.releasedAnyFingerprint},
		{"LaterAttemptKeepsLastError", c.releaseKeepsLastError},
		{"LaterAttemptKeepsRecovered", c.releaseKeepsRecovered},
	})
}

// noRecordToEnd: Fail, Complete and Extend are "for the owner only"
// (rule 1); a holder whose key has no record of it (the key is absent, or
// its holder released its first attempt, which reads as absent) holds
// nothing: each answers ErrLeaseLost and creates nothing. A Fail answering
// OK there would tell the holder its failure, and its attempt, were
// recorded when nothing was. Release answers OK (it is undone already).
func (c contract) noRecordToEnd(t *testing.T) {
	s := c.h.New(t)
	absent := func(what string, key guard.Key) {
		t.Helper()
		if rec, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("Get after %s = %+v, %v; want ErrNotFound", what, rec, err)
		}
	}
	gone := newKey(t)
	mustLost(t, "fail of an absent key", s.Fail(ctx, guard.Lease{Key: gone, Token: "A"}, "boom", time.Hour))
	absent("a fail of an absent key", gone)

	key := newKey(t)
	r := c.req(key, "A")
	r.Lease = heldLease // the release, not the lease's end, must be what frees it
	a := acquire(t, s, r)
	mustOK(t, "release", s.Release(ctx, a))
	mustLost(t, "fail by the holder of a released first attempt", s.Fail(ctx, a, "boom", time.Hour))
	absent("the released holder's fail", key)
	mustLost(t, "complete by the holder of a released first attempt", s.Complete(ctx, a, []byte("a"), time.Hour))
	absent("the released holder's complete", key)
	mustLost(t, "extend by the holder of a released first attempt", s.Extend(ctx, a, time.Hour))
	absent("the released holder's extend", key)
	mustOK(t, "release again", s.Release(ctx, a))
	absent("the release sent again", key)
	// Nothing of A's calls stands in the way of the next claim.
	if l := acquire(t, s, c.req(key, "B")); l.Attempt != 1 || l.Recovered {
		t.Errorf("claim after the released holder's calls = %+v, want a first attempt", l)
	}
}

// firstAttemptAgain: a released first attempt reads as absent (rule 4),
// so the next claim is a first attempt: attempt 1, not recovered, but at
// a fence above the released holder's (it ran, and a write of its may
// still be on its way downstream), and Get agrees. So is a copy of the
// released holder's own claim that lands after its release (rule 2: "the
// copy takes it as a first attempt again, as one claim would").
func (c contract) firstAttemptAgain(t *testing.T) {
	s := c.h.New(t)
	for _, tok := range []string{"B", "A"} {
		key := newKey(t)
		a := acquire(t, s, c.req(key, "A"))
		mustOK(t, "release A", s.Release(ctx, a))
		what := "claim " + tok + " after A released its first attempt"
		l := acquire(t, s, c.req(key, tok))
		if l.Attempt != 1 || l.Recovered || l.Fence <= a.Fence {
			t.Errorf("%s = %+v, want attempt 1, not recovered, a fence above %d", what, l, a.Fence)
		}
		if again := acquire(t, s, c.req(key, tok)); again != l {
			t.Errorf("the %s sent again = %+v, want the same lease %+v", what, again, l)
		}
		// (A store whose fences outlive its records may keep the fence
		// apart from the record: backstop.Wrap's lease bears the
		// backstop's, its Get the primary's record.)
		rec := get(t, s, key)
		if rec.State != guard.StatePending || rec.Token != tok || rec.Attempt != 1 || rec.Recovered ||
			!c.h.FencesOutliveRecords && rec.Fence != l.Fence {
			t.Errorf("record after the %s = %+v, want %s's, pending, fence %d, attempt 1, not recovered", what, rec, tok, l.Fence)
		}
		// Its attempts count from there: a failure and a retry are attempt 2.
		mustOK(t, "fail "+tok, s.Fail(ctx, l, "boom", time.Hour))
		if next := acquire(t, s, c.req(key, "C")); next.Attempt != 2 || next.Fence != l.Fence+1 || next.Recovered {
			t.Errorf("retry after the %s failed = %+v, want attempt 2, fence %d, not recovered", what, next, l.Fence+1)
		}
	}
}

// firstFence reports whether fence is the one a first attempt may have
// after the record of the key, whose fence was gone, expired.
func (c contract) firstFence(fence, released int64) bool {
	if c.h.FencesOutliveRecords {
		return fence > released
	}
	return fence == 1
}

func (c contract) firstFenceWant(released int64) string {
	if c.h.FencesOutliveRecords {
		return fmt.Sprintf("a fence above %d", released)
	}
	return "fence 1"
}

// releasedAnyFingerprint: a released first attempt reads as absent, so a
// claim with another fingerprint takes the key as a first attempt
// (docs/design.md, "The state changes": "another fingerprint → mismatch
// (any record but a released one)"); MismatchEveryState asks every other
// state. The record then bears the new claim's fingerprint: the same
// payload again is its holder's own claim, the first payload a mismatch.
func (c contract) releasedAnyFingerprint(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	r := c.req(key, "A")
	r.Fingerprint = "first payload"
	a := acquire(t, s, r)
	mustOK(t, "release A", s.Release(ctx, a))
	r.Token, r.Fingerprint = "B", "another payload"
	r.Lease = heldLease
	out := claim(t, s, r)
	if out.Status != guard.Acquired || out.Lease.Attempt != 1 || out.Lease.Recovered {
		t.Fatalf("claim with another fingerprint after a released first attempt = %+v, want acquired, a first attempt", out)
	}
	if rec := get(t, s, key); rec.Token != "B" || !rec.SameFingerprint("another payload") {
		t.Errorf("record = %+v, want B's with B's fingerprint", rec)
	}
	r.Token, r.Fingerprint = "C", "first payload"
	if out := claim(t, s, r); out.Status != guard.Mismatch {
		t.Errorf("claim with the released payload after B took the key = %+v, want mismatch", out)
	}
}

// releaseKeepsLastError: releasing a later attempt leaves the failed
// record the claim took over, as if the claim had never been made: its
// attempts are the failures before it, its last error the last failure's
// reason, so Get shows it, and a claim that finds the attempts run out
// answers Exhausted with it. The release sent again (its reply lost)
// answers OK and uncounts nothing more; a completion its holder sends
// after it is ErrLeaseLost and stores nothing.
func (c contract) releaseKeepsLastError(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	for _, tok := range []string{"A", "B"} {
		l := acquire(t, s, c.req(key, tok))
		mustOK(t, "fail "+tok, s.Fail(ctx, l, "declined by "+tok, time.Hour))
	}
	third := acquire(t, s, c.req(key, "C"))
	for _, what := range []string{"release C", "release C sent again"} {
		mustOK(t, what, s.Release(ctx, third))
		if rec := get(t, s, key); rec.State != guard.StateFailed || rec.Attempt != 2 || rec.LastError != "declined by B" {
			t.Errorf("record after %s = %+v, want failed, attempt 2, last error %q", what, rec, "declined by B")
		}
	}
	// Its holder holds nothing: a completion it sends after the release
	// stores nothing (its attempt, uncounted, never ran the effect).
	mustLost(t, "complete by the holder that released attempt 3", s.Complete(ctx, third, []byte("c"), time.Hour))
	if rec := get(t, s, key); rec.State != guard.StateFailed || rec.Attempt != 2 {
		t.Errorf("record after the released holder's complete = %+v, want failed, attempt 2", rec)
	}
	r := c.req(key, "D")
	r.MaxAttempts = 2
	if out := claim(t, s, r); out.Status != guard.Exhausted || out.Attempts != 2 || out.LastError != "declined by B" {
		t.Errorf("claim under MaxAttempts 2 = %+v, want exhausted after 2 with %q", out, "declined by B")
	}
}

// releaseKeepsRecovered: a holder that took an expired lease over
// (recovered) and releases its attempt leaves the failed record marked
// recovered, as its Complete and Fail do (Endings/RecoveredKept): the
// attempt is uncounted, the dead holder's is not.
func (c contract) releaseKeepsRecovered(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	c.h.Advance(t, c.h.Lease) // A stops heartbeating: it crashed
	b := acquire(t, s, c.req(key, "B"))
	if !b.Recovered || b.Attempt != 2 || b.Fence != a.Fence+1 {
		t.Fatalf("lease after A's ran out = %+v, want recovered, attempt 2, fence %d", b, a.Fence+1)
	}
	if again := acquire(t, s, c.req(key, "B")); again != b {
		t.Errorf("the recovering claim sent again = %+v, want the same lease %+v", again, b)
	}
	mustOK(t, "release B", s.Release(ctx, b))
	if rec := get(t, s, key); rec.State != guard.StateFailed || rec.Attempt != 1 || rec.Fence != b.Fence || !rec.Recovered {
		t.Errorf("record after the recovered holder's release = %+v, want failed, attempt 1, fence %d, recovered", rec, b.Fence)
	}
	if l := acquire(t, s, c.req(key, "C")); l.Attempt != 2 || l.Fence != b.Fence+1 || l.Recovered {
		t.Errorf("claim after the release = %+v, want attempt 2, fence %d, not recovered", l, b.Fence+1)
	}
}
