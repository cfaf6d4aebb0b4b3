package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// The demo's consumer storm: a Redis Stream with duplicates, consumed by
// a group through consumerx.
type consumerStats struct {
	deliveries, processed, duplicates, inProgress, other int64
	effects, distinct                                    int64
}

func consumerStorm(ctx context.Context, c demoConfig, rdb *redis.Client, prefix string, g *guard.Guard,
	bs *backstop.Backstop, effects *demoEffects, logger *slog.Logger, prog *progress, dups int) (consumerStats, error) {
	var st consumerStats
	stream := prefix + "orders"
	entries := c.messages + dups
	// Every message once; a duplicate (the same message id and payload, as a
	// producer retrying after a lost reply sends it) follows its original a
	// few entries later, so both are in flight on different consumers.
	order := make([]int, 0, entries)
	dupAfter := make(map[int][]int, dups) // original index → duplicates sent after it
	for j := range dups {
		id := j * c.messages / dups
		at := min(id+3, c.messages-1)
		dupAfter[at] = append(dupAfter[at], id)
	}
	for id := range c.messages {
		order = append(order, id)
		order = append(order, dupAfter[id]...)
	}
	for start := 0; start < len(order); start += 500 {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range order[start:min(start+500, len(order))] {
				p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
					"msg_id", "msg-" + effects.run + "-" + strconv.Itoa(id), "payload", "ship order " + strconv.Itoa(id)}})
			}
			return nil
		})
		if err != nil {
			return st, fmt.Errorf("consumer: XADD: %w", err)
		}
	}

	fingerprint := func(m consumerx.Message) string {
		sum := sha256.Sum256(m.Payload)
		return hex.EncodeToString(sum[:])
	}
	var deliveries, processed, duplicates, inProgress, other, acked atomic.Int64
	var effectErr atomic.Value
	var ackedMu sync.Mutex
	ackedIDs := make(map[string]struct{}, entries)
	handler := func(ctx context.Context, m consumerx.Message) error {
		key := m.Metadata["msg_id"]
		// The effect's work, then its write. Both stop when ctx ends:
		// consumerx ends it when the lease is lost, before another
		// consumer can take the key (docs/design.md, section 4), and the
		// message must not be handled then; the error leaves it to be
		// delivered again.
		run := func(ctx context.Context, q interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		}) error {
			if !wait.For(ctx, c.work) {
				return context.Cause(ctx)
			}
			if err := effects.record(ctx, q, "consumer", key); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				effectErr.Store(err)
				return err
			}
			return nil
		}
		if bs == nil {
			return run(ctx, nil)
		}
		// With PostgreSQL: the effect and the backstop row commit together.
		lease, _ := consumerx.LeaseFrom(ctx)
		tx, err := bs.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := run(ctx, tx); err != nil {
			return err
		}
		if err := bs.Commit(ctx, tx, lease, fingerprint(m), nil); err != nil {
			if errors.Is(err, backstop.ErrAlreadyCommitted) {
				return nil // committed before: roll this one back
			}
			return err
		}
		return tx.Commit()
	}
	opts := redisstream.Options{
		Logger: logger,
		Process: consumerx.Options{
			Fingerprint: fingerprint,
			Logger:      logger,
			OnOutcome: func(_ context.Context, m consumerx.Message, o consumerx.Outcome, _ error) {
				deliveries.Add(1)
				switch o {
				case consumerx.Processed:
					processed.Add(1)
				case consumerx.Duplicate:
					duplicates.Add(1)
				case consumerx.InProgress:
					inProgress.Add(1)
				default:
					other.Add(1)
				}
				// An entry may be delivered again after it was acknowledged
				// (reclaimed while its first consumer still ran it): count
				// each entry once.
				if o.Ack() {
					ackedMu.Lock()
					_, seen := ackedIDs[m.ID]
					ackedIDs[m.ID] = struct{}{}
					ackedMu.Unlock()
					if !seen {
						acked.Add(1)
						prog.add(1)
					}
				}
			},
		},
	}
	demoConsumer(&opts, stream, c)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	runErrs := make(chan error, c.consumers)
	for i := range c.consumers {
		o := opts
		o.Consumer = "consumer-" + strconv.Itoa(i)
		cons, err := redisstream.New(rdb, g, handler, o)
		if err != nil {
			return st, fmt.Errorf("consumer: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cons.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				runErrs <- err
			}
		}()
	}
	// Wait until every entry was acknowledged (polling the count, with a deadline).
	deadline := time.Now().Add(45 * time.Second)
	var waitErr error
	for acked.Load() < int64(entries) {
		if time.Now().After(deadline) {
			waitErr = fmt.Errorf("consumer: only %d of %d entries acknowledged after 45s", acked.Load(), entries)
			break
		}
		if v := effectErr.Load(); v != nil {
			waitErr = fmt.Errorf("consumer: business effect: %w", v.(error))
			break
		}
		select {
		case err := <-runErrs:
			waitErr = fmt.Errorf("consumer: %w", err)
		case <-ctx.Done():
			waitErr = ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if waitErr != nil {
			break
		}
	}
	stop()
	wg.Wait()
	if waitErr != nil {
		return st, waitErr
	}
	st.deliveries, st.processed, st.duplicates, st.inProgress, st.other =
		deliveries.Load(), processed.Load(), duplicates.Load(), inProgress.Load(), other.Load()
	var err error
	st.effects, st.distinct, err = effects.count(ctx, "consumer")
	return st, err
}

// demoConsumer sets what makes o one of the demo's consumers of stream:
// group "billing", each order message deduplicated by its msg_id field.
// `idemguard inventory` lists the same group.
func demoConsumer(o *redisstream.Options, stream string, c demoConfig) {
	o.Stream, o.Group, o.Block, o.Count = stream, "billing", 100*time.Millisecond, 4
	// An entry left pending (its key in progress on another consumer)
	// comes back soon after that holder should be done, not a lease
	// later: the guard answers the redelivery (a replay, acknowledged, or
	// in progress still, left pending again), so coming back early costs
	// a claim, never a second effect. With MinIdle at the lease (10 s)
	// the demo sat at 75% for ten seconds.
	o.MinIdle, o.ClaimEvery = min(c.lease, max(2*c.work, 500*time.Millisecond)), 100*time.Millisecond
	o.Process.Key = func(m consumerx.Message) (string, error) { return m.Metadata["msg_id"], nil }
	o.Process.MessageType = "order (Redis stream)"
}
