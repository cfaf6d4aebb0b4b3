package guard_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// claimAnswered is a real store whose claim is answered even though the
// caller gave up while it was on the way (the reply was already read, or
// a client that does not abort a call in flight): onClaim runs with the
// claim's context before the claim, which then reaches the store
// whatever that context says.
type claimAnswered struct {
	guard.Store
	onClaim func(ctx context.Context)
}

func (s claimAnswered) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.onClaim(ctx)
	return s.Store.Claim(context.WithoutCancel(ctx), req)
}

// A claim's context whose Done channel has closed keeps reporting why
// (context.Context: "If Done is closed, Err returns a non-nil error"),
// also once the claim's answer has come and the effect runs: the context
// package's children of it read Err when they are cancelled, which may
// be after the claim returned.
func TestClaimContextErrAfterDone(t *testing.T) {
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var (
		cctx context.Context
		done <-chan struct{}
	)
	g := guard.New(claimAnswered{realStore(t), func(c context.Context) {
		cctx, done = c, c.Done()
		cancel() // the caller gives up while its claim is on the way
		<-done
	}}, guard.Options{})
	_, _ = g.Do(ctx, guard.Key{Scope: "s", ID: "claim-ctx-err"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		select {
		case <-done:
		default:
			t.Fatal("the claim's Done channel reopened")
		}
		if err := cctx.Err(); err == nil {
			t.Error("the claim's context: Done is closed, but Err is nil once the effect runs")
		}
		return nil, nil
	})
}

// A context derived from the claim's context (a store's own timeout, a
// database/sql query's watch) that is cancelled through it after the
// claim returned must not crash the process. Here the derived context is
// still live when the caller hangs up during the effect; the same crash
// comes when the caller hangs up during the claim and the context
// package's goroutine that cancels the derived context runs only after
// the claim's answer came. The panic ("context: internal error: missing
// cancel error") is in a goroutine of the context package, so the test
// runs the scenario in a child process.
func TestClaimContextChildCancelledLater(t *testing.T) {
	if os.Getenv("IDEMGUARD_TEST_CHILD") == "1" {
		claimContextChildCancelledLater(t)
		return
	}
	realStore(t) // skips here, not in the child, without services
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimContextChildCancelledLater$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMGUARD_TEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "panic") {
		t.Fatalf("the scenario crashed (%v):\n%s", err, out)
	}
}

func claimContextChildCancelledLater(t *testing.T) {
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var derived context.Context
	g := guard.New(claimAnswered{realStore(t), func(c context.Context) {
		var dcancel context.CancelFunc
		derived, dcancel = context.WithCancel(c)
		t.Cleanup(dcancel)
	}}, guard.Options{})
	_, err := g.Do(ctx, guard.Key{Scope: "s", ID: "claim-ctx-child"}, "fp", func(ectx context.Context, _ guard.Lease) ([]byte, error) {
		cancel() // the caller hangs up during the effect
		<-ectx.Done()
		return nil, context.Cause(ectx)
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do = %v, want context.Canceled", err)
	}
	<-derived.Done() // by Do's return at the latest
	if derived.Err() == nil {
		t.Error("a context derived from the claim's ended without an error")
	}
}

// A claim that gets no answer ends at the lease's first deadline also
// when the caller's context can be cancelled (the claim's context is then
// the effect's): its context reports context.DeadlineExceeded, and Do
// gives ErrUnavailable, not the caller's context.Canceled, which the
// caller did not ask for.
func TestClaimContextBoundWithCancellableCaller(t *testing.T) {
	const lease = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var claimErr error
	g := guard.New(storeFunc{realStore(t), func(c context.Context) {
		<-c.Done() // no answer
		claimErr = c.Err()
	}}, guard.Options{Lease: lease})
	start := time.Now()
	_, err := g.Do(ctx, guard.Key{Scope: "s", ID: "claim-bound"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("the effect ran on a claim answered after its deadline")
		return nil, nil
	})
	if took := time.Since(start); took < lease-guard.LeaseMargin(lease) {
		t.Errorf("the claim's context ended after %s, before the lease's first deadline", took)
	}
	if !errors.Is(claimErr, context.DeadlineExceeded) {
		t.Errorf("the claim's context ended with %v, want context.DeadlineExceeded", claimErr)
	}
	if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, context.Canceled) {
		t.Errorf("Do = %v, want ErrUnavailable and not context.Canceled", err)
	}
}

// A Do whose caller has gone (a consumer shutting down) sends no claim;
// one whose caller goes while the claim is on the way, answered all the
// same, does not run its effect, and the key is released: nobody waits
// for it.
func TestDoCallerGoneRunsNothing(t *testing.T) {
	ran := 0
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran++; return nil, nil }
	gone := errors.New("SIGTERM")
	store := realStore(t)

	ctx, cancel := context.WithCancelCause(bg)
	cancel(gone)
	sent := 0
	g := guard.New(claimAnswered{store, func(context.Context) { sent++ }}, guard.Options{})
	key := guard.Key{Scope: "gone", ID: t.Name() + "-before"}
	if _, err := g.Do(ctx, key, "fp", fn); !errors.Is(err, gone) || sent != 0 {
		t.Fatalf("Do after the caller went = %v, %d claims sent; want the cause, none", err, sent)
	}

	ctx, cancel = context.WithCancelCause(bg)
	defer cancel(nil)
	g = guard.New(claimAnswered{store, func(context.Context) { cancel(gone) }}, guard.Options{})
	key = guard.Key{Scope: "gone", ID: t.Name() + "-during"}
	if _, err := g.Do(ctx, key, "fp", fn); !errors.Is(err, gone) {
		t.Fatalf("Do whose caller went during the claim = %v; want the cause", err)
	}
	if _, err := store.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the key after the caller went: %v; want it released", err)
	}
	if ran != 0 {
		t.Fatalf("the effect ran %d times for a caller that had gone", ran)
	}
}
