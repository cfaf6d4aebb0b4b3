package occ_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/idemguard/idemguard/occ"
)

// binaryKey is an application's id type for a binary key (a hash, a
// UUID's 16 bytes), which database/sql passes as []byte.
type binaryKey []byte

// An id that is SQL NULL (nil, a nil pointer, an invalid sql.Null…, a nil
// byte slice of any []byte type, which lib/pq and pgx send as NULL) names
// no row: Write refuses it before any statement. On a table whose id is
// UNIQUE rather than PRIMARY KEY, where PostgreSQL takes NULLs as
// distinct, every such Write succeeded by inserting one more row no Read
// can find (an id from an unset optional field loses every write).
// Update and Read refuse it too.
func TestNullIDRefused(t *testing.T) {
	t.Parallel()
	db := database(t)
	mustExec(t, db, `CREATE TABLE occ_nullid (id text UNIQUE, value bytea, version bigint NOT NULL DEFAULT 1)`)
	tbl := occ.VectorTable{Name: "occ_nullid", Writer: "eu"}
	m, err := tbl.Migration()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, m.Up)
	var unset *string
	for _, id := range []any{nil, unset, sql.NullString{}, []byte(nil), binaryKey(nil)} {
		if _, err := tbl.Write(ctx, db, id, occ.Vector{}, []byte("v")); err == nil {
			t.Errorf("Write with id %#v (NULL) succeeded", id)
		}
		if _, err := tbl.Read(ctx, db, id); err == nil || errors.Is(err, occ.ErrNotFound) {
			t.Errorf("Read with id %#v (NULL) = %v, want a refusal, not ErrNotFound", id, err)
		}
		if _, err := (occ.VersionedTable{Name: "occ_nullid"}).Update(ctx, db, id, 1, map[string]any{"value": []byte("v")}); err == nil || occ.IsConflict(err) {
			t.Errorf("Update with id %#v (NULL) = %v, want a refusal, not a conflict", id, err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM occ_nullid`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written with a NULL id (%v), want none", n, err)
	}
}
