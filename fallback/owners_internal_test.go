package fallback

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestOwnersHoldNeverShortens: the Store remembers a secondary lease for
// twice its length, and a write that does not know the length (SaveStep
// holds with 0) does not cut that down to ownerGrace. It did: a holder of
// a 5-minute lease that recorded a step was forgotten a minute later, at
// the next sweep of the map, and its Release between two heartbeats
// (Lease/3 apart) went to the primary, which answered nil for an absent
// key, while the secondary kept the key pending for the rest of the
// lease. (A run of that whole story waits out ownerGrace, a minute.)
func TestOwnersHoldNeverShortens(t *testing.T) {
	var o owners
	k := guard.Key{Scope: "s", ID: "k"}
	o.hold(k, "T", 5*time.Minute) // the claim in the secondary
	o.hold(k, "T", 0)             // a step
	if left := time.Until(o.m[ownerKey{k, "T"}]); left < 9*time.Minute {
		t.Errorf("remembered for %v after a step, want the claim's 10 minutes", left.Round(time.Second))
	}
	o.hold(k, "T", 10*time.Minute) // an extension for longer
	if left := time.Until(o.m[ownerKey{k, "T"}]); left < 19*time.Minute {
		t.Errorf("remembered for %v after a longer extension, want 20 minutes", left.Round(time.Second))
	}
}
