package guard_test

// records written by hand, as bytes, in every shape the decoder
// accepts (format 1 and 2, every state, multi-byte integers, raw and packed
// tokens, digested fingerprints, a previous holder, a long last error),
// through every operation of a RedisStore on real Redis. The expected bytes
// are built by an encoder of this file's own, from docs/design.md's table,
// not by guard/record.go.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

type hrec struct {
	ver       byte
	st        byte // p c f r P C F
	fence     uint64
	att       uint64
	fp        string // the fingerprint as given by a caller
	tok, ptok string // "" ptok: none
	lastErr   string
	ret       uint64 // pending: retention ms
	scope, id string
	result    string
	steps     [][2]string
}

func huv(n uint64) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

func hstr(s string) []byte { return append(huv(uint64(len(s))), s...) }

func hfp(fp string) []byte {
	if len(fp) <= 16 {
		return append([]byte{byte(len(fp))}, fp...)
	}
	sum := sha256.Sum256([]byte(fp))
	return append([]byte{255}, sum[:16]...)
}

const hb32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

func htok(tok string) []byte {
	if tok == "" {
		return []byte{0}
	}
	if len(tok) == 26 && strings.Trim(tok, hb32) == "" {
		n := new(big.Int)
		for i := range len(tok) {
			n.Lsh(n, 5)
			n.Or(n, big.NewInt(int64(strings.IndexByte(hb32, tok[i]))))
		}
		out := make([]byte, 17)
		n.FillBytes(out)
		return append([]byte{255}, out...)
	}
	return append([]byte{byte(len(tok))}, tok...)
}

func (r hrec) bytes() []byte {
	b := []byte{r.ver, r.st}
	b = append(b, huv(r.fence)...)
	b = append(b, huv(r.att)...)
	b = append(b, hfp(r.fp)...)
	b = append(b, htok(r.tok)...)
	b = append(b, htok(r.ptok)...)
	b = append(b, hstr(r.lastErr)...)
	switch r.st | 0x20 {
	case 'p':
		b = append(b, huv(r.ret)...)
		fallthrough
	case 'f':
		b = append(append(b, hstr(r.scope)...), hstr(r.id)...)
	case 'c':
		b = append(b, hstr(r.result)...)
	}
	for _, s := range r.steps {
		b = append(append(b, hstr(s[0])...), hstr(s[1])...)
	}
	return b
}

// The fixture's fields: every integer and length needs more than one byte.
var (
	hLongFP  = strings.Repeat("fingerprint-", 4) // 48 bytes: kept as a digest
	hErr     = strings.Repeat("e", 200)
	hScope   = "POST /charges " + strings.Repeat("s", 140)
	hPacked  = "ABCDEFGHIJKLMNOPQRSTUVWX27" // rand.Text's shape: packed
	hPacked2 = "ZZZZZZZZZZZZZZZZZZZZZZZZZ2"
)

func hbase(st byte, id string) hrec {
	return hrec{ver: 1, st: st, fence: 300, att: 200, fp: hLongFP, tok: "holder-1", ptok: hPacked,
		lastErr: hErr, ret: 100_000, scope: hScope, id: id}
}

type hfix struct {
	t   *testing.T
	s   *guard.RedisStore
	ctx context.Context
}

func (f hfix) key(id string) guard.Key { return guard.Key{Scope: hScope, ID: id} }

func (f hfix) put(r hrec, ttl time.Duration) guard.Key {
	f.t.Helper()
	k := f.key(r.id)
	if err := f.s.Client().Set(f.ctx, f.s.Name(k), r.bytes(), ttl).Err(); err != nil {
		f.t.Fatal(err)
	}
	return k
}

func (f hfix) want(what string, k guard.Key, r hrec) {
	f.t.Helper()
	got, err := f.s.Client().Get(f.ctx, f.s.Name(k)).Bytes()
	if err != nil {
		f.t.Fatalf("%s: read back: %v", what, err)
	}
	if w := r.bytes(); !bytes.Equal(got, w) {
		f.t.Errorf("%s: record\n got %q\nwant %q", what, got, w)
	}
}

func (f hfix) pttl(k guard.Key) time.Duration {
	f.t.Helper()
	d, err := f.s.Client().PTTL(f.ctx, f.s.Name(k)).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f hfix) req(k guard.Key, tok, fp string) guard.ClaimRequest {
	return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
}

