package redisstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// deadLetters records the dead letters a consumer's
// Options.Process.DeadLetter is given.
type deadLetters struct {
	mu     sync.Mutex
	ids    []string
	causes []error
}

func (d *deadLetters) hook(_ context.Context, msg consumerx.Message, cause error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = append(d.ids, msg.ID)
	d.causes = append(d.causes, cause)
	return nil
}

func (d *deadLetters) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ids)
}

// passes counts the XAUTOCLAIMs consumer sends: each starts, or goes on
// with, a reclaim pass.
type passes struct {
	consumer string
	n        atomic.Int64
}

func (h *passes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *passes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "xautoclaim" && len(args) > 3 && args[3] == h.consumer {
			h.n.Add(1)
		}
		return err
	}
}
func (h *passes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// wait waits until n more XAUTOCLAIMs have answered.
func (h *passes) wait(t *testing.T, n int64) {
	t.Helper()
	from := h.n.Load()
	testenv.WaitFor(t, 10*time.Second, "the reclaim passes", func() bool { return h.n.Load() >= from+n })
}

// deleteThenReclaim deletes entry 1-1 from stream (XDEL) and runs the
// reclaiming consumer c, whose XAUTOCLAIMs b counts; it returns, with a
// function that stops c, once c's reclaim pass has dropped the deleted
// entry from the pending list and two more passes have answered.
func deleteThenReclaim(t *testing.T, e *env, stream string, c *Consumer, b *passes) (stop func()) {
	t.Helper()
	if err := e.rdb.XDel(context.Background(), stream, "1-1").Err(); err != nil {
		t.Fatal(err)
	}
	stop = e.run(c)
	testenv.WaitFor(t, 10*time.Second, "b's reclaim pass to drop the deleted entry", func() bool {
		return pending(t, e.rdb, stream, "billing") == 0
	})
	b.wait(t, 2)
	return stop
}

// runningElsewhere sets up entry 1-1 of a stream of its own running in
// consumer "a" (its handler blocked until release is closed, then
// returning what result gives) and deleted from the stream (XDEL), and
// consumer "b" (logging to logger, if not nil), which reclaims with a
// short MinIdle, started once "a" runs the entry. It returns the stream, b's dead letters, b's reclaim passes
// and a stop function for both.
func runningElsewhere(t *testing.T, result func() error, release <-chan struct{}, logger *slog.Logger) (e *env, stream string, dead *deadLetters, b *passes, stop func()) {
	return runningElsewhereWith(t, guard.Options{}, consumerx.Options{}, result, release, logger)
}

// runningElsewhereWith is runningElsewhere with a guard made with gopts,
// and consumer "a" processing with aopts.
func runningElsewhereWith(t *testing.T, gopts guard.Options, aopts consumerx.Options, result func() error, release <-chan struct{}, logger *slog.Logger) (e *env, stream string, dead *deadLetters, b *passes, stop func()) {
	e = newEnv(t, gopts)
	ctx := context.Background()
	stream = e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	a := e.consumer(func(ctx context.Context, _ consumerx.Message) error {
		close(started)
		select {
		case <-release:
		case <-ctx.Done(): // the test failed early
			return ctx.Err()
		}
		return result()
	}, Options{Stream: stream, Group: "billing", Consumer: "a", Process: aopts})
	b = &passes{consumer: "b"}
	e.rdb.AddHook(b)
	dead = &deadLetters{}
	bc := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: time.Millisecond, ClaimEvery: 10 * time.Millisecond,
			Process: consumerx.Options{DeadLetter: dead.hook, Logger: logger}})
	stopA := e.run(a)
	<-started
	// b's XAUTOCLAIM drops the deleted entry from the pending list, though
	// a runs it.
	stopB := deleteThenReclaim(t, e, stream, bc, b)
	return e, stream, dead, b, func() { stopB(); stopA() }
}

