package pgstore_test

import (
	"sync"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

func TestInsertOrRetry(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := pgenv.Store(t, db, pgstore.Options{})
	first, err := b.InsertOrRetry(ctx, db, "invoice.paid", "inv_1", []byte(`{"v":1}`))
	if err != nil || !first.Inserted || first.Attempts != 1 || first.Status != pgstore.DeliveryPending {
		t.Fatalf("first = %+v, %v", first, err)
	}
	second, err := b.InsertOrRetry(ctx, db, "invoice.paid", "inv_1", []byte(`{"v":2}`))
	if err != nil || second.Inserted || second.Attempts != 2 || second.ID != first.ID {
		t.Fatalf("second pending delivery = %+v, %v; want attempt 2 on row %d", second, err, first.ID)
	}
	other, err := b.InsertOrRetry(ctx, db, "invoice.paid", "inv_2", nil)
	if err != nil || !other.Inserted || other.ID == first.ID {
		t.Fatalf("another ref = %+v, %v", other, err)
	}
	var rows, attempts int
	var payload string
	if err := db.QueryRowContext(ctx, `SELECT count(*), max(attempt_count), max(convert_from(payload, 'UTF8'))
		FROM idemguard_webhook_deliveries WHERE ref_id = 'inv_1'`).Scan(&rows, &attempts, &payload); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || attempts != 2 || payload != `{"v":2}` {
		t.Fatalf("inv_1: %d rows, %d attempts, payload %s", rows, attempts, payload)
	}

	// Once delivered, the same event is a new delivery.
	if err := b.MarkDelivered(ctx, db, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.MarkDelivered(ctx, db, first.ID); err == nil {
		t.Fatal("delivering a delivered row succeeded")
	}
	again, err := b.InsertOrRetry(ctx, db, "invoice.paid", "inv_1", nil)
	if err != nil || !again.Inserted || again.Attempts != 1 || again.ID == first.ID {
		t.Fatalf("after delivery = %+v, %v; want a new row", again, err)
	}
	if err := b.MarkDeliveryFailed(ctx, db, again.ID, "410 Gone"); err != nil {
		t.Fatal(err)
	}

	// Concurrent duplicates: one row, every call counted.
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.InsertOrRetry(ctx, db, "order.shipped", "ord_9", nil); err != nil {
				t.Errorf("InsertOrRetry: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := db.QueryRowContext(ctx, `SELECT count(*), max(attempt_count) FROM idemguard_webhook_deliveries WHERE ref_id = 'ord_9'`).Scan(&rows, &attempts); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || attempts != n {
		t.Fatalf("concurrent duplicates: %d rows, %d attempts; want 1, %d", rows, attempts, n)
	}
	if _, err := b.InsertOrRetry(ctx, db, "", "x", nil); err == nil {
		t.Fatal("InsertOrRetry with an empty event type succeeded")
	}
}