// TestHandWrittenRecords: every shape of record the decoder
// accepts, written by hand, goes through claim (replay, mismatch, in
// progress, retry, takeover, recovery, exhaustion), complete, fail,
// release, extend, steps, Get, GetByName and ScanRecords keeping every
// field the operation does not change, byte for byte.
func TestHandWrittenRecords(t *testing.T) {
	ctx := context.Background()
	s := guardenv.Store(t, guard.RedisOptions{})
	f := hfix{t: t, s: s, ctx: ctx}
	steps := [][2]string{{"reserve", "r-1"}, {strings.Repeat("n", 64), strings.Repeat("\x00\xff", 100)}}

	t.Run("PendingAlive", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		r := hbase('p', "pending-alive")
		k := f.put(r, 100*time.Second+time.Minute)
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != guard.StatePending || rec.Fence != 300 || rec.Attempt != 200 ||
			rec.Token != "holder-1" || rec.LastError != hErr || rec.Key != k || rec.LeaseLeft < 50*time.Second ||
			!rec.SameFingerprint(hLongFP) || rec.Steps != nil {
			t.Fatalf("Get = %+v, %v", rec, err)
		}
		if out, err := s.Claim(ctx, f.req(k, "other", hLongFP)); err != nil || out.Status != guard.InProgress {
			t.Errorf("claim of another = %+v, %v; want in progress", out, err)
		}
		if out, err := s.Claim(ctx, f.req(k, "other", "another payload")); err != nil || out.Status != guard.Mismatch {
			t.Errorf("claim of another payload = %+v, %v; want mismatch", out, err)
		}
		out, err := s.Claim(ctx, f.req(k, "holder-1", hLongFP))
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 300 || out.Lease.Attempt != 200 {
			t.Errorf("the holder's claim again = %+v, %v; want acquired, fence 300, attempt 200", out, err)
		}
		f.want("after claims", k, r)
		l := guard.Lease{Key: k, Token: "holder-1"}
		if err := s.Extend(ctx, l, 5*time.Minute); err != nil {
			t.Fatal(err)
		}
		f.want("after extend", k, r)
		if d := f.pttl(k); d < 100*time.Second+4*time.Minute {
			t.Errorf("PTTL after extending by 5 min = %s", d)
		}
		for i, st := range steps {
			if err := s.SaveStep(ctx, out.Lease, i, guard.StepResult{Name: st[0], Result: []byte(st[1])}); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		r2 := r
		r2.ver, r2.steps = 2, steps
		f.want("after two steps", k, r2)
		if rec, err := s.Get(ctx, k); err != nil || len(rec.Steps) != 2 || string(rec.Steps[1].Result) != steps[1][1] {
			t.Errorf("Get with steps = %+v, %v", rec, err)
		}
		if err := s.Complete(ctx, out.Lease, []byte("the result"), time.Hour); err != nil {
			t.Fatal(err)
		}
		c := r
		c.st, c.result = 'c', "the result"
		f.want("completed", k, c)
		if out, err := s.Claim(ctx, f.req(k, "other", hLongFP)); err != nil || out.Status != guard.Replay || string(out.Result) != "the result" {
			t.Errorf("claim after completion = %+v, %v; want replay", out, err)
		}
		if err := s.Complete(ctx, l, []byte("the result"), time.Hour); err != nil {
			t.Errorf("complete again = %v", err)
		}
		for name, err := range map[string]error{
			"fail": s.Fail(ctx, l, "x", time.Hour), "release": s.Release(ctx, l), "extend": s.Extend(ctx, l, time.Minute),
		} {
			if !errors.Is(err, guard.ErrLeaseLost) {
				t.Errorf("%s of a completed record = %v, want ErrLeaseLost", name, err)
			}
		}
		f.want("completed, after later writes", k, c)
	})

	t.Run("FailThenTakeOver", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		r := hbase('P', "fail-takeover")
		r.ver, r.steps = 2, steps
		k := f.put(r, 100*time.Second+time.Minute)
		l := guard.Lease{Key: k, Token: "holder-1"}
		if err := s.Fail(ctx, l, "boom", 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		fr := r
		fr.st, fr.lastErr = 'F', "boom"
		f.want("failed", k, fr)
		if d := f.pttl(k); d < 119*time.Minute {
			t.Errorf("failed record's PTTL = %s, want the fail's 2h", d)
		}
		if err := s.Fail(ctx, l, "boom", 2*time.Hour); err != nil {
			t.Errorf("fail again = %v", err)
		}
		out, err := s.Claim(ctx, f.req(k, hPacked2, hLongFP))
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 301 || out.Lease.Attempt != 201 ||
			out.Lease.Recovered || len(out.Steps) != 2 || out.Steps[0].Name != "reserve" {
			t.Fatalf("claim of the failed record = %+v, %v; want fence 301, attempt 201, not recovered, its steps", out, err)
		}
		p := r
		p.st, p.tok, p.ptok, p.lastErr, p.fence, p.att, p.ret = 'p', hPacked2, "holder-1", "boom", 301, 201, 3_600_000
		f.want("taken over", k, p)
		if err := s.Fail(ctx, l, "boom", 2*time.Hour); err != nil {
			t.Errorf("the first holder's fail sent again after the takeover = %v, want OK (ptok)", err)
		}
		f.want("taken over, after the retried fail", k, p)
		// The new holder completes through the lease its claim gave.
		if err := s.Complete(ctx, out.Lease, []byte("done"), time.Hour); err != nil {
			t.Fatal(err)
		}
		c := p
		c.ver, c.st, c.steps, c.result = 1, 'c', nil, "done"
		f.want("completed", k, c)
	})

	t.Run("ExpiredLease", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		for _, max := range []int{0, 200} {
			r := hbase('p', "expired-"+string(rune('a'+max%26)))
			r.ver, r.steps = 2, steps[:1]
			k := f.put(r, 90*time.Second) // PTTL < retention: the lease ran out
			rec, err := s.Get(ctx, k)
			if err != nil || rec.LeaseLeft != 0 || rec.State != guard.StatePending {
				t.Fatalf("Get = %+v, %v", rec, err)
			}
			req := f.req(k, "new-holder", hLongFP)
			req.MaxAttempts = max
			out, err := s.Claim(ctx, req)
			if max == 0 {
				if err != nil || out.Status != guard.Acquired || !out.Lease.Recovered || out.Lease.Fence != 301 || out.Lease.Attempt != 201 || len(out.Steps) != 1 {
					t.Fatalf("recovery = %+v, %v", out, err)
				}
				p := r
				p.st, p.tok, p.ptok, p.fence, p.att, p.ret = 'P', "new-holder", "", 301, 201, 3_600_000
				f.want("recovered", k, p)
				if err := s.Fail(ctx, guard.Lease{Key: k, Token: "holder-1"}, "late", time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("the dead holder's late fail = %v, want ErrLeaseLost", err)
				}
				// Release of a later attempt with steps: failed, attempt uncounted.
				if err := s.Release(ctx, out.Lease); err != nil {
					t.Fatal(err)
				}
				fr := p
				fr.st, fr.att = 'F', 200
				f.want("released", k, fr)
				continue
			}
			if err != nil || out.Status != guard.Exhausted || out.Attempts != 200 || out.LastError != "lease expired" {
				t.Fatalf("claim at MaxAttempts = %+v, %v; want exhausted, lease expired", out, err)
			}
			fr := r
			fr.st, fr.lastErr = 'f', "lease expired"
			f.want("exhausted", k, fr)
		}
	})

	t.Run("ReleaseFirstAttempt", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		for _, withSteps := range []bool{false, true} {
			r := hbase('p', "release-first")
			r.fence, r.att, r.ptok, r.lastErr = 1, 1, "", ""
			if withSteps {
				r.id, r.ver, r.steps = "release-first-steps", 2, steps
			}
			k := f.put(r, 100*time.Second+time.Minute)
			l := guard.Lease{Key: k, Token: "holder-1"}
			if err := s.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			if !withSteps {
				f.want("released marker", k, hrec{ver: 1, st: 'r', fence: 1, att: 1, fp: hLongFP, tok: "holder-1"})
				if _, err := s.Get(ctx, k); !errors.Is(err, guard.ErrNotFound) {
					t.Errorf("Get of a released first attempt = %v", err)
				}
				out, err := s.Claim(ctx, f.req(k, "next", "any payload"))
				if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 2 || out.Lease.Attempt != 1 { // the released holder's fence + 1
					t.Fatalf("claim after release = %+v, %v", out, err)
				}
				if err := s.Release(ctx, l); err != nil {
					t.Errorf("the release sent again = %v, want OK (ptok)", err)
				}
				continue
			}
			fr := r
			fr.st = 'f'
			f.want("released with steps", k, fr)
		}
	})

	t.Run("OperatorRelease", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		r := hbase('p', "operator")
		r.ver, r.steps = 2, steps
		k := f.put(r, 100*time.Second+time.Minute)
		err := s.FailHolder(ctx, guard.Lease{Key: k, Token: "holder-1"}, "freed", time.Hour, false)
		var alive *guard.InProgressError
		if !errors.As(err, &alive) {
			t.Fatalf("FailHolder of a live lease = %v, want in progress", err)
		}
		f.want("left alone", k, r)
		if err := s.FailHolder(ctx, guard.Lease{Key: k, Token: "holder-1"}, "freed", time.Hour, true); err != nil {
			t.Fatal(err)
		}
		fr := r
		fr.st, fr.lastErr = 'f', "freed"
		f.want("freed", k, fr)
	})

	t.Run("Batches", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		failed := hbase('F', "batch-failed")
		failed.ver, failed.steps = 2, steps
		done := hbase('c', "batch-done")
		done.result = "stored"
		alive := hbase('p', "batch-alive")
		mine := hbase('P', "batch-mine")
		mine.tok = hPacked2
		kf, kd := f.put(failed, time.Hour), f.put(done, time.Hour)
		ka, km := f.put(alive, 100*time.Second+time.Minute), f.put(mine, 100*time.Second+time.Minute)
		outs, errs := s.ClaimBatch(ctx, []guard.ClaimRequest{
			f.req(kf, "batch-holder", hLongFP), f.req(kd, "batch-holder", hLongFP),
			f.req(ka, "batch-holder", hLongFP), f.req(km, hPacked2, hLongFP), f.req(kd, "x", "other"),
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		if o := outs[0]; o.Status != guard.Acquired || o.Lease.Fence != 301 || o.Lease.Attempt != 201 || len(o.Steps) != 2 {
			t.Errorf("failed record: %+v", o)
		}
		if o := outs[1]; o.Status != guard.Replay || string(o.Result) != "stored" {
			t.Errorf("completed record: %+v", o)
		}
		if o := outs[2]; o.Status != guard.InProgress {
			t.Errorf("another's live record: %+v", o)
		}
		if o := outs[3]; o.Status != guard.Acquired || o.Lease.Fence != 300 || !o.Lease.Recovered {
			t.Errorf("its own record: %+v", o)
		}
		if o := outs[4]; o.Status != guard.Mismatch {
			t.Errorf("another payload: %+v", o)
		}
		werrs := s.WriteBatch(ctx, []guard.Write{
			{Kind: guard.WriteComplete, Lease: outs[0].Lease, Result: []byte("r0"), TTL: time.Hour},
			{Kind: guard.WriteComplete, Lease: outs[3].Lease, Result: []byte("r3"), TTL: time.Hour},
		})
		for i, err := range werrs {
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}
		c0 := failed
		c0.ver, c0.st, c0.steps, c0.result = 1, 'c', nil, "r0"
		c0.fence, c0.att, c0.tok, c0.ptok = 301, 201, "batch-holder", "holder-1"
		f.want("failed, taken over and completed in a batch", kf, c0)
		c3 := mine
		c3.st, c3.result = 'C', "r3"
		f.want("own record completed in a batch", km, c3)
		f.want("another's live record", ka, alive)
	})

	t.Run("ScanAndGetByName", func(t *testing.T) {
		f := hfix{t: t, s: s, ctx: ctx}
		s := guardenv.Store(t, guard.RedisOptions{Prefix: "compat-scan-" + strings.ToLower(t.Name()[len(t.Name())-4:]) + ":"})
		f.s = s
		r1 := hbase('C', "scan-c")
		r1.result = strings.Repeat("R", 300)
		r2 := hbase('F', "scan-f")
		r2.ver, r2.steps = 2, steps
		k1, k2 := f.put(r1, time.Hour), f.put(r2, time.Hour)
		seen := map[string]guard.Record{}
		if err := s.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			seen[name] = rec
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if rec := seen[s.Name(k1)]; rec.State != guard.StateCompleted || !rec.Recovered || len(rec.Result) != 300 || rec.Key != (guard.Key{}) {
			t.Errorf("scanned completed record = %+v", rec)
		}
		if rec := seen[s.Name(k2)]; rec.State != guard.StateFailed || !rec.Recovered || rec.Key != k2 || len(rec.Steps) != 2 {
			t.Errorf("scanned failed record = %+v", rec)
		}
		if rec, err := s.GetByName(ctx, s.Name(k2)); err != nil || rec.Key != k2 || rec.LastError != hErr {
			t.Errorf("GetByName = %+v, %v", rec, err)
		}
	})
	_ = f
}
