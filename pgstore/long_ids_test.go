package pgstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/sqlstate"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestLongIDsRefusedClearly: a consumed message's group and id, and a
// webhook delivery's event type and reference, are kept in a unique index,
// whose entries PostgreSQL limits to 2704 bytes after compression. A pair
// too long for it (4,000 random bytes) is refused with the server's error
// (54000, program_limit_exceeded), not unavailable (no retry makes it fit),
// saying what to do; nothing runs and nothing is kept. A long id that
// compresses (100,000 repeated bytes) is kept. The docs said "any bytes"
// and the error said only "index row size 5360 exceeds btree version 4
// maximum 2704 for index …".
func TestLongIDsRefusedClearly(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	long := rand.Text()
	for len(long) < 4000 {
		long += rand.Text()
	}
	want := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s of a 4,000-byte id: no error", what)
		case errors.Is(err, guard.ErrUnavailable):
			t.Errorf("%s of a 4,000-byte id = %v; not unavailable: no retry makes it fit", what, err)
		case !hasCode(err, "54000") || !strings.Contains(err.Error(), "digest"):
			t.Errorf("%s of a 4,000-byte id = %v; want the server's 54000 and what to do (pass a digest)", what, err)
		}
	}
	ran := false
	_, err := s.Consume(ctx, "g", long, func(context.Context, *sql.Tx) error { ran = true; return nil })
	want("Consume", err)
	if ran {
		t.Error("Consume ran its handler for an id it could not keep")
	}
	_, err = s.InsertOrRetry(ctx, db, "ev", long, []byte("p"))
	want("InsertOrRetry", err)
	for _, table := range []string{"idemguard_consumed_messages", "idemguard_webhook_deliveries"} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s holds %d rows (%v); want none", table, n, err)
		}
	}
	repeated := strings.Repeat("a", 100000)
	if ran, err := s.Consume(ctx, "g", repeated, func(context.Context, *sql.Tx) error { return nil }); !ran || err != nil {
		t.Errorf("Consume of a 100,000-byte id that compresses = %v, %v; want it run", ran, err)
	}
}

func hasCode(err error, code string) bool {
	c, _ := sqlstate.Code(err)
	return c == code
}
