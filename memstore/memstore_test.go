package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// The zero Options use the real clock.
func TestDefaultClock(t *testing.T) {
	s := memstore.New(memstore.Options{})
	key := guard.Key{Scope: "s", ID: "default-clock"}
	r := req(key, "A")
	r.Lease, r.TTL = time.Hour, 2*time.Hour
	mustClaim(t, s, r, guard.Acquired)
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Generous bounds: the calls may be far apart on a loaded machine.
	if rec.LeaseLeft <= 50*time.Minute || rec.LeaseLeft > time.Hour {
		t.Fatalf("lease left = %s, want just under 1h", rec.LeaseLeft)
	}
	if rec.TTL <= 170*time.Minute || rec.TTL > 3*time.Hour { // the lease, then the TTL
		t.Fatalf("ttl = %s, want just under 3h", rec.TTL)
	}
	checkInvariants(t, s)
}

// A caller that changes its slices afterwards changes nothing stored.
func TestResultCopied(t *testing.T) {
	s, _ := newStore(t, memstore.Options{})
	key := guard.Key{Scope: "s", ID: "copy"}
	mustClaim(t, s, req(key, "A"), guard.Acquired)
	buf := []byte("original")
	if err := s.Complete(ctx, lease(key, "A"), buf, time.Hour); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXXXXX") // the caller reuses its buffer

	out := mustClaim(t, s, req(key, "B"), guard.Replay)
	if string(out.Result) != "original" {
		t.Fatalf("replay after the caller changed its buffer = %q", out.Result)
	}
	copy(out.Result, "YYYYYYYY") // a reader changes what it was given
	rec, err := s.Get(ctx, key)
	if err != nil || string(rec.Result) != "original" {
		t.Fatalf("Get after a replay's result was changed = %q, %v", rec.Result, err)
	}
	copy(rec.Result, "ZZZZZZZZ")
	if out := mustClaim(t, s, req(key, "C"), guard.Replay); string(out.Result) != "original" {
		t.Fatalf("replay after Get's result was changed = %q", out.Result)
	}
	// An empty result replays as an empty, non-nil result.
	key2 := guard.Key{Scope: "s", ID: "empty"}
	mustClaim(t, s, req(key2, "A"), guard.Acquired)
	if err := s.Complete(ctx, lease(key2, "A"), nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if out := mustClaim(t, s, req(key2, "B"), guard.Replay); out.Result == nil || len(out.Result) != 0 {
		t.Fatalf("replay of an empty result = %#v, want []byte{}", out.Result)
	}
}

// A cancelled context returns its error from every call, and the call
// changes nothing.
func TestCancelledContext(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	key := guard.Key{Scope: "s", ID: "cancelled"}

	if _, err := s.Claim(cctx, req(key, "A")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim = %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("a cancelled claim created the key: %v", err)
	}
	mustClaim(t, s, req(key, "A"), guard.Acquired)
	clk.Advance(4 * time.Second)
	before, _ := s.Get(ctx, key)
	for name, err := range map[string]error{
		"Complete": s.Complete(cctx, lease(key, "A"), []byte("r"), time.Hour),
		"Fail":     s.Fail(cctx, lease(key, "A"), "x", time.Hour),
		"Release":  s.Release(cctx, lease(key, "A")),
		"Extend":   s.Extend(cctx, lease(key, "A"), time.Hour),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s = %v, want context.Canceled", name, err)
		}
	}
	if _, err := s.Get(cctx, key); !errors.Is(err, context.Canceled) {
		t.Errorf("Get = %v, want context.Canceled", err)
	}
	if after, _ := s.Get(ctx, key); after.State != guard.StatePending || after.LeaseLeft != before.LeaseLeft || after.Token != "A" {
		t.Fatalf("cancelled calls changed the record: before %+v, after %+v", before, after)
	}
	dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer dcancel()
	if err := s.Complete(dctx, lease(key, "A"), nil, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Complete past its deadline = %v, want context.DeadlineExceeded", err)
	}
}