// An entry deleted from the stream (XDEL) while consumer a runs it is
// found deleted by consumer b's reclaim pass (Redis 7 drops it from the
// pending list however recently it was delivered). b does not dead-letter
// it while a holds it; a's effect completes, and there is no dead letter
// (one would invite an operator to add the payload again, under a new
// entry id, a new key: the effect would run twice).
func TestDeletedEntryRunningElsewhereCompletesWithoutDeadLetter(t *testing.T) {
	release := make(chan struct{})
	e, stream, dead, b, stop := runningElsewhere(t, func() error { return nil }, release, nil)
	if n := dead.len(); n != 0 {
		t.Fatalf("dead-lettered %v (%v) while another consumer runs it", dead.ids, dead.causes)
	}
	close(release)
	key := guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: ID(stream, "1-1")}
	testenv.WaitFor(t, 10*time.Second, "a's effect completed", func() bool {
		rec, err := e.g.Get(context.Background(), key)
		return err == nil && rec.State == guard.StateCompleted
	})
	b.wait(t, 2) // b looks at the record again
	stop()
	if n := dead.len(); n != 0 {
		t.Errorf("dead-lettered %v (%v); its effect completed", dead.ids, dead.causes)
	}
	if n, err := e.rdb.XLen(context.Background(), stream+DeadLetterSuffix).Result(); err != nil || n != 0 {
		t.Errorf("dead-letter stream has %d entries (%v), want none", n, err)
	}
}

// As above, but a's handler fails: nothing will run the entry again (its
// fields are gone), and b dead-letters it once, with ErrDeleted and the
// failed record in the cause.
func TestDeletedEntryRunningElsewhereFailsDeadLetteredOnce(t *testing.T) {
	release := make(chan struct{})
	e, stream, dead, b, stop := runningElsewhere(t, func() error { return errors.New("card declined") }, release, nil)
	if n := dead.len(); n != 0 {
		t.Fatalf("dead-lettered %v (%v) while another consumer runs it", dead.ids, dead.causes)
	}
	close(release)
	testenv.WaitFor(t, 10*time.Second, "the dead letter", func() bool { return dead.len() > 0 })
	b.wait(t, 2)
	stop()
	dead.mu.Lock()
	defer dead.mu.Unlock()
	if len(dead.ids) != 1 || dead.ids[0] != ID(stream, "1-1") || !errors.Is(dead.causes[0], ErrDeleted) ||
		!strings.Contains(dead.causes[0].Error(), "failed") {
		t.Errorf("dead-lettered %v (%v); want %s once, ErrDeleted, its record failed", dead.ids, dead.causes, ID(stream, "1-1"))
	}
	if n, err := e.rdb.XLen(context.Background(), stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}

// As above, but a's attempt is the last the guard allows: a dead-letters
// the entry itself (its attempts ran out), and b, finding the record
// failed, must not dead-letter it again: the dead letter goes out once,
// whichever of a and b sends it.
func TestDeletedEntryLastAttemptFailsRunningElsewhereDeadLetteredOnce(t *testing.T) {
	release := make(chan struct{})
	deadA := &deadLetters{}
	settled := make(chan consumerx.Outcome, 1)
	aopts := consumerx.Options{DeadLetter: deadA.hook, OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
		select {
		case settled <- o:
		default:
		}
	}}
	e, stream, dead, b, stop := runningElsewhereWith(t, guard.Options{MaxAttempts: 1}, aopts,
		func() error { return errors.New("card declined") }, release, nil)
	if n := dead.len(); n != 0 {
		t.Fatalf("dead-lettered %v (%v) while another consumer runs it", dead.ids, dead.causes)
	}
	close(release)
	var o consumerx.Outcome
	select {
	case o = <-settled: // a's dead letter sent, or left to b's
	case <-time.After(10 * time.Second):
		t.Fatal("a's delivery did not settle")
	}
	b.wait(t, 2) // b looks at the record again
	stop()
	deadA.mu.Lock()
	dead.mu.Lock()
	defer deadA.mu.Unlock()
	defer dead.mu.Unlock()
	if n := len(deadA.ids) + len(dead.ids); n != 1 {
		t.Errorf("%d dead letters (a: %v %v, its outcome %s; b: %v %v), want 1", n, deadA.ids, deadA.causes, o, dead.ids, dead.causes)
	}
	if n, err := e.rdb.XLen(context.Background(), stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}

// The two paths that dead-letter an entry whose last attempt failed,
// consumerx's (its attempts ran out) and the deleted entry's (its record
// failed), each run once, in either order: the dead letter goes out once,
// from whichever comes first.
func TestDeletedEntryExhaustedDeadLetteredOnceEitherPathFirst(t *testing.T) {
	declined := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	for _, deletedFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "consumerx first", true: "deleted first"}[deletedFirst], func(t *testing.T) {
			e := newEnv(t, guard.Options{MaxAttempts: 1})
			ctx := context.Background()
			stream := e.prefix + "orders"
			dead := &deadLetters{}
			c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b",
				Process: consumerx.Options{DeadLetter: dead.hook}})
			msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"payload": "charge 1"}})
			if deletedFirst {
				// Its last attempt failed, and its holder has not yet
				// dead-lettered it.
				e.failLastAttempt(t, c, msg, "charge 1")
				c.deleted(ctx, []string{"1-1"})
			}
			if o, err := c.Processor().Process(ctx, msg, declined); o != consumerx.DeadLettered {
				t.Fatalf("Process = %s, %v; want %s", o, err, consumerx.DeadLettered)
			}
			if !deletedFirst {
				c.deleted(ctx, []string{"1-1"})
			}
			dead.mu.Lock()
			defer dead.mu.Unlock()
			if len(dead.ids) != 1 {
				t.Errorf("dead-lettered %v (%v), want once", dead.ids, dead.causes)
			}
			if n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
				t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
			}
		})
	}
}

