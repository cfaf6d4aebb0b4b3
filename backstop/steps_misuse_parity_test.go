package backstop_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// stepStores are the step stores these tests compare: the Redis store, the
// PostgreSQL Store, and backstop.Wrap over a Redis store (real services).
func stepStores(t *testing.T) map[string]guard.StepStore {
	t.Helper()
	db := pgenv.Migrated(t, pgstore.Options{})
	return map[string]guard.StepStore{
		"redis":   guardenv.Store(t, guard.RedisOptions{}),
		"pgstore": pgenv.Store(t, db, pgstore.Options{}),
		"wrap":    backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), mustBackstop(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})).(guard.StepStore),
	}
}

// answer classifies a store's answer, so stores can be compared.
func answer(err error) string {
	var oe *guard.StepOrderError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &oe):
		return fmt.Sprintf("order(%d,%q,%d)", oe.Index, oe.Recorded, oe.Steps)
	case errors.Is(err, guard.ErrLeaseLost):
		return "lost"
	case errors.Is(err, guard.ErrNotFound):
		return "absent"
	}
	return "error: " + err.Error()
}

func describe(rec guard.Record, err error) string {
	if err != nil {
		return answer(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s attempt %d", rec.State, rec.Attempt)
	for _, s := range rec.Steps {
		fmt.Fprintf(&b, " %s=%q", s.Name, s.Result)
	}
	return b.String()
}

// TestStepsMisuseParity: the writes a holder may make in the wrong
// order (Complete twice, Complete after Release, Release after Complete,
// a step after the claim ended, a late step after the lease ran out with
// nobody taking over, the steps of a holder whose key was exhausted
// under it) answer the same on every store, and leave the same record.
func TestStepsMisuseParity(t *testing.T) {
	const lease = 400 * time.Millisecond
	stores := stepStores(t)
	st := func(name, v string) guard.StepResult { return guard.StepResult{Name: name, Result: []byte(v)} }
	type script func(s guard.StepStore, key guard.Key) []string
	req := func(key guard.Key, tok string, max int) guard.ClaimRequest {
		return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: lease, TTL: time.Hour, MaxAttempts: max}
	}
	claim := func(s guard.StepStore, r guard.ClaimRequest) (guard.Lease, string) {
		out, err := s.Claim(ctx, r)
		if err != nil {
			return guard.Lease{}, answer(err)
		}
		return out.Lease, fmt.Sprintf("status %d attempt %d steps %d", out.Status, out.Lease.Attempt, len(out.Steps))
	}
	waitOut := func() { time.Sleep(lease + 100*time.Millisecond) } // the server's lease runs out: no goroutine to wait for
	scripts := map[string]script{
		"complete twice, then release, fail, step": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 0))
			return []string{c,
				answer(s.SaveStep(ctx, a, 0, st("a", "1"))),
				answer(s.Complete(ctx, a, []byte("r1"), time.Hour)),
				answer(s.Complete(ctx, a, []byte("r2"), time.Hour)),
				answer(s.Release(ctx, a)),
				answer(s.Fail(ctx, a, "x", time.Hour)),
				answer(s.SaveStep(ctx, a, 1, st("b", "2"))),
				describe(s.Get(ctx, key)),
			}
		},
		"release first attempt, then complete, step, fail": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 0))
			return []string{c,
				answer(s.Release(ctx, a)),
				answer(s.Complete(ctx, a, []byte("r"), time.Hour)),
				answer(s.SaveStep(ctx, a, 0, st("a", "1"))),
				answer(s.Fail(ctx, a, "x", time.Hour)),
				answer(s.Release(ctx, a)),
				describe(s.Get(ctx, key)),
			}
		},
		"release with steps, then complete, step, fail": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 0))
			return []string{c,
				answer(s.SaveStep(ctx, a, 0, st("a", "1"))),
				answer(s.Release(ctx, a)),
				answer(s.Complete(ctx, a, []byte("r"), time.Hour)),
				answer(s.SaveStep(ctx, a, 1, st("b", "2"))),
				answer(s.SaveStep(ctx, a, 0, st("a", "1"))),
				answer(s.Fail(ctx, a, "x", time.Hour)),
				describe(s.Get(ctx, key)),
			}
		},
		"fail, then complete, step, release": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 0))
			return []string{c,
				answer(s.SaveStep(ctx, a, 0, st("a", "1"))),
				answer(s.Fail(ctx, a, "boom", time.Hour)),
				answer(s.Complete(ctx, a, []byte("r"), time.Hour)),
				answer(s.SaveStep(ctx, a, 1, st("b", "2"))),
				answer(s.Release(ctx, a)),
				describe(s.Get(ctx, key)),
			}
		},
		"late step after the lease ran out, nobody took over": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 0))
			r := []string{c, answer(s.SaveStep(ctx, a, 0, st("a", "1")))}
			waitOut()
			r = append(r, answer(s.SaveStep(ctx, a, 1, st("b", "2"))))
			b, c2 := claim(s, req(key, "B", 0))
			return append(r, c2,
				answer(s.SaveStep(ctx, a, 2, st("c", "A"))),
				answer(s.SaveStep(ctx, b, 2, st("c", "B"))),
				describe(s.Get(ctx, key)))
		},
		"exhausted under its holder": func(s guard.StepStore, key guard.Key) []string {
			a, c := claim(s, req(key, "A", 1))
			r := []string{c, answer(s.SaveStep(ctx, a, 0, st("a", "1")))}
			waitOut()
			_, c2 := claim(s, req(key, "B", 1))
			return append(r, c2,
				answer(s.SaveStep(ctx, a, 1, st("b", "2"))),
				answer(s.Complete(ctx, a, []byte("r"), time.Hour)),
				answer(s.Release(ctx, a)),
				describe(s.Get(ctx, key)))
		},
	}
	for name, sc := range scripts {
		t.Run(name, func(t *testing.T) {
			got := map[string][]string{}
			for sn, s := range stores {
				got[sn] = sc(s, guard.Key{Scope: "steps", ID: name + "/" + testenv.Prefix(t)})
				t.Logf("%-8s %q", sn, got[sn])
			}
			for sn := range stores {
				if fmt.Sprint(got[sn]) != fmt.Sprint(got["redis"]) {
					t.Errorf("%s answers %q, redis %q", sn, got[sn], got["redis"])
				}
			}
		})
	}
}
