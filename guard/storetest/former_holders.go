package storetest

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// formerHolders: a holder whose attempt ended (it failed it, released
// it, or its lease ran out and a claim recorded it exhausted) or whose key
// another claim took over holds the key no longer: every write it sends
// after that, other than the retried Fail or Release that ended its own
// attempt (ptok), gets ErrLeaseLost and changes nothing (docs/design.md,
// "The state machine", rule 1: "a holder that lost its key changes nothing
// and gets ErrLeaseLost"; guard.Store: "every write is a compare-and-set
// on the owner token"). In particular:
//
//   - its Extend neither answers OK nor revives or prolongs anything: not
//     its own failed record, not the dead holder's exhausted one, not the
//     lease of the holder that took the key over after it (ptok names it
//     for a retried Fail or Release only);
//   - a copy of its claim, sent again after another claim took the key
//     over, takes nothing: it is not the same claim as the new holder's
//     (rule 2: "a repeated claim that lands after its holder failed the
//     key, or released an attempt after the first, takes nothing"), and an
//     answer Acquired would hand it the new holder's lease and run the
//     effect twice;
//   - its retried Fail answers OK and leaves the record as it is, the new
//     holder's own failure reason included.
//
// (a mutation review: a memstore whose Extend checked only the token, or
// accepted ptok, or whose claim took ptok for the same claim, passed the
// contract.)
func (c contract) formerHolders(t *testing.T) {
	s := c.h.New(t)
	// unchanged checks that the record is as before and its lease and
	// retention not prolonged.
	unchanged := func(what string, key guard.Key, before guard.Record) {
		t.Helper()
		after := get(t, s, key)
		if after.State != before.State || after.Token != before.Token || after.Fence != before.Fence ||
			after.Attempt != before.Attempt || after.LastError != before.LastError ||
			after.LeaseLeft > before.LeaseLeft || after.TTL > before.TTL {
			t.Errorf("%s changed the record: before %+v, after %+v", what, before, after)
		}
	}
	extendLost := func(what string, l guard.Lease) {
		t.Helper()
		before := get(t, s, l.Key)
		mustLost(t, what, s.Extend(ctx, l, 24*time.Hour))
		unchanged(what, l.Key, before)
	}

	// Its own failure, before any other claim.
	key := newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail A", s.Fail(ctx, a, "a failed", time.Hour))
	extendLost("extend by the holder that failed", a)

	// A later attempt it released (the record is failed again).
	b := acquire(t, s, c.req(key, "B"))
	mustOK(t, "release B", s.Release(ctx, b))
	extendLost("extend by the holder that released a later attempt", b)

	// The key taken over after its failure (the record keeps A as ptok).
	fresh := newKey(t)
	a2 := acquire(t, s, c.req(fresh, "A"))
	mustOK(t, "fail A", s.Fail(ctx, a2, "a failed", time.Hour))
	br := c.req(fresh, "B")
	br.Lease = heldLease // alive to the end, however slow the machine
	b2 := acquire(t, s, br)
	extendLost("extend by the former holder after B took the key", a2)
	before := get(t, s, fresh)
	out := claim(t, s, c.req(fresh, "A"))
	if out.Status != guard.InProgress || out.Lease != (guard.Lease{}) || out.Steps != nil {
		t.Errorf("claim A sent again after B took the key = %+v, want in progress, nothing taken", out)
	}
	unchanged("claim A sent again after B took the key", fresh, before)
	mustOK(t, "fail B", s.Fail(ctx, b2, "b failed", time.Hour))
	before = get(t, s, fresh)
	mustOK(t, "A's fail sent again after B's", s.Fail(ctx, a2, "a failed", time.Hour))
	unchanged("A's fail sent again after B's", fresh, before)
	if rec := get(t, s, fresh); rec.LastError != "b failed" {
		t.Errorf("last error after A's retried fail = %q, want B's %q", rec.LastError, "b failed")
	}

	// A released first attempt, the key taken by a new first attempt.
	rel := newKey(t)
	a3 := acquire(t, s, c.req(rel, "A"))
	mustOK(t, "release A", s.Release(ctx, a3))
	nr := c.req(rel, "B")
	nr.Lease = heldLease
	acquire(t, s, nr)
	extendLost("extend by the holder that released a first attempt, after B took the key", a3)
	before = get(t, s, rel)
	if out := claim(t, s, c.req(rel, "A")); out.Status != guard.InProgress || out.Lease != (guard.Lease{}) {
		t.Errorf("claim A sent again after its release and B's claim = %+v, want in progress, nothing taken", out)
	}
	unchanged("claim A sent again after its release and B's claim", rel, before)

	// A holder that died on its last attempt, recorded exhausted.
	last := newKey(t)
	r := c.req(last, "A")
	r.MaxAttempts = 1
	dead := acquire(t, s, r)
	c.h.Advance(t, c.h.Lease)
	r.Token = "B"
	if out := claim(t, s, r); out.Status != guard.Exhausted {
		t.Fatalf("claim after the only attempt's lease ran out = %+v, want exhausted", out)
	}
	extendLost("extend by the dead holder of an exhausted key", dead)
	r.Token = "C"
	if out := claim(t, s, r); out.Status != guard.Exhausted {
		t.Errorf("claim after the dead holder's extend = %+v, want exhausted", out)
	}
}