// A consumer finds an entry deleted, its record failed, while another
// holds the entry's dead-letter record (sending its dead letter): it does
// not send one then, but watches the entry; when that sender fails, it
// sends the dead letter itself, once.
func TestDeletedEntryDeadLetterSentElsewhereWatched(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	dead := &deadLetters{}
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "b", Process: consumerx.Options{DeadLetter: dead.hook}})
	msg := c.message(redis.XMessage{ID: "1-1"})
	e.failLastAttempt(t, c, msg, "charge 1")
	dk, ok := c.entryDeadKey(msg)
	if !ok {
		t.Fatal("no dead-letter record for an entry")
	}
	sender, err := e.g.Claim(ctx, dk, "")
	if err != nil || sender.Status != guard.Acquired {
		t.Fatalf("claim of the dead-letter record = %+v, %v", sender, err)
	}
	c.deleted(ctx, []string{"1-1"})
	if n := dead.len(); n != 0 {
		t.Fatalf("dead-lettered %v (%v) while another sends it", dead.ids, dead.causes)
	}
	if c.watch["1-1"] == nil {
		t.Fatal("not watched while another sends its dead letter")
	}
	if err := e.g.Fail(ctx, sender.Lease, errors.New("pager unreachable")); err != nil {
		t.Fatal(err)
	}
	c.recheck(ctx)
	if n := dead.len(); n != 1 || c.watch["1-1"] != nil {
		t.Errorf("dead-lettered %v (%v), watched %v; want once, no longer watched", dead.ids, dead.causes, c.watch["1-1"] != nil)
	}
}

// A consumer claims entry 1-1 and dies (its claim left pending, no
// heartbeat); the entry is deleted from the stream. Consumer b's reclaim
// pass finds it deleted while the dead consumer's lease has time left: b
// does not dead-letter it then, but once the lease has run out with
// nobody holding the key, once; and the dead consumer, were it still
// running past its lease, can no longer complete it (the dead letter
// holds: its effect will not complete).
func TestDeletedEntryHolderDiesDeadLetteredOnceLeaseRunsOut(t *testing.T) {
	for name, fingerprint := range map[string]string{
		"no fingerprint": "",
		// consumerx's default, SHA-256 of the payload in base64url: 43
		// bytes, which a RedisStore keeps as a digest (Record.Fingerprint
		// reads "sha256/128:…", which is not the fingerprint).
		"consumerx's default fingerprint": defaultFingerprint("charge 1"),
	} {
		t.Run(name, func(t *testing.T) { holderDies(t, fingerprint, guard.Options{}) })
	}
	// The dead consumer's attempt was the last the guard allows: recording
	// it failed leaves it exhausted; the dead letter is still sent once
	// (consumerx's own, for an exhausted message, is not: nothing delivers
	// the entry again).
	t.Run("last attempt", func(t *testing.T) { holderDies(t, defaultFingerprint("charge 1"), guard.Options{MaxAttempts: 1}) })
}

