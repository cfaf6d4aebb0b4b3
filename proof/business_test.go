package proof

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// bank is the business side of the tests: a PostgreSQL table with no
// unique constraint, one row per effect, written in the same transaction
// as the backstop row. Counting its rows counts effects.
type bank struct {
	db  *sql.DB
	dsn string
	b   *backstop.Backstop
}

const businessTable = `CREATE TABLE IF NOT EXISTS business (
	scope text NOT NULL, id text NOT NULL, fence bigint NOT NULL, token text NOT NULL,
	value text NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`

// newBank creates the backstop tables and the business table in a schema
// of the test's own.
func newBank(t testing.TB) *bank {
	t.Helper()
	db, dsn := testenv.Postgres(t)
	return openBank(t, db, dsn, true)
}

func openBank(t testing.TB, db *sql.DB, dsn string, migrate bool) *bank {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if migrate {
		if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if _, err := db.ExecContext(ctx, businessTable); err != nil {
			t.Fatalf("business table: %v", err)
		}
	}
	b, err := backstop.New(db, pgstore.Options{TTL: time.Hour})
	if err != nil {
		t.Fatalf("backstop: %v", err)
	}
	return &bank{db: db, dsn: dsn, b: b}
}

// effect is the business effect for key: it inserts a business row and
// commits the backstop row in the same transaction, and returns a value
// naming the execution. If the key was committed before, the transaction
// rolls back and the stored value is returned.
func (k *bank) effect(fingerprint string, pid int) guard.Func {
	return k.b.Func(fingerprint, func(ctx context.Context, tx *sql.Tx, lease guard.Lease) ([]byte, error) {
		v := fmt.Sprintf("%s@%d/%s/%d", lease.Key.ID, lease.Fence, short(lease.Token), pid)
		_, err := tx.ExecContext(ctx, `INSERT INTO business (scope, id, fence, token, value, pid) VALUES ($1, $2, $3, $4, $5, $6)`,
			lease.Key.Scope, lease.Key.ID, lease.Fence, lease.Token, v, pid)
		if err != nil {
			return nil, err
		}
		return []byte(v), nil
	})
}

// rows returns, per key ID of scope, the values of its business rows.
func (k *bank) rows(t testing.TB, scope string) map[string][]string {
	t.Helper()
	rs, err := k.db.Query(`SELECT id, value FROM business WHERE scope = $1 ORDER BY at`, scope)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	m := map[string][]string{}
	for rs.Next() {
		var id, v string
		if err := rs.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		m[id] = append(m[id], v)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// settle runs Do on key until it answers with a value (fresh or
// replayed), waiting out other holders' leases. It fails the test if that
// takes longer than limit (it may be called from any goroutine).
func settle(t testing.TB, ctx context.Context, g *guard.Guard, key guard.Key, fp string, fn guard.Func, limit time.Duration) guard.Result {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		res, err := g.Do(ctx, key, fp, fn)
		if err == nil {
			return res
		}
		if time.Now().After(deadline) {
			t.Errorf("%s did not settle within %s: %v", key, limit, err)
			return res
		}
		wait := 5 * time.Millisecond
		var ip *guard.InProgressError
		if errors.As(err, &ip) {
			wait = ip.RetryAfter + time.Millisecond // waiting for another holder's lease to pass
		}
		time.Sleep(wait)
	}
}
