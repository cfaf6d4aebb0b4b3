package guard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// realGuard returns a Guard on the shared real Redis, under a prefix of
// the test's own.
func realGuard(t *testing.T, opts guard.Options) *guard.Guard {
	t.Helper()
	s := guardenv.Store(t, guard.RedisOptions{})
	return guard.New(s, opts)
}

func count(n *atomic.Int64, v string) guard.Func {
	return func(context.Context, guard.Lease) ([]byte, error) {
		n.Add(1)
		return []byte(v), nil
	}
}

func TestDoRunsOnceThenReplays(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "orders", ID: "k1"}
	var n atomic.Int64
	first, err := g.Do(bg, key, "fp", count(&n, "created"))
	if err != nil || first.Replayed || string(first.Value) != "created" || first.Lease.Fence != 1 {
		t.Fatalf("first Do = %+v, %v", first, err)
	}
	second, err := g.Do(bg, key, "fp", count(&n, "again"))
	if err != nil || !second.Replayed || string(second.Value) != "created" {
		t.Fatalf("second Do = %+v, %v", second, err)
	}
	if n.Load() != 1 {
		t.Fatalf("fn ran %d times", n.Load())
	}
	_, err = g.Do(bg, key, "other-fp", count(&n, "x"))
	if !errors.Is(err, guard.ErrMismatch) {
		t.Fatalf("Do with another fingerprint = %v, want ErrMismatch", err)
	}
}

func TestDoInProgress(t *testing.T) {
	g := realGuard(t, guard.Options{Lease: 5 * time.Second})
	key := guard.Key{Scope: "s", ID: "busy"}
	out, err := g.Claim(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Fatal("fn ran while another holder has the key")
		return nil, nil
	})
	var busy *guard.InProgressError
	if !errors.Is(err, guard.ErrInProgress) || !errors.As(err, &busy) {
		t.Fatalf("Do = %v, want *InProgressError", err)
	}
	if busy.RetryAfter <= 0 || busy.RetryAfter > 5*time.Second {
		t.Fatalf("RetryAfter = %s", busy.RetryAfter)
	}
	if err := g.Complete(bg, out.Lease, []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestDoInvalidKey(t *testing.T) {
	g := realGuard(t, guard.Options{})
	for _, k := range []guard.Key{{Scope: "s"}, {ID: "x"}, {Scope: "s", ID: strings.Repeat("x", 256)}, {Scope: "s", ID: "a\nb"}} {
		_, err := g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			t.Fatal("fn ran with an invalid key")
			return nil, nil
		})
		if !errors.Is(err, guard.ErrInvalidKey) {
			t.Fatalf("Do(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
}

func TestFailRetryExhausted(t *testing.T) {
	g := realGuard(t, guard.Options{MaxAttempts: 3})
	key := guard.Key{Scope: "s", ID: "flaky"}
	var n atomic.Int64
	boom := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		n.Add(1)
		return nil, fmt.Errorf("attempt %d failed", l.Attempt)
	}
	for i := 1; i <= 3; i++ {
		if _, err := g.Do(bg, key, "fp", boom); err == nil || err.Error() != fmt.Sprintf("attempt %d failed", i) {
			t.Fatalf("attempt %d: Do = %v, want fn's error", i, err)
		}
	}
	_, err := g.Do(bg, key, "fp", boom)
	var ex *guard.ExhaustedError
	if !errors.Is(err, guard.ErrExhausted) || !errors.As(err, &ex) || ex.Attempts != 3 || ex.LastError != "attempt 3 failed" {
		t.Fatalf("fourth Do = %v, want exhausted after 3 with the last error", err)
	}
	if n.Load() != 3 {
		t.Fatalf("fn ran %d times, want 3", n.Load())
	}

	// Fails twice then succeeds: processed once, on attempt 3.
	key = guard.Key{Scope: "s", ID: "recovers"}
	var last guard.Lease
	for i := 1; i <= 3; i++ {
		res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			last = l
			if l.Attempt < 3 {
				return nil, errors.New("not yet")
			}
			return []byte("ok"), nil
		})
		if (i < 3) != (err != nil) {
			t.Fatalf("attempt %d: %+v, %v", i, res, err)
		}
	}
	if last.Attempt != 3 || last.Fence != 3 {
		t.Fatalf("last lease = %+v, want attempt 3, fence 3", last)
	}
}

