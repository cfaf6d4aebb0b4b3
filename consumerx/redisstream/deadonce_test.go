package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// failFirstXAdd fails the first XADD to stream once consumerx's dead
// letter meets it being sent (inProgress): closing sending as it starts.
type failFirstXAdd struct {
	stream     string
	sending    chan struct{}
	inProgress <-chan struct{}
	n          *atomic.Int32
}

func (h failFirstXAdd) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failFirstXAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if addsTo(cmd, h.stream) && h.n.Add(1) == 1 {
			close(h.sending)
			select {
			case <-h.inProgress:
			case <-time.After(10 * time.Second):
			}
			err := errors.New("dead-letter stream unreachable")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h failFirstXAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A consumer finds an entry deleted, its last attempt failed, and starts
// sending its dead letter; the consumer that ran that attempt comes to
// dead-letter it (its attempts ran out) meanwhile and finds it being
// sent. The first send fails: the dead letter must still go out, once, for
// Redis has dropped the entry from the pending list and nothing will
// deliver it again.
func TestDeletedEntryDeadLetterFailsWhileHolderSendsItToo(t *testing.T) {
	inProgress := make(chan struct{})
	var once atomic.Bool
	obs := guard.ObserverFunc(func(_ context.Context, ev guard.Event) {
		if ev.Kind == guard.EventInProgress && strings.HasPrefix(ev.Key.ID, "entry:") && once.CompareAndSwap(false, true) {
			close(inProgress)
		}
	})
	e := newEnv(t, guard.Options{MaxAttempts: 1, Observer: obs})
	ctx := context.Background()
	stream := e.prefix + "orders"
	declined := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b"})
	msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"payload": "charge 1"}})
	// Its last attempt failed, and its holder has not yet dead-lettered it.
	e.failLastAttempt(t, c, msg, "charge 1")
	sending := make(chan struct{})
	e.rdb.AddHook(failFirstXAdd{stream: stream + DeadLetterSuffix, sending: sending, inProgress: inProgress, n: new(atomic.Int32)})
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		c.deleted(ctx, []string{"1-1"})
	}()
	select {
	case <-sending:
	case <-time.After(10 * time.Second):
		t.Fatal("the deleted entry's dead letter not sent")
	}
	o, perr := c.Processor().Process(ctx, msg, declined)
	<-answered
	c.recheck(ctx) // the next reclaim pass
	if n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1 (the holder's dead letter: %s, %v)", n, err, o, perr)
	}
}

// A DeadLetter that fails with an error of its own matching
// guard.ErrInProgress (it uses a guard too) is not taken for another
// consumer sending the entry's dead letter: it is not waited for and sent
// again within the delivery (the dead-letter stream's step would be asked
// twice in one attempt), but answered as consumerx answers it.
func TestDeadLetterOwnInProgressErrorNotWaitedFor(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var calls atomic.Int32
	declined := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b",
		Process: consumerx.Options{DeadLetter: func(context.Context, consumerx.Message, error) error {
			if calls.Add(1) > 3 {
				return nil
			}
			return fmt.Errorf("pager: %w", &guard.InProgressError{Key: guard.Key{Scope: "pager", ID: "x"}})
		}}})
	msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"payload": "charge 1"}})
	o, err := c.Processor().Process(ctx, msg, declined)
	// As consumerx answers its DeadLetter's error matching
	// guard.ErrInProgress: InProgress, the DeadLetter's own error.
	if n := calls.Load(); n != 1 || o != consumerx.InProgress || !strings.Contains(fmt.Sprint(err), "pager") {
		t.Errorf("DeadLetter called %d times, Process = %s, %v; want once, %s with its error", n, o, err, consumerx.InProgress)
	}
}

// addsTo reports whether cmd adds an entry to stream: an XADD, or the
// script that adds a dead letter (deadLetterScript), whose one key is
// the dead-letter stream.
func addsTo(cmd redis.Cmder, stream string) bool {
	args := cmd.Args()
	switch cmd.Name() {
	case "xadd":
		return len(args) > 1 && args[1] == stream
	case "evalsha", "eval":
		return len(args) > 3 && args[3] == stream
	}
	return false
}
