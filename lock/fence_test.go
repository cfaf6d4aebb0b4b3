package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// TestFenceGrows: with Fencing, every holder's fence is greater than the
// one before it, in the order the holders entered the section, across 3
// processes racing for the lock.
func TestFenceGrows(t *testing.T) {
	const procs, perProc, rounds = 3, 4, 4
	prefix := testenv.Prefix(t)
	var (
		sec    section
		fences []int64 // appended inside the section only
		wg     sync.WaitGroup
	)
	errs := make(chan error, procs*perProc)
	t.Cleanup(func() { // fence counters never expire: drop this test's
		for _, c := range redlockNodes(t) {
			_ = c.Del(bg, prefix+"acct:fence").Err()
		}
	})
	for range procs {
		l := newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix, Fencing: true, RetryDelay: 10 * time.Millisecond})
		for range perProc {
			wg.Go(func() {
				for range rounds {
					err := l.Do(bg, "acct", func(ctx context.Context) error {
						sec.enter()
						defer sec.exit()
						fences = append(fences, lock.FromContext(ctx).Fence())
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sec.check(t)
	if len(fences) != procs*perProc*rounds {
		t.Fatalf("%d fences", len(fences))
	}
	for i, f := range fences {
		if f != int64(i+1) {
			t.Fatalf("fence #%d is %d, want %d (all: %v)", i, f, i+1, fences)
		}
	}
}

// TestFenceSurvivesNodeLoss: the fence keeps growing while one node at a
// time is down, and after a node comes back empty: any two quorums share
// a node that remembers the highest fence.
func TestFenceSurvivesNodeLoss(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Fencing: true, RetryDelay: 10 * time.Millisecond})
	var last int64
	take := func(step string) {
		t.Helper()
		k, err := l.Obtain(bg, "f")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if k.Fence() <= last {
			t.Fatalf("%s: fence %d after %d", step, k.Fence(), last)
		}
		last = k.Fence()
		if err := k.Release(bg); err != nil {
			t.Fatalf("%s: release: %v", step, err)
		}
	}
	take("all up")
	take("all up again")
	servers[0].Kill()
	take("node 0 down")
	take("node 0 down again")
	servers[0].Restart() // empty: its counter is gone
	servers[1].Kill()    // the quorum is now node 0 (empty) and node 2
	take("node 0 empty, node 1 down")
	servers[1].Restart()
	servers[2].Kill() // nodes 0 and 1 restarted empty, but node 0 holds the last fence
	take("nodes 0, 1 restarted, node 2 down")
	if last != 6 {
		t.Fatalf("last fence %d, want 6 (one per acquisition)", last)
	}
}

func TestFenceOff(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	if lock.FromContext(bg) != nil {
		t.Fatal("FromContext of a bare context is not nil")
	}
	err := l.Do(bg, "plain", func(ctx context.Context) error {
		k := lock.FromContext(ctx)
		if k == nil || k.Name() != "plain" || k.Fence() != 0 || !k.Until().After(time.Now()) {
			t.Errorf("FromContext in Do = %+v", k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// failFenceReads is a go-redis hook that fails the next n GETs of a fence
// counter on its client, as a node that times out once would.
type failFenceReads struct{ n atomic.Int32 }

func (h *failFenceReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failFenceReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *failFenceReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() == "get" && len(args) == 2 && strings.HasSuffix(args[1].(string), ":fence") && h.n.Add(-1) >= 0 {
			err := errors.New("injected: fence read timed out")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestFenceRoundRetried: a fence round that reaches too few nodes is an
// attempt that found no quorum, as an acquisition that does: Obtain
// releases the lock and tries again (up to Options.UnavailableTries in a
// row) instead of giving up at the first one; TryObtain still makes one.
func TestFenceRoundRetried(t *testing.T) {
	prefix := testenv.Prefix(t)
	t.Cleanup(func() {
		for _, c := range redlockNodes(t) {
			_ = c.Del(bg, prefix+"flaky:fence").Err()
		}
	})
	nodes := redlockNodes(t)
	hooks := make([]*failFenceReads, len(nodes))
	for i, c := range nodes {
		hooks[i] = &failFenceReads{}
		c.AddHook(hooks[i])
	}
	l := newLocker(t, nodes, lock.Options{Prefix: prefix, Fencing: true, RetryDelay: 10 * time.Millisecond})
	fail := func() { // the next round of fence reads fails on two nodes of three
		hooks[0].n.Store(1)
		hooks[1].n.Store(1)
	}

	fail()
	k, err := l.Obtain(bg, "flaky")
	if err != nil {
		t.Fatalf("Obtain after one failed fence round = %v, want the lock at the next attempt", err)
	}
	if k.Fence() < 1 {
		t.Fatalf("fence %d", k.Fence())
	}
	if err := k.Release(bg); err != nil {
		t.Fatal(err)
	}

	fail()
	if _, err := l.TryObtain(bg, "flaky"); !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("TryObtain with a failed fence round = %v, want ErrUnavailable", err)
	}
	// It released the lock it had taken.
	k, err = l.TryObtain(bg, "flaky")
	if err != nil {
		t.Fatalf("TryObtain after the failed one = %v", err)
	}
	_ = k.Release(bg)
}

// TestFenceOutlivesBrokenLock: the classic Redlock objection. Two of three
// nodes restart empty at once while A holds the lock, and B gets it too:
// two holders. The lock cannot prevent it (see the package doc), but the
// fence still tells them apart: the third node kept A's number and B's
// fence read reaches it, so B's fence is above A's and a store that keeps
// the highest fence refuses A's later writes.
func TestFenceOutlivesBrokenLock(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Fencing: true, Expiry: 10 * time.Second, RetryDelay: 10 * time.Millisecond})
	a, err := l.Obtain(bg, "broken")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers[:2] {
		s.Kill()
		s.Restart() // at once, empty: against the package doc's advice
	}
	b, err := l.TryObtain(bg, "broken")
	if err != nil {
		t.Fatalf("B after two nodes restarted empty = %v; want the lock (the nodes forgot A's)", err)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("A's fence %d, B's %d: B's must be greater", a.Fence(), b.Fence())
	}
}

// TestFenceUniqueAcrossConcurrentHolders: the lock is broken behind A's
// back (its keys vanish from the nodes, as on nodes that let keys go early,
// while the fence counters stay), after A read the counters and before it
// raised them; B takes the lock and its fence meanwhile. Two holders at
// once: the package doc promises their fences still tell them apart
// while the nodes keep their counters. A raised the counters after B did,
// so A must get a fence above B's, or no lock at all: a fence equal to
// B's lets a store that keeps the highest fence (and accepts it again,
// for the holder's next write) take both holders' writes.
func TestFenceUniqueAcrossConcurrentHolders(t *testing.T) {
	prefix := testenv.Prefix(t)
	t.Cleanup(func() {
		for _, c := range redlockNodes(t) {
			_ = c.Del(bg, prefix+"dup:fence").Err()
		}
	})
	addrs := testenv.List(t, testenv.EnvRedlock)
	hook := &pauseAfterFenceRead{gate: make(chan struct{}), arrived: make(chan struct{}, 4*len(addrs))}
	nodesA := closing(t, lock.NewNodes(addrs...))
	for _, c := range nodesA {
		c.AddHook(hook)
	}
	opts := lock.Options{Prefix: prefix, Expiry: 10 * time.Second, Fencing: true, RetryDelay: 10 * time.Millisecond}
	a := newLocker(t, nodesA, opts)
	nodesB := redlockNodes(t)
	b := newLocker(t, nodesB, opts)

	var wg sync.WaitGroup
	defer wg.Wait()
	resA := hook.obtainPaused(t, &wg, a, "dup", len(addrs)) // A holds the lock and has read every counter
	for _, c := range nodesB {                              // A's keys vanish; the counters stay
		if err := c.Del(bg, prefix+"dup").Err(); err != nil {
			close(hook.gate)
			t.Fatal(err)
		}
	}
	kb, err := b.TryObtain(bg, "dup")
	close(hook.gate) // A raises the counters, after B did
	if err != nil {
		t.Fatalf("B's TryObtain after A's keys vanished: %v", err)
	}
	defer func() { _ = kb.Release(bg) }()

	r := <-resA
	if r.err != nil {
		t.Logf("A's TryObtain: %v", r.err)
		if !errors.Is(r.err, lock.ErrNotObtained) {
			t.Fatalf("A's TryObtain = %v, want ErrNotObtained (another holder raised the fence meanwhile)", r.err)
		}
		return
	}
	defer func() { _ = r.k.Release(bg) }()
	if r.k.Fence() <= kb.Fence() {
		t.Fatalf("A raised the fence after B, and got fence %d; B %d: two holders at once with fences "+
			"that do not tell them apart (A's must be above B's, or A must not get the lock)", r.k.Fence(), kb.Fence())
	}
}

// failFenceRaises is a go-redis hook that fails the next n raises of a
// fence counter (the script's EVALSHA or EVAL) on its client, before they
// reach the node, as a node that times out once would.
type failFenceRaises struct{ n atomic.Int32 }

func (h *failFenceRaises) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failFenceRaises) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *failFenceRaises) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 {
			if key, ok := args[3].(string); ok && strings.HasSuffix(key, ":fence") && h.n.Add(-1) >= 0 {
				err := errors.New("injected: fence raise timed out")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// TestFenceNotRepeatedAfterOneRestart: one node restarts empty, and
// otherwise nodes only miss a round now and then, as slow nodes do. Fence
// 2 reaches nodes 0 and 2 (node 1 misses the raise, and keeps 1); node 2
// restarts empty, so only node 0 holds 2; the next fence's reads miss
// node 0 (they find 1 and 0) but its raise reaches node 0, which answers
// that it already holds 2. That answer must stop the round: handing out 2
// again gives two holders the same fence, after a single restart, with
// node 0 never down.
func TestFenceNotRepeatedAfterOneRestart(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	reads := make([]*failFenceReads, len(nodes))
	raises := make([]*failFenceRaises, len(nodes))
	for i, c := range nodes {
		reads[i], raises[i] = &failFenceReads{}, &failFenceRaises{}
		c.AddHook(reads[i])
		c.AddHook(raises[i])
	}
	l := newLocker(t, nodes, lock.Options{Fencing: true, RetryDelay: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	var fences []int64
	take := func(step string) {
		t.Helper()
		k, err := l.Obtain(ctx, "r")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		fences = append(fences, k.Fence())
		if n := len(fences); n > 1 && fences[n-1] <= fences[n-2] {
			t.Fatalf("%s: fences %v do not grow", step, fences)
		}
		if err := k.Release(bg); err != nil {
			t.Fatalf("%s: release: %v", step, err)
		}
	}
	take("all up")
	raises[1].n.Store(1)
	take("node 1 misses the raise")
	servers[2].Kill()
	servers[2].Restart() // empty: node 0 alone holds the last fence
	// The clients' pooled connections to node 2 died with it: have them
	// redialled, so that the next rounds reach node 2 at once.
	testenv.WaitFor(t, 5*time.Second, "node 2 to answer again", func() bool { return nodes[2].Ping(bg).Err() == nil })
	reads[0].n.Store(1)
	take("node 2 restarted, the reads miss node 0")
}

// cmdHook is a go-redis hook that runs before on every command of its
// client, before the command is sent (an error from it fails the command
// without sending it, as a node that times out would), and after on its
// outcome.
type cmdHook struct {
	before func(redis.Cmder) error
	after  func(redis.Cmder, error)
}

func (h *cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.before != nil {
			if err := h.before(cmd); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		err := next(ctx, cmd)
		if h.after != nil {
			h.after(cmd, err)
		}
		return err
	}
}

// isRaise reports whether cmd runs the fence raise script (EVALSHA, or
// EVAL after NOSCRIPT) on the counter key.
func isRaise(cmd redis.Cmder, key string) bool {
	args := cmd.Args()
	return (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[3] == key
}

// TestFenceUniqueAfterRestartBrokeLock: the package doc's broken lock,
// by a restart: one node (0) restarts empty while A holds the lock, which
// B then takes too. Besides the restart, nodes only miss a call now and
// then, and none misses both calls of a fence round. With 3 nodes: A's
// acquisition and its fence raise miss node 2 (it answered A's read); B's
// raise misses node 1 (it answered B's read). A raised node 0 before the
// restart and node 1 after B read it; B raised nodes 0 and 2. Both rounds
// saw every node they raised answer 1, from a quorum: both would get
// fence 1, and a store that keeps the highest fence takes both holders'
// writes. A round must not hand out its number when a node whose counter
// it read did not take the raise: that node may hold the other round's
// number already. With 5 nodes, A's side is nodes 1 and 2, B's 3 and 4.
func TestFenceUniqueAfterRestartBrokeLock(t *testing.T) {
	t.Run("3 Redlock nodes", func(t *testing.T) {
		addrs := testenv.List(t, testenv.EnvRedlock)
		if len(addrs) != 3 {
			t.Skipf("%d Redlock nodes; the interleaving is staged on 3", len(addrs))
		}
		fenceAfterRestartBrokeLock(t, addrs)
	})
	t.Run("5 nodes", func(t *testing.T) {
		addrs := make([]string, 5)
		for i := range addrs {
			addrs[i] = testenv.StartRedis(t).Addr()
		}
		fenceAfterRestartBrokeLock(t, addrs)
	})
}

// fenceAfterRestartBrokeLock stages TestFenceUniqueAfterRestartBrokeLock
// on addrs: node 0 restarts; nodes 1 to quorum-1 are A's side (B's raise
// misses them), the others B's (A's acquisition and raise miss them).
func fenceAfterRestartBrokeLock(t *testing.T, addrs []string) {
	const name = "dup2"
	prefix := testenv.Prefix(t)
	lockKey, fenceKey := prefix+name, prefix+name+":fence"
	plain := closing(t, lock.NewNodes(addrs...))
	t.Cleanup(func() {
		for _, c := range plain {
			_ = c.Del(bg, lockKey, fenceKey).Err()
		}
	})
	quorum := len(addrs)/2 + 1
	missed := errors.New("injected: timed out")
	var (
		raisedA0 = make(chan struct{}, 4)            // A's raise ran on node 0
		heldA    = make(chan struct{}, 4*len(addrs)) // A's raise to one of its side is held
		gateA    = make(chan struct{})               // ... until this closes
	)
	nodesA := closing(t, lock.NewNodes(addrs...))
	nodesB := closing(t, lock.NewNodes(addrs...))
	nodesA[0].AddHook(&cmdHook{after: func(cmd redis.Cmder, err error) {
		if isRaise(cmd, fenceKey) && err == nil {
			raisedA0 <- struct{}{}
		}
	}})
	for i := 1; i < len(addrs); i++ {
		if i < quorum { // A's side
			nodesA[i].AddHook(&cmdHook{before: func(cmd redis.Cmder) error {
				if isRaise(cmd, fenceKey) {
					heldA <- struct{}{}
					<-gateA
				}
				return nil
			}})
			nodesB[i].AddHook(&cmdHook{before: func(cmd redis.Cmder) error {
				if isRaise(cmd, fenceKey) {
					return missed // B read it, and misses its raise
				}
				return nil
			}})
			continue
		}
		nodesA[i].AddHook(&cmdHook{before: func(cmd redis.Cmder) error { // B's side
			if (cmd.Name() == "set" && cmd.Args()[1] == lockKey) || isRaise(cmd, fenceKey) {
				return missed // A read it, and misses its acquisition and raise
			}
			return nil
		}})
	}
	// Expiry 30s: each round may take 6s, more than the staging needs
	// on a loaded machine, so that no call times out but those injected.
	opts := lock.Options{Prefix: prefix, Expiry: 30 * time.Second, Fencing: true}
	a := newLocker(t, nodesA, opts)
	b := newLocker(t, nodesB, opts)

	resA := make(chan obtained, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gateA) }) }
	defer openGate()
	wg.Go(func() {
		k, err := a.TryObtain(bg, name)
		resA <- obtained{k, err}
	})
	for i := range quorum { // A raised node 0; its raises to its side wait
		ch := heldA
		if i == 0 {
			ch = raisedA0
		}
		select {
		case <-ch:
		case r := <-resA:
			t.Fatalf("A's TryObtain returned before its raise: %v", r.err)
		}
	}
	// Node 0 restarts empty: A's lock key and fence counter are gone.
	if err := plain[0].Del(bg, lockKey, fenceKey).Err(); err != nil {
		t.Fatal(err)
	}
	kb, errB := b.TryObtain(bg, name) // node 0 and B's side; A's side still has A's key
	openGate()                        // A's raises reach its side, after B read it
	r := <-resA
	t.Logf("A: %v, B: %v", r.err, errB)
	if errB == nil {
		defer func() { _ = kb.Release(bg) }()
	}
	if r.err == nil {
		defer func() { _ = r.k.Release(bg) }()
	}
	for _, err := range []error{r.err, errB} {
		if err != nil && !errors.Is(err, lock.ErrNotObtained) && !errors.Is(err, lock.ErrUnavailable) {
			t.Fatalf("TryObtain = %v, want the lock, ErrNotObtained or ErrUnavailable", err)
		}
	}
	if r.err == nil && errB == nil && r.k.Fence() == kb.Fence() {
		t.Fatalf("two holders at once after one restart, both with fence %d", kb.Fence())
	}
}

// TestFenceWithFullNode: one node of three is full (maxmemory under
// noeviction): it answers reads but refuses writes, so it refuses the
// lock and the fence raise. Redlock tolerates one such node, and so must
// fencing: the node's refusal of the raise answers that it held no number
// as high (the raise compares before it writes), which a round whose
// reads reached the node needs from it.
func TestFenceWithFullNode(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	full := servers[2].Client()
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := full.ConfigSet(bg, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := full.Set(bg, "probe", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("SET on the full node = %v, want OOM", err)
	}
	l := newLocker(t, nodes, lock.Options{Fencing: true, RetryDelay: 10 * time.Millisecond})
	var last int64
	for i := range 3 {
		k, err := l.Obtain(bg, "full")
		if err != nil {
			t.Fatalf("Obtain #%d with one full node of three: %v", i, err)
		}
		if k.Fence() <= last {
			t.Fatalf("Obtain #%d: fence %d after %d", i, k.Fence(), last)
		}
		last = k.Fence()
		if err := k.Release(bg); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFenceRaiseRunTwice: a connection dropped after the raise ran, and
// before its reply came back, makes go-redis send it again (MaxRetries
// 1, as NewNodes sets, retries on EOF whatever the command): the second
// run finds the counter at the round's number, raised by this very
// round, and answers as the first did. (It answered "held", which cost
// the attempt: ErrNotObtained, though nobody else held the lock.)
func TestFenceRaiseRunTwice(t *testing.T) {
	servers, nodes := ownNodes(t, 3) // fresh script caches: the EVAL after NOSCRIPT is run twice too
	prefix := testenv.Prefix(t)
	fenceKey := prefix + "twice:fence"
	first := servers[0].Client() // without the hook
	var twice atomic.Int32
	twice.Store(1)
	nodes[0].AddHook(&cmdHook{before: func(cmd redis.Cmder) error {
		if isRaise(cmd, fenceKey) && twice.Add(-1) >= 0 {
			// The first run, whose reply the dropped connection lost;
			// the command then goes on as go-redis's retry.
			err := first.Do(bg, cmd.Args()...).Err()
			if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				twice.Add(1) // the EVAL that follows runs twice instead
			}
		}
		return nil
	}})
	l := newLocker(t, nodes, lock.Options{Prefix: prefix, Fencing: true, RetryDelay: 10 * time.Millisecond})
	for i, try := range []func(context.Context, string) (*lock.Lock, error){l.TryObtain, l.Obtain} {
		twice.Store(1)
		k, err := try(bg, "twice")
		if err != nil || k.Fence() != int64(i+1) {
			t.Fatalf("acquisition %d, whose raise ran twice on a node = %v; want the lock, with fence %d", i+1, err, i+1)
		}
		if err := k.Release(bg); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFenceOnClusterNode: a fence round on a node that is a Cluster
// client: its raise's keys (the counter and its round) share a hash slot
// whatever the prefix and name. (The round key was Prefix+name+
// ":fence:round", in another slot than the counter unless a hash tag
// joined them: the Cluster answered CROSSSLOT and every fenced
// acquisition failed; found by review.)
func TestFenceOnClusterNode(t *testing.T) {
	cl := testenv.Cluster(t)
	base := testenv.Prefix(t)
	for _, prefix := range []string{base + ":", "{" + base + "}:", base + "}x:"} {
		l := newLocker(t, []redis.UniversalClient{cl}, lock.Options{Prefix: prefix, Fencing: true})
		for _, name := range []string{"order-1", "payment-42", "a{b}c"} {
			k, err := l.TryObtain(bg, name)
			if err != nil {
				t.Fatalf("prefix %q: TryObtain(%q) with Fencing on a Cluster node = %v; want the lock", prefix, name, err)
			}
			if k.Fence() != 1 {
				t.Errorf("prefix %q, %q: fence %d, want 1", prefix, name, k.Fence())
			}
			_ = k.Release(bg)
		}
	}
}