func TestPanicReleasesKey(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "panics"}
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want the original panic", r)
			}
		}()
		_, _ = g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { panic("kaboom") })
		t.Fatal("Do returned after fn panicked")
	}()
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("record after panic: %v, want released (ErrNotFound)", err)
	}
	var n atomic.Int64
	res, err := g.Do(bg, key, "fp", count(&n, "second try"))
	if err != nil || res.Replayed || n.Load() != 1 {
		t.Fatalf("retry after panic = %+v, %v; ran %d", res, err, n.Load())
	}
}

// An effect that calls runtime.Goexit (t.FailNow, say) ends Do's caller's
// goroutine as it would end any function's, and its claim is released, as
// after a panic: the key is free for a retry at once.
func TestGoexitReleasesKey(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "goexit"}
	ended := make(chan bool, 1)
	go func() {
		returned := false
		defer func() { ended <- returned }()
		_, _ = g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			runtime.Goexit()
			return nil, nil
		})
		returned = true
	}()
	if <-ended {
		t.Fatal("Do returned after the effect called runtime.Goexit")
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("record after Goexit: %v, want released (ErrNotFound)", err)
	}
}

func TestCompletionSurvivesCancelledCaller(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "hangup"}
	ctx, cancel := context.WithCancel(bg)
	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		cancel() // the client hangs up while the effect finishes
		return []byte("charged"), nil
	})
	if err != nil || string(res.Value) != "charged" {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "charged" {
		t.Fatalf("record = %+v, %v; want completed", rec, err)
	}
}

// TestHeartbeatKeepsLease: fn runs for several leases; nobody else gets the key.
func TestHeartbeatKeepsLease(t *testing.T) {
	t.Parallel()
	// Each heartbeat (one a third of a lease) and the second Do's claim
	// must be answered within a lease on a real server: 600ms was within
	// a stall of a loaded machine (a claim refused as late is not
	// ErrInProgress).
	const lease = 1500 * time.Millisecond
	g := realGuard(t, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "slow"}
	checked := make(chan error, 1)
	res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		go func() {
			time.Sleep(3 * lease) // let three leases pass; only heartbeats keep the key
			_, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				return nil, errors.New("second holder ran while the first was alive")
			})
			checked <- err
		}()
		select {
		case err := <-checked:
			if !errors.Is(err, guard.ErrInProgress) {
				return nil, fmt.Errorf("second Do during the run = %v, want ErrInProgress", err)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("lease lost while heartbeating: %w", context.Cause(ctx))
		}
		return []byte("slow done"), nil
	})
	if err != nil || string(res.Value) != "slow done" {
		t.Fatalf("Do = %+v, %v", res, err)
	}
}

// TestLeaseLostCancelsContext: another holder recovers the key while fn runs
// (its lease ran out on the server's clock); the heartbeat finds the lease
// gone and cancels fn's context with ErrLeaseLost, and the late completion
// is refused.
func TestLeaseLostCancelsContext(t *testing.T) {
	s, mr := miniStore(t)
	const lease = 400 * time.Millisecond
	g := guard.New(s, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "stolen"}
	res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		mr.FastForward(lease + time.Millisecond)
		other, err := g.Claim(bg, key, "fp")
		if err != nil || !other.Lease.Recovered || other.Lease.Fence != l.Fence+1 {
			return nil, fmt.Errorf("recovery = %+v, %v", other, err)
		}
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, guard.ErrLeaseLost) {
			return nil, fmt.Errorf("cause = %v, want ErrLeaseLost", cause)
		}
		return []byte("late"), nil
	})
	if !errors.Is(err, guard.ErrLeaseLost) || string(res.Value) != "late" {
		t.Fatalf("Do = %+v, %v; want the value with ErrLeaseLost", res, err)
	}
	rec, _ := g.Get(bg, key)
	if rec.State != guard.StatePending || rec.Fence != 2 {
		t.Fatalf("the late completion changed the record: %+v", rec)
	}
}

