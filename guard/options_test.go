package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// leaseSeen passes every call to a real store and records the lease each
// claim asked for.
type leaseSeen struct {
	guard.Store
	lease atomic.Int64
}

func (s *leaseSeen) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.lease.Store(int64(req.Lease))
	return s.Store.Claim(ctx, req)
}

// A positive Options.Lease below MinLease is read as MinLease: the guard
// reports it, the store is asked for it, and the claim's deadline is
// reckoned from it. (A lease of nanoseconds left no time for any answer:
// every claim came back "answered after the lease's deadline".) Zero and
// negative take DefaultLease; MinLease and above are kept.
func TestLeaseBelowMinLease(t *testing.T) {
	if m := guard.MinLease - guard.LeaseMargin(guard.MinLease); m <= 0 || guard.LeaseMargin(guard.MinLease) < 2*time.Millisecond {
		t.Fatalf("MinLease %s: validity %s, margin %s; want a positive validity and the full drift margin",
			guard.MinLease, m, guard.LeaseMargin(guard.MinLease))
	}
	for _, c := range []struct{ lease, want time.Duration }{
		{1, guard.MinLease},
		{30 * time.Nanosecond, guard.MinLease},
		{time.Millisecond, guard.MinLease},
		{guard.MinLease - 1, guard.MinLease},
		{guard.MinLease, guard.MinLease},
		{guard.MinLease + 1, guard.MinLease + 1},
		{0, guard.DefaultLease},
		{-time.Second, guard.DefaultLease},
	} {
		s := &leaseSeen{Store: realStore(t)}
		g := guard.New(s, guard.Options{Lease: c.lease})
		if got := g.Options().Lease; got != c.want {
			t.Errorf("Options{Lease: %s}: the guard reads %s, want %s", c.lease, got, c.want)
			continue
		}
		key := guard.Key{Scope: "s", ID: fmt.Sprintf("min-lease-%d", c.lease)}
		sent := time.Now()
		out, err := g.Claim(bg, key, "fp")
		if got := time.Duration(s.lease.Load()); got != c.want {
			t.Errorf("Options{Lease: %s}: the store was asked for a lease of %s, want %s", c.lease, got, c.want)
		}
		switch {
		case err == nil:
			validity := c.want - guard.LeaseMargin(c.want)
			if d := out.Lease.Deadline; d.Before(sent.Add(validity)) {
				t.Errorf("Options{Lease: %s}: deadline %s after sending, want at least %s",
					c.lease, d.Sub(sent), validity)
			}
			if err := g.Release(bg, out.Lease); err != nil {
				t.Fatal(err)
			}
		case errors.Is(err, guard.ErrUnavailable):
			// A loaded machine answered a 10ms lease's claim late: the
			// error must say which option is too short.
			if want := fmt.Sprintf("Options.Lease %s", c.want); !strings.Contains(err.Error(), want) {
				t.Errorf("Options{Lease: %s}: claim answered late = %v; want it to name %q", c.lease, err, want)
			}
		default:
			t.Fatalf("Options{Lease: %s}: claim = %v", c.lease, err)
		}
	}
}

// panicOf runs f and returns what it panicked with (nil if it returned).
func panicOf(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// A nil effect is a programmer's error, reported at once with a message
// naming the call: no claim reaches the store, so the key is not taken
// (not even for a lease) and no record is made.
func TestNilFuncPanicsBeforeClaim(t *testing.T) {
	var claims atomic.Int32
	s := realStore(t)
	h := &hooked{Store: s, beforeClaim: func() { claims.Add(1) }}
	g := guard.New(h, guard.Options{})
	key := guard.Key{Scope: "s", ID: "nil-func"}
	for _, c := range []struct {
		want string
		call func()
	}{
		{"guard.Do: nil Func", func() { _, _ = g.Do(bg, key, "fp", nil) }},
		{"guard.DoWith: nil Func", func() { _, _ = g.DoWith(bg, key, "fp", nil, guard.CallOptions{}) }},
		{"guard.DoBatch: nil BatchFunc", func() {
			g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, nil, guard.BatchOptions{})
		}},
	} {
		if got := panicOf(c.call); got != c.want {
			t.Errorf("panic = %v, want %q", got, c.want)
		}
	}
	if n := claims.Load(); n != 0 {
		t.Errorf("%d claims reached the store", n)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("record after the panics: %v, want ErrNotFound (the key untouched)", err)
	}
	// The guard is still usable, and the key is free.
	if res, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }); err != nil || res.Lease.Attempt != 1 {
		t.Fatalf("Do after the panics = %+v, %v; want a first attempt", res, err)
	}

	// Step and ScanRecords: the same, before they read or write.
	if got := panicOf(func() { _, _ = guard.Step[[]byte](bg, guard.Lease{Key: key}, "step", nil) }); got != "guard.Step: nil func" {
		t.Errorf("Step(nil) panic = %v", got)
	}
	if got := panicOf(func() { _ = s.ScanRecords(bg, nil) }); got != "guard.RedisStore.ScanRecords: nil func" {
		t.Errorf("ScanRecords(nil) panic = %v", got)
	}
}
