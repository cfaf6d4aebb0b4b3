package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/internal/pgsql"
)

// Webhook delivery states.
const (
	DeliveryPending   = "pending"   // queued; InsertOrRetry counts retries on it
	DeliveryDelivered = "delivered" // ended by MarkDelivered
	DeliveryFailed    = "failed"    // ended by MarkDeliveryFailed
)

// Delivery is a row of the webhook deliveries table as InsertOrRetry
// leaves it.
type Delivery struct {
	ID        int64
	EventType string
	RefID     string
	Status    string // DeliveryPending after InsertOrRetry
	Attempts  int    // 1 for a new delivery, +1 for every retry while pending
	Inserted  bool   // true when this call created the row
}

// InsertOrRetry queues a webhook delivery of eventType for refID. While a
// delivery for the same (eventType, refID) is pending, it inserts nothing:
// it counts one more attempt on the pending row and replaces its payload.
// A call whose reply was lost answers an error matching
// guard.ErrUnavailable; it is never sent again behind the caller's back.
// Delivered and failed rows are history: a new event after them is a new
// delivery. eventType and refID may be any bytes: they are kept as
// StoredText keeps them (and returned in the Delivery as given), in a
// unique index whose entries PostgreSQL limits to 2704 bytes after
// compression: a pair too long for it is refused as MarkConsumed's is.
func (s *Store) InsertOrRetry(ctx context.Context, q Querier, eventType, refID string, payload []byte) (Delivery, error) {
	if q == nil {
		return Delivery{}, errors.New("pgstore: InsertOrRetry: nil Querier")
	}
	if eventType == "" || refID == "" {
		return Delivery{}, fmt.Errorf("pgstore: event type %q and ref id %q must not be empty", eventType, refID)
	}
	q, done, err := single(ctx, q)
	if err != nil {
		return Delivery{}, dbErr(ctx, "insert or retry", err)
	}
	defer done()
	d := Delivery{EventType: eventType, RefID: refID}
	err = own(ctx, q, func() error {
		return q.QueryRowContext(ctx, `INSERT INTO `+s.t.Webhooks+` AS w (event_type, ref_id, payload)
		VALUES ($1, $2, $3)
		ON CONFLICT (event_type, ref_id) WHERE status = 'pending'
		DO UPDATE SET attempt_count = w.attempt_count + 1, payload = EXCLUDED.payload, updated_at = now()
		WHERE w.status = 'pending'
		RETURNING id, status, attempt_count, xmax = 0`, StoredText(eventType), StoredText(refID), payload).
			Scan(&d.ID, &d.Status, &d.Attempts, &d.Inserted)
	})
	if err != nil {
		return Delivery{}, dbErr(ctx, "insert or retry", err)
	}
	return d, nil
}

// MarkDelivered ends the pending delivery id as delivered. A delivery that
// is not pending gives an error. One whose reply was lost answers an error matching
// guard.ErrUnavailable (it may have been ended).
func (s *Store) MarkDelivered(ctx context.Context, q Querier, id int64) error {
	return s.endDelivery(ctx, q, id, DeliveryDelivered, "")
}

// MarkDeliveryFailed ends the pending delivery id as failed with reason
// (any bytes, kept as StoredText keeps them); a later InsertOrRetry for
// the same event starts a new delivery.
func (s *Store) MarkDeliveryFailed(ctx context.Context, q Querier, id int64, reason string) error {
	return s.endDelivery(ctx, q, id, DeliveryFailed, reason)
}

func (s *Store) endDelivery(ctx context.Context, q Querier, id int64, status, reason string) error {
	if q == nil {
		return errors.New("pgstore: nil Querier")
	}
	q, done, err := single(ctx, q)
	if err != nil {
		return dbErr(ctx, "end delivery", err)
	}
	defer done()
	var got int64
	err = own(ctx, q, func() error {
		return q.QueryRowContext(ctx, `UPDATE `+s.t.Webhooks+` SET status = $2, last_error = $3, updated_at = now()
		WHERE id = $1 AND status = 'pending' RETURNING id`, id, status, StoredText(reason)).Scan(&got)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("pgstore: webhook delivery %d is not pending", id)
	}
	return dbErr(ctx, "end delivery", err)
}

// single returns q, or when q is a *sql.DB one of its connections (call
// done when finished with it). database/sql sends a statement made on a
// *sql.DB again, on another connection, when the driver reports the first
// one bad after sending it (lib/pq does when the reply is lost); a write
// that is not idempotent is then made twice, or refused for what it did
// itself. On a *sql.Conn a lost reply is an error (guard.ErrUnavailable):
// the outcome is unknown, and nothing is sent again.
func single(ctx context.Context, q Querier) (_ Querier, done func(), _ error) {
	db, ok := q.(*sql.DB)
	if !ok {
		return q, func() {}, nil
	}
	c, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c, func() { _ = c.Close() }, nil
}

// own runs a statement made on q, which single returned: when q is a
// connection (the caller passed a *sql.DB, whose connection single
// chose, or a *sql.Conn), the statement is a transaction of its own, and one refused with a
// serialization failure or a deadlock (a database whose default isolation
// is REPEATABLE READ or SERIALIZABLE) changed nothing and is run again, as
// the Store's own statements are (pgsql.RetryLostRace). In the caller's
// transaction it is run once: that transaction is aborted, and the caller
// must begin it again.
func own(ctx context.Context, q Querier, run func() error) error {
	if _, ok := q.(*sql.Conn); ok {
		return pgsql.RetryLostRace(ctx, run)
	}
	return run()
}