// TestStoreGoneCancelsContext: Redis disappears while fn runs; once the lease
// has run out, fn's context is cancelled with ErrLeaseLost and Do reports
// the store unavailable.
func TestStoreGoneCancelsContext(t *testing.T) {
	s, mr := miniStore(t)
	g := guard.New(s, guard.Options{Lease: 400 * time.Millisecond})
	res, err := g.Do(bg, guard.Key{Scope: "s", ID: "gone"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		mr.Close()
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, guard.ErrLeaseLost) {
			return nil, fmt.Errorf("cause = %v, want ErrLeaseLost", cause)
		}
		return []byte("v"), nil
	})
	if !errors.Is(err, guard.ErrUnavailable) || string(res.Value) != "v" {
		t.Fatalf("Do = %+v, %v; want the value with ErrUnavailable", res, err)
	}
}

func TestUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1})
	defer c.Close()
	g := guard.New(guard.NewRedisStore(c, guard.RedisOptions{}), guard.Options{})
	_, err := g.Do(bg, guard.Key{Scope: "s", ID: "x"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Fatal("fn ran without a claim")
		return nil, nil
	})
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Do on a dead Redis = %v, want ErrUnavailable", err)
	}
}

// TestLeaseRecoveryMiniredis: a holder that stops heartbeating loses the
// key after its lease; the next claim recovers it with fence+1; the old
// holder's complete gets ErrLeaseLost.
func TestLeaseRecoveryMiniredis(t *testing.T) {
	s, mr := miniStore(t)
	g := guard.New(s, guard.Options{Lease: 30 * time.Second})
	key := guard.Key{Scope: "s", ID: "crash"}
	old, err := g.Claim(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	mr.FastForward(29 * time.Second)
	if _, err := g.Claim(bg, key, "fp"); !errors.Is(err, guard.ErrInProgress) {
		t.Fatalf("claim before the lease ends = %v, want ErrInProgress", err)
	}
	mr.FastForward(2 * time.Second)
	var n atomic.Int64
	res, err := g.Do(bg, key, "fp", count(&n, "recovered"))
	if err != nil || res.Lease.Fence != old.Lease.Fence+1 || !res.Lease.Recovered || res.Lease.Attempt != 2 {
		t.Fatalf("recovery = %+v, %v", res, err)
	}
	if err := g.Complete(bg, old.Lease, []byte("stale")); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("old holder's complete = %v, want ErrLeaseLost", err)
	}
	if res, _ := g.Do(bg, key, "fp", count(&n, "x")); !res.Replayed || string(res.Value) != "recovered" {
		t.Fatalf("replay = %+v", res)
	}
}

func TestRetentionMiniredis(t *testing.T) {
	s, mr := miniStore(t)
	g := guard.New(s, guard.Options{TTL: time.Hour})
	key := guard.Key{Scope: "s", ID: "old"}
	var n atomic.Int64
	if _, err := g.Do(bg, key, "fp", count(&n, "v1")); err != nil {
		t.Fatal(err)
	}
	mr.FastForward(59 * time.Minute)
	if res, _ := g.Do(bg, key, "fp", count(&n, "v2")); !res.Replayed {
		t.Fatal("key forgotten before its TTL")
	}
	mr.FastForward(2 * time.Minute)
	res, err := g.Do(bg, key, "fp", count(&n, "v2"))
	if err != nil || res.Replayed || string(res.Value) != "v2" || n.Load() != 2 {
		t.Fatalf("after TTL = %+v, %v (ran %d)", res, err, n.Load())
	}
}

func TestRejectedReleases(t *testing.T) {
	g := realGuard(t, guard.Options{MaxAttempts: 1})
	key := guard.Key{Scope: "s", ID: "rejected"}
	_, err := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, fmt.Errorf("account locked: %w", guard.ErrRejected)
	})
	if !errors.Is(err, guard.ErrRejected) {
		t.Fatalf("Do = %v, want fn's rejection", err)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("record after rejection: %v, want released", err)
	}
	var n atomic.Int64
	if res, err := g.Do(bg, key, "fp", count(&n, "ok")); err != nil || res.Lease.Attempt != 1 {
		t.Fatalf("retry after rejection = %+v, %v; want the first attempt (MaxAttempts 1 not used up)", res, err)
	}
}
