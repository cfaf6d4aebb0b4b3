package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

var errBoom = errors.New("boom")

func failing(context.Context, guard.Lease) ([]byte, error) { return nil, errBoom }

// A call's MaxAttempts is judged by that call's claim alone: on one Guard
// and one key, a caller with a limit of 2 is told ErrExhausted where a
// caller with the guard's limit (4) goes on, and a caller with no limit
// goes on past the guard's.
func TestCallOptionsMaxAttempts(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{MaxAttempts: 4})
	key := guard.Key{Scope: "calls", ID: "k"}
	two := guard.CallOptions{MaxAttempts: 2}
	for i := 1; i <= 2; i++ {
		res, err := g.DoWith(bg, key, "fp", failing, two)
		if !errors.Is(err, errBoom) || res.Lease.Attempt != i {
			t.Fatalf("attempt %d: %v (lease %+v)", i, err, res.Lease)
		}
	}
	_, err := g.DoWith(bg, key, "fp", failing, two)
	var ex *guard.ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 2 {
		t.Fatalf("third call with a limit of 2: %v, want *ExhaustedError after 2", err)
	}
	if _, err := g.ClaimWith(bg, key, "fp", two); !errors.As(err, &ex) {
		t.Fatalf("ClaimWith, limit 2: %v", err)
	}
	// The guard's limit, 4: two more attempts.
	for i := 3; i <= 4; i++ {
		if res, err := g.Do(bg, key, "fp", failing); !errors.Is(err, errBoom) || res.Lease.Attempt != i {
			t.Fatalf("Do, attempt %d: %v", i, err)
		}
	}
	if _, err := g.Do(bg, key, "fp", failing); !errors.As(err, &ex) || ex.Attempts != 4 {
		t.Fatalf("Do past the guard's limit: %v", err)
	}
	if _, err := g.Claim(bg, key, "fp"); !errors.Is(err, guard.ErrExhausted) {
		t.Fatalf("Claim past the guard's limit: %v", err)
	}
	// No limit for this call: it runs a fifth time, and succeeds.
	unlimited := guard.CallOptions{MaxAttempts: -1}
	res, err := g.DoWith(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }, unlimited)
	if err != nil || res.Lease.Attempt != 5 || string(res.Value) != "ok" {
		t.Fatalf("unlimited call: %v, %+v", err, res)
	}
}

// ClaimWith and DoBatch take the same per-call limit.
func TestCallOptionsClaimAndBatch(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{}) // no limit of its own
	one := guard.CallOptions{MaxAttempts: 1}
	k := guard.Key{Scope: "calls", ID: "claim"}
	out, err := g.ClaimWith(bg, k, "fp", one)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Fail(bg, out.Lease, errBoom); err != nil {
		t.Fatal(err)
	}
	if _, err := g.ClaimWith(bg, k, "fp", one); !errors.Is(err, guard.ErrExhausted) {
		t.Fatalf("second claim with a limit of 1: %v", err)
	}
	if out, err := g.Claim(bg, k, "fp"); err != nil || out.Lease.Attempt != 2 {
		t.Fatalf("Claim with the guard's (no) limit: %v, %+v", err, out)
	} else if err := g.Fail(bg, out.Lease, errBoom); err != nil {
		t.Fatal(err)
	}

	items := make([]guard.BatchItem, 3)
	for i := range items {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: "calls", ID: fmt.Sprint("batch-", i)}, Fingerprint: "fp"}
	}
	fail := func(context.Context, int, guard.Lease) ([]byte, error) { return nil, errBoom }
	for round := 1; round <= 2; round++ {
		for i, r := range g.DoBatch(bg, items, fail, guard.BatchOptions{CallOptions: guard.CallOptions{MaxAttempts: 2}}) {
			if !errors.Is(r.Err, errBoom) || r.Lease.Attempt != round {
				t.Fatalf("round %d, item %d: %v", round, i, r.Err)
			}
		}
	}
	for i, r := range g.DoBatch(bg, items, fail, guard.BatchOptions{CallOptions: guard.CallOptions{MaxAttempts: 2}}) {
		if !errors.Is(r.Err, guard.ErrExhausted) {
			t.Fatalf("round 3, item %d: %v, want ErrExhausted", i, r.Err)
		}
	}
	for i, r := range g.DoBatch(bg, items, fail, guard.BatchOptions{}) {
		if !errors.Is(r.Err, errBoom) || r.Lease.Attempt != 3 {
			t.Fatalf("the guard's limit, item %d: %v", i, r.Err)
		}
	}
	// A key claimed with the call's limit still fails with ErrExhausted
	// for the limit's callers: the writes (Fail) take no limit.
	if _, err := g.ClaimWith(bg, k, "fp", guard.CallOptions{MaxAttempts: 2}); !errors.Is(err, guard.ErrExhausted) {
		t.Fatalf("limit 2 after 2 attempts: %v", err)
	}
}
