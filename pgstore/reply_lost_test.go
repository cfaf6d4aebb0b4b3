package pgstore_test

import (
	"errors"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWebhookReplyLost: a delivery write that PostgreSQL applied but
// whose reply was lost must not be applied again nor answered wrongly.
// lib/pq reports such a connection bad, and database/sql then sends the
// statement again on another connection: InsertOrRetry counted the retry
// twice, and MarkDelivered, finding the delivery no longer pending (by
// its own doing), said so as a plain error. Either call may answer
// guard.ErrUnavailable (the outcome is unknown); neither may do more.
func TestWebhookReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := pgproxy.New(t, dsn)
	s := pgenv.Store(t, db, pgstore.Options{})
	d, err := s.InsertOrRetry(ctx, db, "invoice.paid", "inv_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	row := func() (status string, attempts int) {
		t.Helper()
		if err := direct.QueryRowContext(ctx, `SELECT status, attempt_count FROM idemguard_webhook_deliveries WHERE id = $1`, d.ID).Scan(&status, &attempts); err != nil {
			t.Fatal(err)
		}
		return status, attempts
	}

	p.LoseReply("INSERT INTO")
	again, err := s.InsertOrRetry(ctx, db, "invoice.paid", "inv_1", nil)
	p.KeepReplies()
	if _, attempts := row(); attempts != 2 || p.Cuts() != 1 {
		t.Fatalf("one retry whose reply was lost (replies lost: %d) left attempt_count %d, want 2 (InsertOrRetry: %+v, %v)", p.Cuts(), attempts, again, err)
	}
	if err != nil && !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("InsertOrRetry whose reply was lost = %v; want nil or ErrUnavailable", err)
	}

	p.LoseReply("UPDATE")
	err = s.MarkDelivered(ctx, db, d.ID)
	p.KeepReplies()
	if status, _ := row(); status != pgstore.DeliveryDelivered || p.Cuts() != 2 {
		t.Fatalf("status %q after a MarkDelivered whose reply was lost (replies lost: %d); the test proves nothing", status, p.Cuts())
	}
	if err != nil && !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("MarkDelivered whose reply was lost = %v; want nil or ErrUnavailable, not a refusal of what it did itself", err)
	}
}
