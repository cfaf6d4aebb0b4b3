package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
	"github.com/redis/go-redis/v9"
)

// TestSingletonOneAtATime: 6 instances (Lockers with clients of their
// own) start the job together, round after round. In each round at most
// one runs it; the runner holds on until all the others have returned, so
// each of them must have been turned away with ErrNotObtained.
func TestSingletonOneAtATime(t *testing.T) {
	const instances, rounds = 6, 8
	prefix := testenv.Prefix(t)
	lockers := make([]*lock.Locker, instances)
	for i := range lockers {
		lockers[i] = newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix})
	}
	var sec section
	var runs, skips atomic.Int32
	for round := range rounds {
		var ran, away atomic.Int32
		allAway := make(chan struct{}) // closed when instances-1 were turned away
		turnedAway := func() {
			if away.Add(1) == instances-1 {
				close(allAway)
			}
		}
		start := make(chan struct{})
		errs := make(chan error, instances)
		var wg sync.WaitGroup
		for _, l := range lockers {
			job := lock.Singleton(l, "purge", func(ctx context.Context) error {
				sec.enter()
				defer sec.exit()
				if ran.Add(1) > 1 {
					return errors.New("a second instance ran the job")
				}
				select {
				case <-allAway:
					return nil
				case <-time.After(5 * time.Second):
					return errors.New("the other instances were not turned away while the job ran")
				}
			})
			wg.Go(func() {
				<-start
				err := job(bg)
				switch {
				case err == nil:
					runs.Add(1)
				case errors.Is(err, lock.ErrNotObtained):
					skips.Add(1)
					turnedAway()
				default:
					errs <- err
					turnedAway()
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		// ran is 0 when every instance lost the race on split votes:
		// allowed, as long as nobody ran it twice.
		if n := ran.Load(); n > 1 {
			t.Fatalf("round %d: the job ran %d times", round, n)
		}
	}
	sec.check(t)
	t.Logf("%d rounds of %d instances: %d runs, %d skips", rounds, instances, runs.Load(), skips.Load())
	if runs.Load() == 0 {
		t.Fatal("the job never ran")
	}
	if int(runs.Load()+skips.Load()) != rounds*instances {
		t.Fatalf("runs %d + skips %d != %d calls", runs.Load(), skips.Load(), rounds*instances)
	}
}

// TestSingletonLoop: instances run the job in a loop for a while; runs
// never overlap, and a plain counter the job increments is exact.
func TestSingletonLoop(t *testing.T) {
	const instances, calls = 4, 25
	prefix := testenv.Prefix(t)
	var (
		sec     section
		counter int
		runs    atomic.Int32
		wg      sync.WaitGroup
	)
	errs := make(chan error, instances)
	for i := range instances {
		nodes := redlockNodes(t)
		l := newLocker(t, nodes, lock.Options{Prefix: prefix})
		job := lock.Singleton(l, "reaper", func(ctx context.Context) error {
			sec.enter()
			defer sec.exit()
			v := counter
			for range 3 { // some work: round trips to a server
				if err := nodes[0].Ping(ctx).Err(); err != nil {
					return err
				}
			}
			counter = v + 1
			runs.Add(1)
			return nil
		})
		wg.Go(func() {
			for c := range calls {
				if err := job(bg); err != nil && !errors.Is(err, lock.ErrNotObtained) {
					errs <- fmt.Errorf("instance %d call %d: %w", i, c, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sec.check(t)
	if runs.Load() == 0 || counter != int(runs.Load()) {
		t.Fatalf("counter %d, runs %d", counter, runs.Load())
	}
	t.Logf("%d instances × %d calls: %d runs", instances, calls, runs.Load())
}

// setHook calls after once each time a node has answered a SET (a lock
// acquisition) sent through the client it is added to.
type setHook struct{ after func() }

func (setHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h setHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "set" {
			h.after()
		}
		return err
	}
}

func (setHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSingletonSkipsWhileAnotherRuns: two instances schedule the same
// job at once; A takes the lock first, and B's first attempt finds it
// held on every node. As Singleton's doc says, B's call, made while A
// runs the job, returns ErrNotObtained without running it (B skips this
// round), even though A's run ends right after B's attempt: the attempts
// Singleton makes after the first are for split votes (nobody got a
// quorum), not for waiting a running instance out, which would run a
// periodic job (a payout, a report) twice in one round.
func TestSingletonSkipsWhileAnotherRuns(t *testing.T) {
	prefix := testenv.Prefix(t)
	opts := lock.Options{Prefix: prefix, RetryDelay: 50 * time.Millisecond}
	a := newLocker(t, redlockNodes(t), opts)
	bNodes := redlockNodes(t)
	var answered atomic.Int32
	bTried := make(chan struct{}) // closed when every node answered B's first attempt
	for _, c := range bNodes {
		c.(*redis.Client).AddHook(setHook{func() {
			if answered.Add(1) == int32(len(bNodes)) {
				close(bTried)
			}
		}})
	}
	b := newLocker(t, bNodes, opts)
	var runs atomic.Int32
	job := func(ctx context.Context) error { runs.Add(1); return nil }
	bErr := make(chan error, 1)
	err := lock.Singleton(a, "payout", func(ctx context.Context) error {
		go func() { bErr <- lock.Singleton(b, "payout", job)(bg) }()
		select { // A's run lasts until B's first attempt found the lock held
		case <-bTried:
		case <-time.After(10 * time.Second):
			return errors.New("B's first attempt did not reach every node")
		}
		return job(ctx)
	})(bg)
	if err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-bErr; !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("B, called while A ran the job = %v, want ErrNotObtained", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the job ran %d times in one round, want once", n)
	}
}

// TestSingletonRetriesSplitVote: three instances that start the job at the
// same moment can each take one node of three; each then finds the lock
// held on a quorum of nodes by the two others, and none holds it. That is
// a split vote, not a running instance: the partial locks are released at
// once, and Singleton's next attempt takes the lock and runs the job.
// Here C's first attempt meets X's and Y's partial locks on nodes 1 and 2,
// which they drop as soon as C has been answered.
func TestSingletonRetriesSplitVote(t *testing.T) {
	prefix := testenv.Prefix(t)
	opts := lock.Options{Prefix: prefix, RetryDelay: 50 * time.Millisecond}
	nodes := redlockNodes(t)
	key := prefix + "split"
	for i, c := range nodes[1:] {
		if err := c.Set(bg, key, fmt.Sprintf("partial-%d", i), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var answered atomic.Int32
	cNodes := redlockNodes(t)
	for _, c := range cNodes {
		c.(*redis.Client).AddHook(setHook{func() {
			if answered.Add(1) == int32(len(cNodes)) { // X and Y lost too: they release
				for _, n := range nodes[1:] {
					if err := n.Del(bg, key).Err(); err != nil {
						t.Error(err)
					}
				}
			}
		}})
	}
	c := newLocker(t, cNodes, opts)
	var runs atomic.Int32
	if err := lock.Singleton(c, "split", func(context.Context) error { runs.Add(1); return nil })(bg); err != nil {
		t.Fatalf("C after a split vote = %v, want the job run", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the job ran %d times, want once", n)
	}
}