// defaultFingerprint is consumerx's default Fingerprint of a message with
// payload.
func defaultFingerprint(payload string) string {
	sum := sha256.Sum256([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// holderDies is TestDeletedEntryHolderDiesDeadLetteredOnceLeaseRunsOut
// with the dead consumer's claim made with fingerprint, under a guard
// with gopts.
func holderDies(t *testing.T, fingerprint string, gopts guard.Options) {
	e := newEnv(t, gopts)
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	dead := &deadLetters{}
	b := &passes{consumer: "b"}
	e.rdb.AddHook(b)
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: time.Millisecond, ClaimEvery: 10 * time.Millisecond,
			Process: consumerx.Options{DeadLetter: dead.hook}})
	// The dead consumer's claim, with a lease of its own.
	key, err := c.Processor().Key(consumerx.Message{ID: ID(stream, "1-1")})
	if err != nil {
		t.Fatal(err)
	}
	short := guard.New(e.g.Store(), guard.Options{Lease: 2 * time.Second})
	held, err := short.Claim(ctx, key, fingerprint)
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", held, err)
	}
	stop := deleteThenReclaim(t, e, stream, c, b)
	// A dead letter while the lease still has time left is too soon.
	n := dead.len()
	if rec, err := e.g.Get(ctx, key); n != 0 && err == nil && rec.LeaseLeft > 0 {
		t.Fatalf("dead-lettered %v (%v) with %s of the holder's lease left", dead.ids, dead.causes, rec.LeaseLeft)
	}
	testenv.WaitFor(t, 10*time.Second, "the dead letter once the lease ran out", func() bool { return dead.len() > 0 })
	b.wait(t, 2)
	stop()
	dead.mu.Lock()
	defer dead.mu.Unlock()
	if len(dead.ids) != 1 || dead.ids[0] != ID(stream, "1-1") || !errors.Is(dead.causes[0], ErrDeleted) {
		t.Errorf("dead-lettered %v (%v); want %s once, ErrDeleted", dead.ids, dead.causes, ID(stream, "1-1"))
	}
	if err := short.Complete(ctx, held.Lease, nil); !errors.Is(err, guard.ErrLeaseLost) {
		t.Errorf("the dead consumer's late completion: %v, want ErrLeaseLost", err)
	}
	if rec, err := e.g.Get(ctx, key); err != nil || rec.State != guard.StateFailed {
		t.Errorf("record = %+v, %v; want failed", rec, err)
	}
	if n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}

