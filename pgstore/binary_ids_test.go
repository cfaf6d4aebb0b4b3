package pgstore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestHelpersTakeAnyBytes: the helpers that share the Store's tables take
// text of any bytes, as the keys table does (StoredText): a message ID
// that is not UTF-8 or holds a NUL byte (a raw Kafka key, a binary
// Nats-Msg-Id) is consumed once, not refused on every delivery with
// SQLSTATE 22021 (a message that could never be handled); a delivery's
// failure reason quoting such bytes (a response body cut mid-rune) ends
// the delivery, which otherwise stayed pending.
func TestHelpersTakeAnyBytes(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	for _, id := range []string{"\x00\xff", "\xe2\x82", "\x01" + "AP8="} {
		for i, want := range []bool{true, false} {
			ran, err := s.Consume(ctx, "g\xff", id, func(context.Context, *sql.Tx) error { return nil })
			if err != nil || ran != want {
				t.Fatalf("consume %q #%d = %t, %v; want %t", id, i+1, ran, err, want)
			}
		}
	}
	d, err := s.InsertOrRetry(ctx, db, "invoice.paid", "inv_\xff", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.InsertOrRetry(ctx, db, "invoice.paid", "inv_\xff", nil); err != nil || again.ID != d.ID || again.Attempts != 2 || again.RefID != "inv_\xff" {
		t.Fatalf("retry of a pending delivery with a binary ref = %+v, %v; want attempt 2 on row %d", again, err, d.ID)
	}
	if err := s.MarkDeliveryFailed(ctx, db, d.ID, "502: upstream said \xe2\x82"); err != nil {
		t.Fatalf("failure reason of bytes that are not UTF-8: %v", err)
	}
	var status string
	if err := db.QueryRowContext(ctx, `SELECT status FROM idemguard_webhook_deliveries WHERE id = $1`, d.ID).Scan(&status); err != nil || status != pgstore.DeliveryFailed {
		t.Fatalf("delivery = %q, %v; want failed", status, err)
	}
}
