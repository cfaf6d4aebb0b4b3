package guard_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// lostReplyStores: a RedisStore whose client goes through a ReplyDropper to
// the shared Redis (go-redis's default MaxRetries: a pipeline whose answer
// is lost is sent again), and one straight to it, on one prefix.
func lostReplyStores(t *testing.T) (*testenv.ReplyDropper, *guard.RedisStore, *guard.RedisStore) {
	t.Helper()
	p := testenv.NewReplyDropper(t, testenv.RedisAddr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	prefix := testenv.Prefix(t)
	via := guardenv.StoreOn(t, c, guard.RedisOptions{Prefix: prefix})
	plain := guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{Prefix: prefix})
	return p, via, plain
}

// loseOneAnswer runs call with p armed to drop the answer to the first
// command that holds every one of subs, and fails the test unless exactly
// one answer was dropped: otherwise it proves nothing.
func loseOneAnswer(t *testing.T, p *testenv.ReplyDropper, call func(), subs ...string) {
	t.Helper()
	before := p.Dropped()
	p.Arm(containsAll(subs...))
	call()
	if n := p.Dropped() - before; n != 1 {
		t.Fatalf("%d answers dropped, want 1: the test proves nothing", n)
	}
}

// containsAll matches a command that holds every one of subs.
func containsAll(subs ...string) func([]byte) bool {
	return func(b []byte) bool {
		for _, s := range subs {
			if !bytes.Contains(b, []byte(s)) {
				return false
			}
		}
		return true
	}
}

// TestBatchUnderLostReply: every round trip of RedisStore's batch
// path (ClaimBatch's SET NX GET pipeline and its claim-script pipeline;
// WriteBatch's CompleteBatch, and its fail/release/extend scripts) has
// its answer lost once after Redis ran it; go-redis sends the pipeline
// again. Each key must get the answer the first run deserved
// (docs/design.md rule 2: "go-redis re-sends a command, or a whole
// pipeline, after a lost reply").
func TestBatchUnderLostReply(t *testing.T) {
	ctx := context.Background()
	p, via, plain := lostReplyStores(t)
	n := 0
	keys := func(k int) []guard.Key {
		out := make([]guard.Key, k)
		for i := range out {
			n++
			out[i] = guard.Key{Scope: "batchlost", ID: fmt.Sprintf("k%d-%d", n, time.Now().UnixNano())}
		}
		return out
	}
	req := func(k guard.Key, tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, MaxAttempts: 5}
	}
	// failFirst: key's first attempt, by tok, failed (straight to Redis).
	failFirst := func(t *testing.T, k guard.Key, tok string) {
		t.Helper()
		o, err := plain.Claim(ctx, req(k, tok))
		if err != nil || o.Status != guard.Acquired {
			t.Fatal(o, err)
		}
		if err := plain.Fail(ctx, o.Lease, "boom", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	claimBatch := func(t *testing.T, ks []guard.Key, tok string) []guard.Outcome {
		t.Helper()
		reqs := make([]guard.ClaimRequest, len(ks))
		for i, k := range ks {
			reqs[i] = req(k, fmt.Sprintf("%s-%d", tok, i))
		}
		out, errs := via.ClaimBatch(ctx, reqs)
		for i := range ks {
			if errs[i] != nil {
				t.Errorf("key %d: claim: %v", i, errs[i])
			}
		}
		return out
	}

	t.Run("claim fresh keys, SET pipeline answer lost", func(t *testing.T) {
		ks := keys(4)
		var out []guard.Outcome
		loseOneAnswer(t, p, func() { out = claimBatch(t, ks, "A") }, "set", ks[0].ID)
		for i, o := range out {
			if o.Status != guard.Acquired || o.Lease.Fence != 1 {
				t.Errorf("key %d: %v fence %d, want acquired fence 1", i, o.Status, o.Lease.Fence)
			}
		}
	})
	t.Run("claim failed keys, script pipeline answer lost", func(t *testing.T) {
		ks := keys(3)
		for i, k := range ks {
			failFirst(t, k, fmt.Sprintf("old-%d", i))
		}
		var out []guard.Outcome
		loseOneAnswer(t, p, func() { out = claimBatch(t, ks, "B") }, "evalsha", ks[0].ID)
		for i, o := range out {
			if o.Status != guard.Acquired || o.Lease.Fence != 2 || o.Lease.Attempt != 2 {
				t.Errorf("key %d: %v fence %d attempt %d, want acquired fence 2 attempt 2", i, o.Status, o.Lease.Fence, o.Lease.Attempt)
			}
		}
	})
	t.Run("complete batch, answer lost", func(t *testing.T) {
		ks := keys(4)
		out := claimBatch(t, ks, "C")
		ws := make([]guard.Write, len(ks))
		for i := range ks {
			ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: out[i].Lease, Result: []byte(fmt.Sprintf("r%d", i)), TTL: time.Hour}
		}
		var errs []error
		loseOneAnswer(t, p, func() { errs = via.WriteBatch(ctx, ws) }, "evalsha", ks[0].ID)
		for i, k := range ks {
			if errs[i] != nil {
				t.Errorf("key %d: complete that took effect answered %v, want nil", i, errs[i])
			}
			rec, err := plain.Get(ctx, k)
			if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != fmt.Sprintf("r%d", i) {
				t.Errorf("key %d: record %+v, %v", i, rec, err)
			}
		}
	})
	t.Run("fail, release, extend batch, answer lost", func(t *testing.T) {
		ks := keys(4)
		// The third key's attempt is a later one (its release returns it
		// to failed).
		failFirst(t, ks[2], "old")
		out := claimBatch(t, ks, "D")
		ws := []guard.Write{
			{Kind: guard.WriteFail, Lease: out[0].Lease, Reason: "x", TTL: time.Hour},
			{Kind: guard.WriteRelease, Lease: out[1].Lease},
			{Kind: guard.WriteRelease, Lease: out[2].Lease},
			{Kind: guard.WriteExtend, Lease: out[3].Lease, TTL: 2 * time.Minute},
		}
		var errs []error
		loseOneAnswer(t, p, func() { errs = via.WriteBatch(ctx, ws) }, "evalsha", "\x03D-0")
		for i := range ws {
			if errs[i] != nil {
				t.Errorf("write %d (%v): took effect, answered %v, want nil", i, ws[i].Kind, errs[i])
			}
		}
	})
}