// Consumer b stops while the deleted entry it watches is still running in
// consumer a: b does not dead-letter it (a will most likely complete it),
// and logs at Error level, with the entry's id, that nothing will run it
// again if a's effect does not complete.
func TestDeletedEntryRunningElsewhereAtShutdownLoggedNotDeadLettered(t *testing.T) {
	release := make(chan struct{})
	var (
		mu   sync.Mutex
		logs bytes.Buffer
	)
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	e, stream, dead, _, stop := runningElsewhere(t, func() error { return nil }, release, logger)
	stop() // b first: a's handler is still blocked
	close(release)
	if n := dead.len(); n != 0 {
		t.Errorf("dead-lettered %v (%v) while another consumer runs it", dead.ids, dead.causes)
	}
	if n, err := e.rdb.XLen(context.Background(), stream+DeadLetterSuffix).Result(); err != nil || n != 0 {
		t.Errorf("dead-letter stream has %d entries (%v), want none", n, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if out := logs.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "still running elsewhere as the consumer stops") ||
		!strings.Contains(out, "id=1-1") {
		t.Errorf("log does not say at Error level that 1-1 is still running elsewhere:\n%s", out)
	}
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Past maxWatched entries watched at once, an entry deleted while running
// elsewhere is dead-lettered at once, as before there was a watch list,
// not dropped: its cause names its record, pending with its lease left, for
// the operator to check before adding the payload again.
func TestDeletedEntryRunningElsewherePastTheWatchCapDeadLetteredAtOnce(t *testing.T) {
	defer func(n int) { maxWatched = n }(maxWatched)
	maxWatched = 0
	release := make(chan struct{})
	_, stream, dead, _, stop := runningElsewhere(t, func() error { return nil }, release, nil)
	testenv.WaitFor(t, 10*time.Second, "the dead letter", func() bool { return dead.len() > 0 })
	close(release)
	stop()
	dead.mu.Lock()
	defer dead.mu.Unlock()
	if len(dead.ids) != 1 || dead.ids[0] != ID(stream, "1-1") || !errors.Is(dead.causes[0], ErrDeleted) ||
		!strings.Contains(dead.causes[0].Error(), "pending, attempt 1, lease left") {
		t.Errorf("dead-lettered %v (%v); want %s once, ErrDeleted, its record pending with its lease left", dead.ids, dead.causes, ID(stream, "1-1"))
	}
}

// Consumer a's XREADGROUP has handed it entry 1-1, and its claim is still
// on the way, when the entry is deleted from the stream and consumer b's
// reclaim pass finds it deleted with no live holder: no record yet, an
// earlier attempt failed (attempts left), or an earlier holder's lease run
// out (b records that attempt failed). b does not dead-letter it on that
// first look: a claims it (a failed record is claimed again as a new one)
// and completes it, and there is no dead letter, whose re-drive would run
// the effect a second time.
func TestDeletedEntryReadButNotYetClaimedCompletesWithoutDeadLetter(t *testing.T) {
	for _, earlier := range []string{"none", "failed", "lease run out"} {
		t.Run(earlier, func(t *testing.T) { deletedReadNotYetClaimed(t, earlier) })
	}
}

func deletedReadNotYetClaimed(t *testing.T, earlier string) {
	opts := guard.Options{}
	if earlier == "lease run out" {
		opts.Lease = 200 * time.Millisecond // the earlier holder's, run out below
	}
	e := newEnv(t, opts)
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	gate := &readGate{consumer: "a", read: make(chan struct{}), open: make(chan struct{})}
	e.rdb.AddHook(gate)
	var ran atomic.Int32
	a := e.consumer(func(context.Context, consumerx.Message) error {
		ran.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "a"})
	key, err := a.Processor().Key(consumerx.Message{ID: ID(stream, "1-1")})
	if err != nil {
		t.Fatal(err)
	}
	if earlier != "none" { // an earlier attempt, 1 of 5
		held, err := e.g.Claim(ctx, key, defaultFingerprint("charge 1"))
		if err != nil || held.Status != guard.Acquired {
			t.Fatalf("claim = %+v, %v", held, err)
		}
		if earlier == "failed" {
			if err := e.g.Fail(ctx, held.Lease, errors.New("card service down")); err != nil {
				t.Fatal(err)
			}
		} else {
			testenv.WaitFor(t, 10*time.Second, "the earlier holder's lease to run out", func() bool {
				rec, err := e.g.Get(ctx, key)
				return err == nil && rec.State == guard.StatePending && rec.LeaseLeft == 0
			})
		}
	}
	b := &passes{consumer: "b"}
	e.rdb.AddHook(b)
	dead := &deadLetters{}
	bc := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		// MinIdle, how long b waits for a claim of an entry found deleted
		// with no live holder, is far longer than a's claim takes; Redis 7
		// names deleted entries whatever it is.
		Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: 5 * time.Second, ClaimEvery: 10 * time.Millisecond,
			Process: consumerx.Options{DeadLetter: dead.hook}})
	stopA := e.run(a)
	<-gate.read // a has read 1-1 and not claimed it
	stopB := deleteThenReclaim(t, e, stream, bc, b)
	close(gate.open)
	testenv.WaitFor(t, 10*time.Second, "a's effect completed", func() bool {
		rec, err := e.g.Get(ctx, key)
		return err == nil && rec.State == guard.StateCompleted
	})
	b.wait(t, 2)
	stopB()
	stopA()
	if n := ran.Load(); n != 1 {
		t.Fatalf("effect ran %d times, want 1", n)
	}
	if n := dead.len(); n != 0 {
		t.Errorf("dead-lettered %v (%v); its effect completed", dead.ids, dead.causes)
	}
}

