package redisstream

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// consumerx.Options.DeadLetter: "Its ctx carries the lease of that
// dead-letter record (LeaseFrom, when the call is deduplicated): a
// DeadLetter that does several things records each with guard.Step, so
// that a retry does not repeat the ones done." redisstream sends an
// entry's dead letter under the entry's own record, which both the
// consumerx path (attempts ran out) and the deleted path (ErrDeleted)
// claim, so that it goes out once whichever path comes first.
//
// Here the user's DeadLetter pages someone (a step), then fails on its
// second step. The entry is trimmed before its redelivery, so the retry
// of dead-lettering comes from the deleted path. That retry must not page
// again: the step done must be found. Before, the first call's steps
// were recorded under consumerx's fingerprint record, and the deleted
// path handed the DeadLetter no lease at all (LeaseFrom false), though the
// call was deduplicated.
func TestDeadLetterStepsSurviveDeletedPathRetry(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var (
		mu       sync.Mutex
		calls    int
		noLease  int
		paged    int
		stepErrs []error
	)
	page := func(context.Context) (string, error) {
		mu.Lock()
		paged++
		mu.Unlock()
		return "paged", nil
	}
	declined := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b",
		Process: consumerx.Options{DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			lease, ok := consumerx.LeaseFrom(ctx)
			if !ok {
				// An undeduplicated call: nothing to record the step in.
				mu.Lock()
				noLease++
				mu.Unlock()
				_, _ = page(ctx)
			} else if _, err := guard.Step(ctx, lease, "page", page); err != nil {
				mu.Lock()
				stepErrs = append(stepErrs, err)
				mu.Unlock()
				return err
			}
			if n == 1 {
				return errors.New("ticket system down") // the second step fails
			}
			return nil
		}}})
	msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"payload": "charge 1"}})

	// Its only attempt fails; the dead letter pages, then fails.
	if o, err := c.Processor().Process(ctx, msg, declined); o != consumerx.Failed {
		t.Fatalf("Process = %s, %v; want %s (the DeadLetter failed)", o, err, consumerx.Failed)
	}
	// The entry is trimmed before it is delivered again: the consumer's
	// next XAUTOCLAIM names it deleted, its record failed with its
	// attempts spent, and dead-letters it at once.
	c.deleted(ctx, []string{"1-1"})

	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("DeadLetter called %d times, want 2 (the failed call and the deleted path's retry)", calls)
	}
	if paged != 1 || noLease != 0 || len(stepErrs) != 0 {
		t.Errorf("the page step ran %d times (calls without a lease: %d, step errors: %v); want once: the retry finds the step done",
			paged, noLease, stepErrs)
	}
	if n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result(); err != nil || n != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), want 1", n, err)
	}
}

// The deleted path alone: a pending entry trimmed with its record failed
// and its attempts spent is dead-lettered with ErrDeleted under the
// entry's record (deduplicated), and a DeadLetter written as
// consumerx.Options.DeadLetter says (its steps under LeaseFrom(ctx)) gets
// that record's lease. It got none: guard.Step refused the zero lease, the
// DeadLetter failed every time, and the entry, already dropped from the
// pending list by Redis, was never dead-lettered to the user.
func TestDeletedPathDeadLetterHasLease(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var (
		mu   sync.Mutex
		oks  []bool
		errs []error
	)
	declined := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b",
		Process: consumerx.Options{DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			lease, ok := consumerx.LeaseFrom(ctx)
			_, err := guard.Step(ctx, lease, "page", func(context.Context) (int, error) { return 1, nil })
			mu.Lock()
			oks, errs = append(oks, ok), append(errs, err)
			mu.Unlock()
			return err
		}}})
	msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"payload": "charge 1"}})
	e.failLastAttempt(t, c, msg, "charge 1") // its last attempt failed; its holder died
	c.deleted(ctx, []string{"1-1"})
	mu.Lock()
	defer mu.Unlock()
	if len(oks) != 1 || !oks[0] || errs[0] != nil {
		t.Errorf("DeadLetter on the deleted path: LeaseFrom ok = %v, Step errors = %v; want one call, with the entry record's lease, its step recorded", oks, errs)
	}
}

// Options.DeadLetterStream: "An entry is added once, though both happen
// to it (its last attempt fails while it is deleted): see ErrDeleted." With
// Options.Process.Key set the deleted path cannot read the entry's record
// and dead-letters it at once (documented), but the entry's own
// dead-letter record, named by the entry id alone, is known on both paths
// all the same. entryDeadKey gave it up with Key set, so the entry whose
// last attempt failed while it was trimmed was added to the dead-letter
// stream twice and DeadLetter called twice.
func TestKeyedEntryDeletedWhileLastAttemptFailsAddedOnce(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var (
		mu    sync.Mutex
		calls int
	)
	running, trimmed := make(chan struct{}), make(chan struct{})
	declined := func(context.Context, consumerx.Message) error {
		close(running)
		<-trimmed // the entry is trimmed while its last attempt runs
		return errors.New("card declined")
	}
	c := e.consumer(declined, Options{Stream: stream, Group: "billing", Consumer: "b",
		Process: consumerx.Options{Key: keyField, DeadLetter: func(context.Context, consumerx.Message, error) error {
			mu.Lock()
			calls++
			mu.Unlock()
			return nil
		}}})
	msg := c.message(redis.XMessage{ID: "1-1", Values: map[string]any{"mid": "order-1", "payload": "charge 1"}})
	done := make(chan consumerx.Outcome, 1)
	go func() {
		o, _ := c.Processor().Process(ctx, msg, declined)
		done <- o
	}()
	<-running
	// Another consumer's XAUTOCLAIM names the entry deleted.
	c.deleted(ctx, []string{"1-1"})
	close(trimmed)
	if o := <-done; o != consumerx.DeadLettered {
		t.Fatalf("the holder's last attempt: %s, want %s", o, consumerx.DeadLettered)
	}
	mu.Lock()
	defer mu.Unlock()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil || n != 1 || calls != 1 {
		t.Errorf("dead-letter stream has %d entries (%v), DeadLetter called %d times; want the entry added once, DeadLetter called once", n, err, calls)
	}
}