// Bad arguments get a clear error (not ErrLeaseLost) and change nothing.
func TestBadInput(t *testing.T) {
	s, _ := newStore(t, memstore.Options{})
	good := guard.Key{Scope: "s", ID: "bad-input"}
	for _, tc := range []struct {
		name string
		edit func(*guard.ClaimRequest)
		want string
	}{
		{"empty id", func(r *guard.ClaimRequest) { r.Key.ID = "" }, "empty id"},
		{"empty scope", func(r *guard.ClaimRequest) { r.Key.Scope = "" }, "empty scope"},
		{"long id", func(r *guard.ClaimRequest) { r.Key.ID = strings.Repeat("x", guard.MaxIDLen+1) }, "more than 255"},
		{"control character", func(r *guard.ClaimRequest) { r.Key.ID = "a\nb" }, "control character"},
		{"no token", func(r *guard.ClaimRequest) { r.Token = "" }, "without an owner token"},
		{"zero lease", func(r *guard.ClaimRequest) { r.Lease = 0 }, "lease 0s is not positive"},
		{"negative ttl", func(r *guard.ClaimRequest) { r.TTL = -time.Second }, "ttl -1s is not positive"},
		{"negative max attempts", func(r *guard.ClaimRequest) { r.MaxAttempts = -1 }, "max attempts -1 is negative"},
	} {
		r := req(good, "A")
		tc.edit(&r)
		_, err := s.Claim(ctx, r)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("%s: Claim = %v, want an error saying %q", tc.name, err, tc.want)
		}
		if strings.HasPrefix(tc.name, "empty") || tc.name == "long id" || tc.name == "control character" {
			if !errors.Is(err, guard.ErrInvalidKey) {
				t.Errorf("%s: %v does not wrap ErrInvalidKey", tc.name, err)
			}
		}
	}
	if st := s.Stats(); st.Records != 0 || st.Bytes != 0 {
		t.Fatalf("refused claims stored something: %+v", st)
	}

	mustClaim(t, s, req(good, "A"), guard.Acquired)
	before, _ := s.Get(ctx, good)
	for name, err := range map[string]error{
		"Complete ttl 0": s.Complete(ctx, lease(good, "A"), []byte("r"), 0),
		"Fail ttl -1s":   s.Fail(ctx, lease(good, "A"), "x", -time.Second),
		"Extend 0":       s.Extend(ctx, lease(good, "A"), 0),
	} {
		if err == nil || !strings.Contains(err.Error(), "not positive") {
			t.Errorf("%s = %v, want an error saying not positive", name, err)
		}
	}
	if after, _ := s.Get(ctx, good); after.State != guard.StatePending || after.LeaseLeft != before.LeaseLeft || after.TTL != before.TTL {
		t.Fatalf("refused writes changed the record: before %+v, after %+v", before, after)
	}
	// Nothing was lost: the holder still completes.
	if err := s.Complete(ctx, lease(good, "A"), []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
}

