package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// redsync's scripts, by the SHA1 redsync sends them as.
const (
	touchSHA  = "d75bb8b5bd13532ddedd17762e772346e39b321e"
	deleteSHA = "e950836ed1e694540c503ef9972b8de518044d3b"
)

func isScript(cmd redis.Cmder, sha, marker string) bool {
	args := cmd.Args()
	switch cmd.Name() {
	case "evalsha":
		return len(args) > 1 && args[1] == sha
	case "eval":
		src, _ := args[1].(string)
		return strings.Contains(src, marker)
	}
	return false
}

// nodeFault is a go-redis hook standing for one node's network: with
// hangTouch, an extension (redsync's touch script) gets no answer before
// its round's deadline (a node paused or blackholed: a minority fault
// Redlock is meant to survive), and touched is told when one is sent;
// with delete, a release (the delete script) answers after latency, as
// from a node some milliseconds away.
type nodeFault struct {
	hangTouch atomic.Bool
	touched   chan struct{}
	latency   time.Duration
}

func (*nodeFault) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*nodeFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *nodeFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.hangTouch.Load() && isScript(cmd, touchSHA, "PEXPIRE") {
			select {
			case h.touched <- struct{}{}:
			default:
			}
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		if h.latency > 0 && isScript(cmd, deleteSHA, `redis.call("DEL"`) {
			t := time.NewTimer(h.latency)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// TestReleaseRacingExtendWithMinorityNodeHung: Lock's methods are
// documented safe for concurrent use, and each round is bounded by
// Expiry*TimeoutFactor. But Extend and Release start that bound before
// they wait for the lock's mutex, so a Release called while an extension
// round is under way spends its own budget waiting for that round. With
// one node of three not answering (a minority: the round then lasts its
// whole bound), a Release made during a keepalive's Extend is left with
// almost no time and fails with ErrUnavailable though two healthy nodes
// answer within 50ms (a tenth of the bound): the lock stays held on
// them, and every other process is kept out for up to Expiry after the
// holder gave it back.
func TestReleaseRacingExtendWithMinorityNodeHung(t *testing.T) {
	nodes := redlockNodes(t)
	healthy := &nodeFault{latency: 50 * time.Millisecond}
	hung := &nodeFault{touched: make(chan struct{}, 1), latency: 50 * time.Millisecond}
	nodes[0].AddHook(healthy)
	nodes[1].AddHook(healthy)
	nodes[2].AddHook(hung)
	opts := lock.Options{Expiry: 2 * time.Second, TimeoutFactor: 0.25} // each round bounded by 500ms
	l := newLocker(t, nodes, opts)
	other := newLocker(t, redlockNodes(t), lock.Options{Prefix: l.Options().Prefix})

	k, err := l.Obtain(bg, "released")
	if err != nil {
		t.Fatal(err)
	}
	hung.hangTouch.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- k.Extend(bg) }() // the holder's keepalive
	<-hung.touched                           // the extension round is under way
	start := time.Now()
	rerr := k.Release(bg)
	took := time.Since(start)
	eerr := <-extended
	t.Logf("Extend: %v; Release after %s: %v", eerr, took.Round(time.Millisecond), rerr)
	if eerr != nil {
		t.Fatalf("Extend with 2 of 3 nodes answering: %v", eerr)
	}
	if rerr != nil {
		if errors.Is(rerr, lock.ErrUnavailable) {
			held := 0
			for _, c := range nodes[:2] {
				if c.Exists(bg, k.Key()).Val() == 1 {
					held++
				}
			}
			_, oerr := other.TryObtain(bg, "released")
			t.Errorf("after the holder's Release: lock still on %d healthy nodes; another process's TryObtain: %v", held, oerr)
		}
		t.Fatalf("Release with 2 healthy nodes answering in 50ms (bound %s), made during an extension round: %v",
			time.Duration(float64(l.Options().Expiry)*l.Options().TimeoutFactor), rerr)
	}
}

// TestUntilDuringHungExtension: a holder checks Until before each write,
// as its doc advises. While an extension round waits out a node that does
// not answer (its whole bound), Until answers at once with the validity
// the lock had before the round (it waited for the round's mutex), and
// the zero time as soon as Release was called, before Release could run.
func TestUntilDuringHungExtension(t *testing.T) {
	nodes := redlockNodes(t)
	hung := &nodeFault{touched: make(chan struct{}, 1)}
	nodes[2].AddHook(hung)
	l := newLocker(t, nodes, lock.Options{Expiry: 2 * time.Second, TimeoutFactor: 0.25})
	k, err := l.Obtain(bg, "checked")
	if err != nil {
		t.Fatal(err)
	}
	before := k.Until()
	hung.hangTouch.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- k.Extend(bg) }()
	<-hung.touched // the round is under way, and lasts until its bound
	if got := k.Until(); !got.Equal(before) {
		t.Errorf("Until during the round = %v, want the validity before it, %v", got, before)
	}
	select {
	case err := <-extended:
		t.Fatalf("Until answered only once the round had ended (Extend: %v)", err)
	default:
	}
	released := make(chan error, 1)
	go func() { released <- k.Release(bg) }()
	testenv.WaitFor(t, 5*time.Second, "Until to be zero once Release was called", func() bool { return k.Until().IsZero() })
	select {
	case err := <-extended:
		t.Fatalf("Until was zero only once the round had ended (Extend: %v)", err)
	default:
	}
	if err := <-extended; err != nil {
		t.Errorf("Extend with 2 of 3 nodes answering: %v", err)
	}
	if err := <-released; err != nil {
		t.Errorf("Release: %v", err)
	}
	if !k.Until().IsZero() {
		t.Errorf("Until after Release = %v, want zero", k.Until())
	}
}
