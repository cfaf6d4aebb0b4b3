package lock_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// proxiedRedlock returns a proxy in front of each shared Redlock node and
// NewNodes clients of the proxies.
func proxiedRedlock(t *testing.T) ([]*testenv.ReplyDropper, []redis.UniversalClient) {
	t.Helper()
	addrs := testenv.List(t, testenv.EnvRedlock)
	proxies := make([]*testenv.ReplyDropper, len(addrs))
	paddrs := make([]string, len(addrs))
	for i, a := range addrs {
		proxies[i] = testenv.NewReplyDropper(t, a)
		paddrs[i] = proxies[i].Addr()
	}
	return proxies, closing(t, lock.NewNodes(paddrs...))
}

// isReleaseOf matches redsync's release script (EVALSHA of deleteScript)
// on key.
func isReleaseOf(key string) func([]byte) bool {
	return func(b []byte) bool {
		return bytes.Contains(b, []byte("e950836ed1e694540c503ef9972b8de518044d3b")) && bytes.Contains(b, []byte(key))
	}
}

// isAcquireOf matches the first command on key: an attempt's acquisition
// (a SET NX, or the script the Locker sends for it).
func isAcquireOf(key string) func([]byte) bool {
	return func(b []byte) bool { return bytes.Contains(b, []byte(key)) }
}

// TestReleaseSentTwiceNotLost: Do's fn returned nil and held the lock
// throughout; the release's deletions landed on the nodes but the
// connections dropped before the answers came back, so go-redis sent
// each again. The second run found the key gone (redsync's
// ErrLockAlreadyExpired), which was counted as expired: Do returned
// ErrLost ("fn's work may have overlapped another holder's") though
// nothing overlapped. Two of three nodes sufficed.
func TestReleaseSentTwiceNotLost(t *testing.T) {
	for _, drop := range []int{2, 3} {
		t.Run(map[int]string{2: "2 of 3 replies dropped", 3: "3 of 3 replies dropped"}[drop], func(t *testing.T) {
			prefix := testenv.Prefix(t)
			proxies, nodes := proxiedRedlock(t)
			l := newLocker(t, nodes, lock.Options{Prefix: prefix, Expiry: 10 * time.Second})
			// Warm up: the release script is then cached on every node
			// (EVALSHA answers at once, no NOSCRIPT / EVAL fallback).
			if err := l.Do(bg, "warm", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			key := prefix + "pay"
			err := l.Do(bg, "pay", func(ctx context.Context) error {
				for _, p := range proxies[:drop] {
					p.Arm(isReleaseOf(key))
				}
				return nil
			})
			var dropped int
			for _, p := range proxies {
				dropped += p.Dropped()
			}
			if dropped != drop {
				t.Fatalf("the proxies dropped %d release replies, want %d (Do: %v)", dropped, drop, err)
			}
			for i, c := range nodes {
				if n, _ := c.Exists(bg, key).Result(); n != 0 {
					t.Fatalf("node %d still holds the key after Do", i)
				}
			}
			if err != nil {
				t.Fatalf("Do whose fn returned nil with the lock held throughout (only the release's replies were lost, "+
					"go-redis re-sent the deletions) = %v (ErrLost: %v), want nil", err, errors.Is(err, lock.ErrLost))
			}
		})
	}
}

// TestSingletonRunsWhenItsAcquisitionIsSentTwice: a Singleton call whose
// acquisitions landed on every node but whose answers were lost to
// dropped connections: go-redis sent each again, and a SET NX sent again
// found the caller's own value and answered "not set". redsync reported
// every node taken, Singleton took that for another instance running the
// job and skipped, and no instance ran it that round.
func TestSingletonRunsWhenItsAcquisitionIsSentTwice(t *testing.T) {
	prefix := testenv.Prefix(t)
	proxies, nodes := proxiedRedlock(t)
	l := newLocker(t, nodes, lock.Options{Prefix: prefix, RetryDelay: 20 * time.Millisecond})
	// Warm up: the scripts are then cached on every node (the armed
	// command is the acquisition itself, not a NOSCRIPT answer).
	if err := l.Do(bg, "warm", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	key := prefix + "payout"
	for _, p := range proxies {
		p.Arm(isAcquireOf(key))
	}
	var runs atomic.Int32
	err := lock.Singleton(l, "payout", func(context.Context) error { runs.Add(1); return nil })(bg)
	var dropped int
	for _, p := range proxies {
		dropped += p.Dropped()
	}
	if dropped != len(proxies) {
		t.Fatalf("the proxies dropped %d SET replies, want %d (Singleton: %v)", dropped, len(proxies), err)
	}
	for i, c := range nodes {
		if n, _ := c.Exists(bg, key).Result(); n != 0 {
			t.Fatalf("node %d holds the key: another holder?", i)
		}
	}
	if err != nil || runs.Load() != 1 {
		t.Fatalf("Singleton with no other instance (its own SETs' replies lost and re-sent) = %v, job ran %d times; "+
			"want the job run once", err, runs.Load())
	}
}

// isFenceRaiseOf matches the fence round's raise (EVALSHA of raiseScript)
// on the fence counter of key.
func isFenceRaiseOf(key string) func([]byte) bool {
	return func(b []byte) bool {
		return bytes.Contains(bytes.ToLower(b), []byte("evalsha")) && bytes.Contains(b, []byte(key+":fence"))
	}
}

// TestFenceRaiseSentTwiceNotTaken: with Options.Fencing, a fence raise
// sent twice (its answer lost, go-redis re-sending it) is the round's own:
// it found the counter at the round's number and answered "held", and
// TryObtain and TryDo said the lock was taken though nobody held it
// (found by review).
func TestFenceRaiseSentTwiceNotTaken(t *testing.T) {
	for _, name := range []string{"TryObtain", "TryDo"} {
		t.Run(name, func(t *testing.T) {
			prefix := testenv.Prefix(t)
			proxies, nodes := proxiedRedlock(t)
			l := newLocker(t, nodes, lock.Options{Prefix: prefix, Fencing: true, RetryDelay: 20 * time.Millisecond})
			// Warm up: the scripts are cached on every node, EVALSHA answers.
			if err := l.Do(bg, "warm", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			key := prefix + "payout"
			for _, p := range proxies {
				p.Arm(isFenceRaiseOf(key))
			}
			var err error
			var runs atomic.Int32
			if name == "TryObtain" {
				var k *lock.Lock
				k, err = l.TryObtain(bg, "payout")
				if err == nil {
					runs.Add(1)
					_ = k.Release(bg)
				}
			} else {
				err = l.TryDo(bg, "payout", func(context.Context) error { runs.Add(1); return nil })
			}
			var dropped int
			for _, p := range proxies {
				dropped += p.Dropped()
			}
			if dropped == 0 {
				t.Fatalf("no fence raise reply dropped (%v)", err)
			}
			if err != nil || runs.Load() != 1 {
				t.Fatalf("%s with no other holder (%d fence raise replies lost, go-redis re-sent the raises) = %v "+
					"(ErrNotObtained: %v), ran %d times; want the lock obtained once", name, dropped, err,
					errors.Is(err, lock.ErrNotObtained), runs.Load())
			}
		})
	}
}