// A retried Fail or Release answers OK after another claim took the key
// over, as the Redis store's ptok makes it; a stale holder's still do not.
func TestRetryAfterTakeover(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})

	t.Run("release of a first attempt", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "release-first"}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Release(ctx, lease(key, "A")); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.Released != 1 {
			t.Fatalf("stats after release = %+v, want one released attempt remembered", st)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("Get of a released key = %v, want ErrNotFound", err)
		}
		b := mustClaim(t, s, req(key, "B"), guard.Acquired)
		if b.Lease.Fence != 2 || b.Lease.Attempt != 1 {
			t.Fatalf("claim after release = %+v, want a first attempt at the next fence", b.Lease)
		}
		if err := s.Release(ctx, lease(key, "A")); err != nil {
			t.Fatalf("retried release after B took the key = %v, want nil", err)
		}
		if err := s.Complete(ctx, lease(key, "A"), nil, time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("complete by the releaser = %v, want ErrLeaseLost", err)
		}
		if rec, _ := s.Get(ctx, key); rec.Token != "B" || rec.State != guard.StatePending {
			t.Fatalf("record after A's retries = %+v, want B pending", rec)
		}
	})

	t.Run("release remembered for a minute", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "release-forgotten"}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Release(ctx, lease(key, "A")); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Minute)
		mustClaim(t, s, req(key, "B"), guard.Acquired)
		if err := s.Release(ctx, lease(key, "A")); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("release retried after a minute, B holding = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("fail", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "fail"}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Fail(ctx, lease(key, "A"), "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, req(key, "B"), guard.Acquired)
		if err := s.Fail(ctx, lease(key, "A"), "boom", time.Hour); err != nil {
			t.Fatalf("retried fail after B took the key = %v, want nil", err)
		}
		if err := s.Complete(ctx, lease(key, "A"), nil, time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("complete by the failed holder = %v, want ErrLeaseLost", err)
		}
		if rec, _ := s.Get(ctx, key); rec.Token != "B" || rec.State != guard.StatePending || rec.Attempt != 2 {
			t.Fatalf("record after A's retries = %+v, want B pending on attempt 2", rec)
		}
	})

	t.Run("release of a later attempt", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "release-later"}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Fail(ctx, lease(key, "A"), "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, req(key, "B"), guard.Acquired)
		if err := s.Release(ctx, lease(key, "B")); err != nil {
			t.Fatal(err)
		}
		c := mustClaim(t, s, req(key, "C"), guard.Acquired)
		if c.Lease.Fence != 3 || c.Lease.Attempt != 2 {
			t.Fatalf("claim after B's release = %+v, want fence 3, attempt 2", c.Lease)
		}
		if err := s.Release(ctx, lease(key, "B")); err != nil {
			t.Fatalf("retried release after C took the key = %v, want nil", err)
		}
		if rec, _ := s.Get(ctx, key); rec.Token != "C" || rec.State != guard.StatePending {
			t.Fatalf("record after B's retry = %+v, want C pending", rec)
		}
	})

	t.Run("a dead holder is not a previous one", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "recovered"}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		clk.Advance(10 * time.Second) // A's lease runs out
		mustClaim(t, s, req(key, "B"), guard.Acquired)
		for name, err := range map[string]error{
			"fail by A":             s.Fail(ctx, lease(key, "A"), "x", time.Hour),
			"release by A":          s.Release(ctx, lease(key, "A")),
			"fail, empty token":     s.Fail(ctx, lease(key, ""), "x", time.Hour),
			"release, empty token":  s.Release(ctx, lease(key, "")),
			"complete, empty token": s.Complete(ctx, lease(key, ""), nil, time.Hour),
		} {
			if !errors.Is(err, guard.ErrLeaseLost) {
				t.Errorf("%s = %v, want ErrLeaseLost", name, err)
			}
		}
		if rec, _ := s.Get(ctx, key); rec.Token != "B" || rec.State != guard.StatePending {
			t.Fatalf("record = %+v, want B pending", rec)
		}
	})
}

// A holder that dies on the last allowed attempt exhausts the key: the
// record becomes failed with "lease expired", and the late holder can no
// longer complete it.
func TestExhaustedByExpiry(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	key := guard.Key{Scope: "s", ID: "exhausted-by-expiry"}
	r := req(key, "A")
	r.MaxAttempts = 1
	mustClaim(t, s, r, guard.Acquired)
	clk.Advance(r.Lease)
	r.Token = "B"
	for range 2 { // and the same answer again
		out := mustClaim(t, s, r, guard.Exhausted)
		if out.Attempts != 1 || out.LastError != "lease expired" {
			t.Fatalf("claim after the only attempt's lease ran out = %+v, want 1 attempt, lease expired", out)
		}
	}
	if rec, err := s.Get(ctx, key); err != nil || rec.State != guard.StateFailed || rec.LastError != "lease expired" || rec.Token != "A" {
		t.Fatalf("record = %+v, %v; want failed by A, lease expired", rec, err)
	}
	if err := s.Complete(ctx, lease(key, "A"), []byte("late"), time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("late holder's complete on an exhausted key = %v, want ErrLeaseLost", err)
	}
}

