package pgstore_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

func TestConsumeOnce(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := pgenv.Store(t, db, pgstore.Options{})
	handle := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ('msg-1', 0)`)
		return err
	}
	// A failing handler keeps nothing: the message runs again later.
	boom := errors.New("boom")
	ran, err := b.Consume(ctx, "billing", "msg-1", func(ctx context.Context, tx *sql.Tx) error {
		if err := handle(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if ran || !errors.Is(err, boom) {
		t.Fatalf("failing handler = %v, %v", ran, err)
	}

	const n = 16
	var runs atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran, err := b.Consume(ctx, "billing", "msg-1", handle)
			if err != nil {
				t.Errorf("Consume: %v", err)
			}
			if ran {
				runs.Add(1)
			}
		}()
	}
	wg.Wait()
	if rows, _ := pgenv.CountPayments(t, db); runs.Load() != 1 || rows != 1 {
		t.Fatalf("%d deliveries ran %d times, %d effects; want 1", n, runs.Load(), rows)
	}
	// Another group consumes the same message id on its own.
	if ran, err := b.Consume(ctx, "audit", "msg-1", func(context.Context, *sql.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("other group = %v, %v", ran, err)
	}
	if _, err := b.Consume(ctx, "", "msg-1", handle); err == nil {
		t.Fatal("Consume with an empty group succeeded")
	}
}

// TestConsumedExpiry: a mark past its retention counts as absent.
func TestConsumedExpiry(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := pgenv.Store(t, db, pgstore.Options{})
	pgenv.Exec(t, db, `INSERT INTO idemguard_consumed_messages (consumer_group, message_id, expires_at)
		VALUES ('g', 'old', now() - interval '1 second'), ('g', 'live', now() + interval '1 hour')`)
	for id, want := range map[string]bool{"old": true, "live": false} {
		ran, err := b.Consume(ctx, "g", id, func(context.Context, *sql.Tx) error { return nil })
		if err != nil || ran != want {
			t.Errorf("Consume(%s) = %v, %v; want ran %v", id, ran, err, want)
		}
	}
}