// readGate holds consumer's first XREADGROUP that hands it entries, once
// answered, until open is closed (or the command's context ends); read is
// closed when it holds it.
type readGate struct {
	consumer   string
	read, open chan struct{}
	once       sync.Once
}

func (h *readGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *readGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		xr, ok := cmd.(*redis.XStreamSliceCmd)
		if args := cmd.Args(); !ok || cmd.Name() != "xreadgroup" || len(args) < 4 || args[3] != h.consumer || err != nil || len(xr.Val()) == 0 {
			return err
		}
		h.once.Do(func() {
			close(h.read)
			select {
			case <-h.open:
			case <-ctx.Done():
			}
		})
		return err
	}
}
func (h *readGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The holder of a deleted entry, its lease run out, completes it between
// the consumer's read of its record and the consumer's failing it in the
// holder's name: the failure is refused (the record is completed), and
// the consumer learns the effect completed (Replay: no dead letter);
// likewise, when another claim holds the key by then, that it is held
// (InProgress).
func TestDeletedEntryTakeOverRacingTheHoldersLateCompletion(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "b"})
	short := guard.New(e.g.Store(), guard.Options{Lease: time.Second})
	for _, then := range []struct {
		name string
		race func(t *testing.T, key guard.Key, held guard.Lease)
		want guard.Status
	}{
		{"completed", func(t *testing.T, _ guard.Key, held guard.Lease) {
			if err := short.Complete(ctx, held, nil); err != nil {
				t.Fatalf("the holder's late completion: %v", err)
			}
		}, guard.Replay},
		{"claimed again", func(t *testing.T, key guard.Key, _ guard.Lease) {
			if out, err := e.g.Claim(ctx, key, defaultFingerprint("charge 1")); err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim = %+v, %v", out, err)
			}
		}, guard.InProgress},
	} {
		t.Run(then.name, func(t *testing.T) {
			msg := consumerx.Message{ID: ID(stream, "1-"+then.name)}
			key, err := c.Processor().Key(msg)
			if err != nil {
				t.Fatal(err)
			}
			held, err := short.Claim(ctx, key, defaultFingerprint("charge 1"))
			if err != nil || held.Status != guard.Acquired {
				t.Fatalf("claim = %+v, %v", held, err)
			}
			var rec guard.Record
			testenv.WaitFor(t, 10*time.Second, "the holder's lease to run out", func() bool {
				rec, err = e.g.Get(ctx, key)
				return err == nil && rec.State == guard.StatePending && rec.LeaseLeft == 0
			})
			then.race(t, key, held.Lease)
			out, err := c.takeOver(ctx, msg, rec)
			if err != nil || out.Status != then.want {
				t.Errorf("takeOver = %+v, %v; want %s", out, err, then.want)
			}
		})
	}
}

// failLastAttempt claims msg's record as a consumer running its last
// attempt would (payload its fingerprint's) and fails it: the holder has
// not dead-lettered it yet.
func (e *env) failLastAttempt(t *testing.T, c *Consumer, msg consumerx.Message, payload string) {
	t.Helper()
	ctx := context.Background()
	key, err := c.Processor().Key(msg)
	if err != nil {
		t.Fatal(err)
	}
	held, err := e.g.Claim(ctx, key, defaultFingerprint(payload))
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", held, err)
	}
	if err := e.g.Fail(ctx, held.Lease, errors.New("card declined")); err != nil {
		t.Fatal(err)
	}
}