// A pending record whose holder died is kept for its TTL (at least its
// lease), recoverable meanwhile, and then removed like any other.
func TestPendingRetention(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	key := guard.Key{Scope: "s", ID: "pending-retention"}
	r := req(key, "A")
	r.Lease, r.TTL = 5*time.Second, time.Second // the record is kept for the lease, then the TTL: 6s
	mustClaim(t, s, r, guard.Acquired)
	clk.Advance(4 * time.Second)
	if out := mustClaim(t, s, req(key, "B"), guard.InProgress); out.LeaseLeft != time.Second {
		t.Fatalf("lease left = %s, want 1s", out.LeaseLeft)
	}
	// Extending pushes the record's end out with the lease.
	if err := s.Extend(ctx, lease(key, "A"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second)
	if rec, err := s.Get(ctx, key); err != nil || rec.TTL != 2*time.Second || rec.LeaseLeft != time.Second {
		t.Fatalf("record 9s after a 10s extend = %+v, %v; want 1s of lease and 2s of ttl", rec, err)
	}
	// The lease is over; the record stays for its TTL, so a claim then
	// would recover it.
	clk.Advance(time.Second)
	if rec, err := s.Get(ctx, key); err != nil || rec.TTL != time.Second || rec.LeaseLeft != 0 || rec.State != guard.StatePending {
		t.Fatalf("record at the lease's end = %+v, %v; want pending with 1s of ttl", rec, err)
	}
	clk.Advance(time.Second)
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get after the record's end = %v, want ErrNotFound", err)
	}
	if err := s.Complete(ctx, lease(key, "A"), nil, time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("complete after the record's end = %v, want ErrLeaseLost", err)
	}
	if out := mustClaim(t, s, req(key, "B"), guard.Acquired); out.Lease.Attempt != 1 {
		t.Fatalf("claim after the record's end = %+v, want a first attempt", out.Lease)
	}
}

