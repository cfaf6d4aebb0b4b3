package consumerx_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// The guard alone cannot tell a consumer that died between its effect and
// the recording of its completion from one that never ran: once the lease
// is over the message runs again. With the consumed-messages row written
// in the effect's own transaction (pgstore.Store.Consume), the second run finds it
// and the effect still happens once.
func TestBackstopCatchesDeathBeforeCompletion(t *testing.T) {
	db, _ := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (order_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	bs, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: time.Second})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	handler := func(ctx context.Context, msg consumerx.Message) error {
		_, err := bs.Consume(ctx, p.Group(), msg.ID, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (order_id) VALUES ($1)`, msg.ID)
			return err
		})
		return err
	}

	// Consumer A claims the message, makes its effect and dies before the
	// guard records the completion.
	key, err := p.Key(order)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Claim(ctx, key, defaultFingerprint(order)); err != nil {
		t.Fatal(err)
	}
	if err := handler(ctx, order); err != nil {
		t.Fatal(err)
	}

	// The redelivery waits while A's lease lives, then runs as attempt 2.
	var lease guard.Lease
	var o consumerx.Outcome
	testenv.WaitFor(t, 10*time.Second, "A's lease to end", func() bool {
		o, err = p.Process(ctx, order, func(ctx context.Context, msg consumerx.Message) error {
			lease, _ = consumerx.LeaseFrom(ctx)
			return handler(ctx, msg)
		})
		return o != consumerx.InProgress
	})
	if o != consumerx.Processed || err != nil || lease.Attempt != 2 || !lease.Recovered {
		t.Fatalf("redelivery: %s, %v, lease %+v; want processed as recovered attempt 2", o, err, lease)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("ledger has %d rows, want 1", n)
	}
}
