package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/memstore"
)

// TestFailWithoutARecord: Fail is "pending → failed, for the owner
// only" (docs/design.md, the state machine); a Fail that finds no record
// of its holder to fail (the key is gone, or its holder released its
// first attempt) answers ErrLeaseLost and creates nothing, as the
// memstore does, and as Extend and Complete do there: answering nil would
// tell the holder its failure (and its attempt) was recorded when nothing
// was. No contract case asks it: storetest's Fail calls all find a
// record. (A mutation review: fail.lua answering OK for an absent key or
// a released marker passed every test.)
func TestFailWithoutARecord(t *testing.T) {
	onThreeStores(t, func(t *testing.T, s guard.Store) {
		gone := guard.Key{Scope: "mut", ID: "fail-gone"}
		if err := s.Fail(bg, guard.Lease{Key: gone, Token: "Z"}, "boom", time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("Fail of a key that has no record = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Get(bg, gone); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("Get after a Fail of an absent key = %v, want ErrNotFound", err)
		}

		released := guard.Key{Scope: "mut", ID: "fail-released"}
		out, err := s.Claim(bg, guard.ClaimRequest{Key: released, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim A = %+v, %v", out, err)
		}
		if err := s.Release(bg, out.Lease); err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(bg, out.Lease, "boom", time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("Fail by the holder of a released first attempt = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Get(bg, released); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("Get after that Fail = %v, want ErrNotFound (the release stands)", err)
		}
	})
}

// onThreeStores runs check on a memstore, on miniredis and on Redis: a
// rule every store keeps, held to the RedisStore's scripts on both
// servers and to the reference store.
func onThreeStores(t *testing.T, check func(t *testing.T, s guard.Store)) {
	for name, newStore := range map[string]func(t *testing.T) guard.Store{
		"memstore":  func(t *testing.T) guard.Store { return memstore.New(memstore.Options{}) },
		"miniredis": func(t *testing.T) guard.Store { s, _ := miniStore(t); return s },
		"redis": func(t *testing.T) guard.Store {
			return guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{})
		},
	} {
		t.Run(name, func(t *testing.T) { check(t, newStore(t)) })
	}
}
