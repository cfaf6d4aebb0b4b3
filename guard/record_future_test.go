package guard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestFutureRecordsUntouched: a record this build cannot read (a
// newer version's: version 3, or version 1/2 with a state letter or a
// field this build does not know, or one cut short) in the pending and
// failed shapes a newer process would leave is ErrCorrupt from every call
// a process of this build makes, single and batched, through the guard
// and the store (claims, the holder's writes, steps, the operator's
// release, Wait, Get, GetByName, ScanRecords), and its bytes and its
// expiry stay as they were: an older process never overwrites or reclaims
// a newer one's record.
func TestFutureRecordsUntouched(t *testing.T) {
	ctx := context.Background()
	s := guardenv.Store(t, guard.RedisOptions{})
	f := hfix{t: t, s: s, ctx: ctx}
	steps := [][2]string{{"reserve", "r-1"}}
	pending := func(id string) hrec {
		r := hbase('p', id)
		r.fp, r.tok = "fp", "holder-1"
		return r
	}
	cases := []struct {
		name string
		val  func(id string) []byte
	}{
		{"Version3Pending", func(id string) []byte { b := pending(id).bytes(); b[0] = 3; return b }},
		{"Version3PendingExpired", func(id string) []byte { b := pending(id).bytes(); b[0] = 3; return b }},
		{"Version0Failed", func(id string) []byte { r := pending(id); r.st = 'f'; b := r.bytes(); b[0] = 0; return b }},
		{"Version255Completed", func(id string) []byte { r := pending(id); r.st = 'c'; b := r.bytes(); b[0] = 255; return b }},
		{"UnknownStatePending", func(id string) []byte { b := pending(id).bytes(); b[1] = 'q'; return b }},
		{"UnknownStateV2", func(id string) []byte {
			r := pending(id)
			r.ver, r.steps = 2, steps
			b := r.bytes()
			b[1] = 'x'
			return b
		}},
		{"FieldAppendedPending", func(id string) []byte { return append(pending(id).bytes(), 0x01, 0x07) }},
		{"FieldAppendedFailedV2", func(id string) []byte {
			r := pending(id)
			r.st, r.ver, r.steps = 'f', 2, steps
			return append(r.bytes(), 0x00)
		}},
		{"TruncatedPending", func(id string) []byte { b := pending(id).bytes(); return b[:len(b)-3] }},
		{"TruncatedInLastError", func(id string) []byte { b := pending(id).bytes(); return b[:12] }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := f
			f.t = t
			k := f.key("future-" + c.name)
			val := c.val(k.ID)
			ttl := 100*time.Second + time.Minute
			if strings.HasSuffix(c.name, "Expired") {
				ttl = 90 * time.Second // a lease that ran out, read as version 1 would
			}
			name := s.Name(k)
			if err := s.Client().Set(ctx, name, val, ttl).Err(); err != nil {
				t.Fatal(err)
			}
			unchanged := func(what string) {
				t.Helper()
				got, err := s.Client().Get(ctx, name).Result()
				if err != nil || got != string(val) {
					t.Fatalf("after %s: record %q, %v; want it unchanged %q", what, got, err, val)
				}
				if d := s.Client().PTTL(ctx, name).Val(); d > ttl || d < ttl-time.Minute {
					t.Fatalf("after %s: PTTL %s; want the one written (%s)", what, d, ttl)
				}
			}
			corrupt := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, guard.ErrCorrupt) {
					t.Errorf("%s = %v, want ErrCorrupt", what, err)
				}
				unchanged(what)
			}
			l := guard.Lease{Key: k, Token: "holder-1"}
			for _, tok := range []string{"holder-1", "other"} {
				for _, fp := range []string{"fp", "another"} {
					r := f.req(k, tok, fp)
					r.MaxAttempts = 200
					out, err := s.Claim(ctx, r)
					if out.Status != 0 {
						t.Errorf("claim %s/%s answered %v", tok, fp, out.Status)
					}
					corrupt("claim "+tok+"/"+fp, err)
					outs, errs := s.ClaimBatch(ctx, []guard.ClaimRequest{r, f.req(f.key(k.ID+"-fresh-"+tok+fp), "z", "fp")})
					if outs[0].Status != 0 {
						t.Errorf("batch claim %s/%s answered %v", tok, fp, outs[0].Status)
					}
					corrupt("batch claim "+tok+"/"+fp, errs[0])
				}
			}
			corrupt("complete", s.Complete(ctx, l, []byte("x"), time.Hour))
			corrupt("fail", s.Fail(ctx, l, "x", time.Hour))
			corrupt("release", s.Release(ctx, l))
			corrupt("extend", s.Extend(ctx, l, time.Minute))
			corrupt("step", s.SaveStep(ctx, l, 0, guard.StepResult{Name: "reserve", Result: []byte("r-1")}))
			corrupt("step 1", s.SaveStep(ctx, l, 1, guard.StepResult{Name: "charge"}))
			corrupt("operator release", s.FailHolder(ctx, l, "freed", time.Hour, true))
			corrupt("operator release, stale", s.FailHolder(ctx, l, "freed", time.Hour, false))
			for _, kind := range []guard.WriteKind{guard.WriteComplete, guard.WriteFail, guard.WriteRelease, guard.WriteExtend} {
				errs := s.WriteBatch(ctx, []guard.Write{{Kind: kind, Lease: l, Result: []byte("x"), Reason: "x", TTL: time.Hour}})
				corrupt("batch "+kind.String(), errs[0])
			}
			_, err := s.Get(ctx, k)
			corrupt("get", err)
			_, err = s.GetByName(ctx, name)
			corrupt("get by name", err)
			g := guard.New(s, guard.Options{Lease: time.Minute, MaxAttempts: 200})
			_, err = g.Do(ctx, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				t.Error("Do ran its effect")
				return nil, nil
			})
			corrupt("Do", err)
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = g.Wait(wctx, k, "fp", guard.WaitOptions{Timeout: 2 * time.Second})
			cancel()
			corrupt("Wait", err)
			res := g.DoBatch(ctx, []guard.BatchItem{{Key: k, Fingerprint: "fp"}}, func(context.Context, int, guard.Lease) ([]byte, error) {
				t.Error("DoBatch ran its effect")
				return nil, nil
			}, guard.BatchOptions{})
			corrupt("DoBatch", res[0].Err)
			if _, err := g.Get(ctx, k); !errors.Is(err, guard.ErrCorrupt) {
				t.Errorf("Guard.Get = %v", err)
			}
			found := false
			if err := s.ScanRecords(ctx, func(n string, _ guard.Record, err error) bool {
				if n == name {
					found = true
					if !errors.Is(err, guard.ErrCorrupt) {
						t.Errorf("scan gives %v, want ErrCorrupt", err)
					}
				}
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Error("scan did not give the record")
			}
			unchanged("everything")
		})
	}
}