// Expired records go without anyone asking for them: every call removes
// up to SweepBatch of them, and a call that finds one removes it.
func TestSweep(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	const n = 1000
	for i := range n {
		key := guard.Key{Scope: "sweep", ID: string(rune('a'+i%26)) + strings.Repeat("x", i/26)}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Complete(ctx, lease(key, "A"), []byte("result"), time.Duration(1+i%3)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	full := s.Stats()
	if full.Records != n || full.Bytes < n*memstore.RecordOverhead {
		t.Fatalf("stats = %+v, want %d records of at least %d bytes", full, n, memstore.RecordOverhead)
	}
	clk.Advance(3 * time.Second) // all expired; nothing removed yet
	if st := s.Stats(); st != full {
		t.Fatalf("Stats removed records: %+v, want %+v", st, full)
	}
	other := guard.Key{Scope: "elsewhere", ID: "x"}
	if _, err := s.Get(ctx, other); !errors.Is(err, guard.ErrNotFound) {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Records != n-memstore.SweepBatch {
		t.Fatalf("after one call: %d records, want %d", st.Records, n-memstore.SweepBatch)
	}
	for range n / memstore.SweepBatch {
		_ = s.Release(ctx, lease(other, "nobody"))
	}
	if st := s.Stats(); st.Records != 0 || st.Bytes != 0 || st.Released != 0 {
		t.Fatalf("after %d calls: %+v, want nothing held", 1+n/memstore.SweepBatch, st)
	}

	// A call that finds an expired record removes it, however many others
	// expired before it and wait for the sweep.
	for i := range 4 * memstore.SweepBatch {
		key := guard.Key{Scope: "sweep", ID: fmt.Sprint("early-", i)}
		mustClaim(t, s, req(key, "A"), guard.Acquired)
		if err := s.Fail(ctx, lease(key, "A"), "x", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	last := guard.Key{Scope: "sweep", ID: "last"}
	mustClaim(t, s, req(last, "A"), guard.Acquired)
	if err := s.Complete(ctx, lease(last, "A"), []byte("r"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if _, err := s.Get(ctx, last); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get of an expired record behind %d others = %v, want ErrNotFound", 4*memstore.SweepBatch, err)
	}
	if out := mustClaim(t, s, req(last, "B"), guard.Acquired); out.Lease.Fence != 1 {
		t.Fatalf("claim of an expired record = %+v, want a fresh key", out.Lease)
	}
}

// The same token claiming again gets the same answer and changes nothing:
// its lease is not renewed (nor shortened after an Extend).
func TestClaimAgainChangesNothing(t *testing.T) {
	s, clk := newStore(t, memstore.Options{})
	key := guard.Key{Scope: "s", ID: "claim-again"}
	r := req(key, "A")
	r.Lease = 10 * time.Second
	first := mustClaim(t, s, r, guard.Acquired)
	clk.Advance(8 * time.Second)
	before, _ := s.Get(ctx, key)
	if again := mustClaim(t, s, r, guard.Acquired); again.Lease != first.Lease {
		t.Fatalf("claim again = %+v, want %+v", again.Lease, first.Lease)
	}
	if after, _ := s.Get(ctx, key); after.LeaseLeft != 2*time.Second || after.TTL != before.TTL {
		t.Fatalf("claim again changed the record: before %+v, after %+v", before, after)
	}
	if err := s.Extend(ctx, lease(key, "A"), time.Minute); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, r, guard.Acquired)
	if rec, _ := s.Get(ctx, key); rec.LeaseLeft != time.Minute {
		t.Fatalf("claim again after a 1m extend: lease left %s, want 1m", rec.LeaseLeft)
	}
	clk.Advance(2 * time.Second) // the first lease's end: the extension holds
	mustClaim(t, s, req(key, "B"), guard.InProgress)
}

// A full store refuses new keys with ErrFull (an ErrUnavailable) and never
// makes room by forgetting a held key; expired records and remembered
// releases make room.
func TestFull(t *testing.T) {
	t.Run("records", func(t *testing.T) {
		s, clk := newStore(t, memstore.Options{MaxRecords: 2})
		k := func(id string) guard.Key { return guard.Key{Scope: "full", ID: id} }
		mustClaim(t, s, req(k("1"), "A"), guard.Acquired)
		mustClaim(t, s, req(k("2"), "A"), guard.Acquired)
		_, err := s.Claim(ctx, req(k("3"), "A"))
		if !errors.Is(err, memstore.ErrFull) || !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("claim of a third key = %v, want ErrFull wrapping ErrUnavailable", err)
		}
		if !strings.Contains(err.Error(), "2 records") || !strings.Contains(err.Error(), "full/3") {
			t.Fatalf("error %q does not say what is full", err)
		}
		// Held keys keep every answer.
		mustClaim(t, s, req(k("1"), "B"), guard.InProgress)
		if err := s.Complete(ctx, lease(k("1"), "A"), []byte("one"), time.Second); err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(ctx, lease(k("2"), "A"), "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, req(k("1"), "B"), guard.Replay)
		mustClaim(t, s, req(k("2"), "B"), guard.Acquired) // a retry is not a new key
		if _, err := s.Claim(ctx, req(k("3"), "A")); !errors.Is(err, memstore.ErrFull) {
			t.Fatalf("claim of a third key = %v, want ErrFull", err)
		}
		clk.Advance(time.Second) // key 1's retention ends: room for one
		mustClaim(t, s, req(k("3"), "A"), guard.Acquired)
		if _, err := s.Get(ctx, k("2")); err != nil {
			t.Fatalf("key 2 was forgotten to make room: %v", err)
		}
	})

	t.Run("released attempts make room", func(t *testing.T) {
		s, _ := newStore(t, memstore.Options{MaxRecords: 1})
		k1, k2 := guard.Key{Scope: "full", ID: "1"}, guard.Key{Scope: "full", ID: "2"}
		mustClaim(t, s, req(k1, "A"), guard.Acquired)
		if err := s.Release(ctx, lease(k1, "A")); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, req(k2, "A"), guard.Acquired)
		if st := s.Stats(); st.Records != 1 || st.Released != 0 {
			t.Fatalf("stats = %+v, want the release forgotten for the new key", st)
		}
	})

	t.Run("bytes", func(t *testing.T) {
		s, _ := newStore(t, memstore.Options{MaxBytes: 3 * memstore.RecordOverhead})
		k := func(id string) guard.Key { return guard.Key{Scope: "full", ID: id} }
		mustClaim(t, s, req(k("1"), "A"), guard.Acquired)
		big := bytes.Repeat([]byte("r"), 5*memstore.RecordOverhead)
		if err := s.Complete(ctx, lease(k("1"), "A"), big, time.Hour); err != nil {
			t.Fatalf("a completion over the bound = %v, want it kept", err)
		}
		if st := s.Stats(); st.Bytes <= 5*memstore.RecordOverhead {
			t.Fatalf("bytes = %d, want the result counted", st.Bytes)
		}
		if _, err := s.Claim(ctx, req(k("2"), "A")); !errors.Is(err, memstore.ErrFull) {
			t.Fatalf("claim over the byte bound = %v, want ErrFull", err)
		}
		if out := mustClaim(t, s, req(k("1"), "B"), guard.Replay); !bytes.Equal(out.Result, big) {
			t.Fatal("the large result was not kept whole")
		}
	})

	t.Run("expired records make room", func(t *testing.T) {
		// 50 small records fill the bound; a key with an 8 KiB fingerprint
		// needs more of them gone than one call's sweep removes.
		const n = 50
		s, clk := newStore(t, memstore.Options{MaxBytes: n * (memstore.RecordOverhead + 8)})
		for i := range n {
			key := guard.Key{Scope: "f", ID: fmt.Sprintf("%03d", i)}
			r := req(key, "A")
			r.Fingerprint = "f"
			if _, err := s.Claim(ctx, r); err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
			if err := s.Complete(ctx, lease(key, "A"), nil, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		big := req(guard.Key{Scope: "f", ID: "big"}, "A")
		big.Fingerprint = strings.Repeat("f", 8<<10)
		if _, err := s.Claim(ctx, big); !errors.Is(err, memstore.ErrFull) {
			t.Fatalf("claim of a large key in a full store = %v, want ErrFull", err)
		}
		clk.Advance(time.Second)
		mustClaim(t, s, big, guard.Acquired)
	})

	t.Run("through the guard", func(t *testing.T) {
		s, _ := newStore(t, memstore.Options{MaxRecords: 1})
		g := guard.New(s, guard.Options{})
		fn := func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }
		if _, err := g.Do(ctx, guard.Key{Scope: "full", ID: "1"}, "fp", fn); err != nil {
			t.Fatal(err)
		}
		_, err := g.Do(ctx, guard.Key{Scope: "full", ID: "2"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			t.Error("the effect ran on a full store")
			return nil, nil
		})
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("Do on a full store = %v, want ErrUnavailable", err)
		}
	})
}

// Two processes, each with a memstore, both run the effect: the store
// guarantees nothing across processes, and the documentation says so.
func TestNothingAcrossProcesses(t *testing.T) {
	key := guard.Key{Scope: "s", ID: "two-processes"}
	effects := 0
	for range 2 { // one store per "process"
		s, _ := newStore(t, memstore.Options{})
		g := guard.New(s, guard.Options{})
		if _, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			effects++
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if effects != 2 {
		t.Fatalf("effects = %d; two memstores are two independent stores", effects)
	}
}
