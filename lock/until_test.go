package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/lock"
)

// TestUntilPastAfterRelease: once Release succeeded, or Extend found the
// lock lost, Until is past, so a holder that gates writes on
// time.Now().Before(lk.Until()) writes nothing more. (It reported the
// validity of the last extension: the holder kept writing after it gave
// the lock away, another holder having it by then.)
func TestUntilPastAfterRelease(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	lk, err := l.TryObtain(bg, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(bg); err != nil {
		t.Fatal(err)
	}
	other, err := l.TryObtain(bg, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(bg)
	if err := lk.Extend(bg); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Extend after Release: %v, want ErrLost", err)
	}
	if u := lk.Until(); time.Now().Before(u) {
		t.Fatalf("after Release (and another holder took the lock) Until is still %s in the future", time.Until(u).Round(time.Millisecond))
	}
}
