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

// lostReleaseReply is a go-redis hook that, once armed, lets redsync's
// release script run on the node and then drops its reply, as a network
// that delivers the request but loses (or delays past the round's
// timeout) the answer: the key is deleted, the client hears a timeout.
type lostReleaseReply struct{ armed atomic.Bool }

func (*lostReleaseReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*lostReleaseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *lostReleaseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || !h.armed.Load() {
			return err
		}
		args := cmd.Args()
		isRelease := false
		switch cmd.Name() {
		case "evalsha":
			isRelease = len(args) > 1 && args[1] == "e950836ed1e694540c503ef9972b8de518044d3b"
		case "eval":
			src, _ := args[1].(string)
			isRelease = strings.Contains(src, `redis.call("DEL"`)
		}
		if isRelease {
			err = errors.New("i/o timeout: reply lost")
			cmd.SetErr(err)
		}
		return err
	}
}

// TestUntilPastAfterUnansweredRelease: Release sends its deletions, and
// they land on every node, but no answer comes back in time: Release
// says ErrUnavailable. Another holder then takes the lock (the keys are
// gone). Until must not still report the old validity: Until's doc says
// a holder that gates its writes on it "writes nothing more" once the
// lock was released, and this one was. It reported the last validity, so
// a writer gating on time.Now().Before(lk.Until()) kept writing while
// the other holder had the lock: two holders at once.
func TestUntilPastAfterUnansweredRelease(t *testing.T) {
	prefix := testenv.Prefix(t)
	hook := &lostReleaseReply{}
	nodesA := redlockNodes(t)
	for _, c := range nodesA {
		c.AddHook(hook)
	}
	opts := lock.Options{Prefix: prefix, Expiry: 10 * time.Second}
	a := newLocker(t, nodesA, opts)
	b := newLocker(t, redlockNodes(t), opts)

	ka, err := a.TryObtain(bg, "r")
	if err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(true)
	rerr := ka.Release(bg)
	hook.armed.Store(false)
	t.Logf("A's Release: %v", rerr)
	if rerr == nil {
		t.Fatal("the hook did not drop the release's answers")
	}

	kb, err := b.TryObtain(bg, "r")
	if err != nil {
		t.Fatalf("B's TryObtain after A's deletions landed: %v", err)
	}
	defer func() { _ = kb.Release(bg) }()

	now := time.Now()
	if now.Before(ka.Until()) && now.Before(kb.Until()) {
		t.Fatalf("B holds the lock (Until in %s), and A, whose Release was sent, still reports Until %s in the future: "+
			"two holders gating writes on Until both write",
			time.Until(kb.Until()).Round(time.Millisecond), time.Until(ka.Until()).Round(time.Millisecond))
	}
}
