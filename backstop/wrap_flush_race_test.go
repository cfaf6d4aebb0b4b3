package backstop_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapFlushMidEffectRace: 16 goroutines race over one key at a time
// through Wrap, and Redis is flushed (FLUSHALL) from inside each
// effect's first two runs, the first of which then fails. Per key: the
// effect never runs beside another run of it, every run's fence is above
// every fence an earlier run had (Redis hands out fence 1 again after
// each flush), the payment is committed once, and every caller that got
// an answer got the committed receipt.
func TestWrapFlushMidEffectRace(t *testing.T) {
	t.Parallel()
	const keys, racers = 12, 16
	srv := testenv.StartRedis(t)
	client := srv.Client()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guard.NewRedisStore(client, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: 3 * time.Second})
	prefix := rand.Text()[:6]

	for k := range keys {
		key := guard.Key{Scope: "pay", ID: fmt.Sprintf("%s-%d", prefix, k)}
		var (
			mu       sync.Mutex
			inflight int
			runs     int
			fences   []int64
		)
		fn := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			mu.Lock()
			inflight++
			runs++
			run := runs
			if inflight > 1 {
				t.Errorf("key %d: run %d (fence %d) beside another run", k, run, l.Fence)
			}
			if n := len(fences); n > 0 && l.Fence <= fences[n-1] {
				t.Errorf("key %d: run %d has fence %d, not above the earlier runs' %v", k, run, l.Fence, fences)
			}
			fences = append(fences, l.Fence)
			mu.Unlock()
			defer func() { mu.Lock(); inflight--; mu.Unlock() }()
			if run <= 2 {
				if err := client.FlushAll(context.WithoutCancel(ctx)).Err(); err != nil {
					t.Errorf("FLUSHALL: %v", err)
				}
			}
			if run == 1 {
				return nil, errors.New("declined")
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, key.String(), l.Fence)
			return []byte("receipt-" + key.ID), err
		})
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					res, err := g.Do(ctx, key, "fp", fn)
					if err == nil {
						if want := "receipt-" + key.ID; string(res.Value) != want {
							t.Errorf("key %d answered %q, want %q", k, res.Value, want)
						}
						return
					}
					var busy *guard.InProgressError
					if errors.As(err, &busy) {
						time.Sleep(min(busy.RetryAfter, 50*time.Millisecond))
					}
					// Otherwise: the run that declined, a lease the flush
					// took, a stale fence: ask again, as a client would.
				}
				t.Errorf("key %d: no answer within 20 s", k)
			}()
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	if rows, distinct := pgenv.CountPayments(t, db); rows != keys || distinct != keys {
		t.Fatalf("payments = %d rows for %d keys, want %d for %d", rows, distinct, keys, keys)
	}
}
