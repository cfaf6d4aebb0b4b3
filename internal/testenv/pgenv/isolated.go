package pgenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// Isolated is a migrated database of its own: direct at the server's
// default isolation, db (closed at t's end) with level as its
// default_transaction_isolation, and a wait for one of db's statements to
// be blocked on a lock (another transaction's row).
func Isolated(t *testing.T, level string) (direct, db *sql.DB, waitLocked func(what string)) {
	t.Helper()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(context.Background(), direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testenv.DSNWithIsolation(t, dsn, level))
	if err != nil {
		t.Fatal(err)
	}
	app := "isolated-" + strings.ToLower(rand.Text()[:8])
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	db, err = sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return direct, db, func(what string) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, what, func() bool {
			var n int
			err := direct.QueryRowContext(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
			return err == nil && n > 0
		})
	}
}
