package memstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// TestZeroValue: a Store declared without New (a struct field, var s
// memstore.Store) is an empty store on the real clock, as New(Options{})
// makes, for every call; it panicked on its nil map and clock.
func TestZeroValue(t *testing.T) {
	var s memstore.Store
	key := guard.Key{Scope: "s", ID: "zero"}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get of a zero Store = %v, want ErrNotFound", err)
	}
	if st := s.Stats(); st != (memstore.Stats{}) {
		t.Fatalf("Stats of a zero Store = %+v", st)
	}
	if err := s.Release(ctx, lease(key, "A")); err != nil {
		t.Fatalf("Release on a zero Store = %v", err)
	}
	out := mustClaim(t, &s, req(key, "A"), guard.Acquired)
	if err := s.SaveStep(ctx, out.Lease, 0, guard.StepResult{Name: "s1", Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, out.Lease, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, out.Lease, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, &s, req(key, "B"), guard.Replay); string(got.Result) != "done" {
		t.Fatalf("replay = %q", got.Result)
	}
	if rec, err := s.Get(ctx, key); err != nil || rec.TTL <= 50*time.Minute || rec.TTL > time.Hour {
		t.Fatalf("Get = %+v, %v; want the completed record kept just under an hour", rec, err)
	}
	checkInvariants(t, &s)

	other := new(memstore.Store)
	if err := other.Fail(ctx, lease(key, "A"), "x", time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("Fail on another zero Store = %v, want ErrLeaseLost (it sees nothing of the first)", err)
	}
}
