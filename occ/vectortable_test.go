package occ_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// cartsTable creates an application table, adds the vector column with the
// package's migration, and returns a VectorTable for writer w.
func cartsTable(t testing.TB, db *sql.DB, w string) occ.VectorTable {
	t.Helper()
	mustExec(t, db, `CREATE TABLE occ_carts (id text PRIMARY KEY, items jsonb NOT NULL DEFAULT '[]')`)
	tbl := occ.VectorTable{Name: "occ_carts", ValueColumn: "items", Writer: w}
	m, err := tbl.Migration()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, m.Up)
	return tbl
}

func vec(t testing.TB, s string) occ.Vector {
	t.Helper()
	v, err := occ.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func items(t testing.TB, b []byte) []string {
	t.Helper()
	s, err := parseItems(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parseItems(b []byte) ([]string, error) {
	var s []string
	if b == nil {
		return nil, nil // a cart not yet written
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("items %q: %w", b, err)
	}
	slices.Sort(s)
	return s, nil
}

func itemsJSON(s []string) []byte {
	s = slices.Clone(s)
	slices.Sort(s)
	s = slices.Compact(s)
	b, _ := json.Marshal(s)
	return b
}

// mergeItems is the application's merge of two siblings: a cart keeps
// every item either version has.
func mergeItems(a, b []byte) ([]byte, error) {
	x, err := parseItems(a)
	if err != nil {
		return nil, err
	}
	y, err := parseItems(b)
	if err != nil {
		return nil, err
	}
	return itemsJSON(append(x, y...)), nil
}

func union(t testing.TB, a, b []byte) []byte {
	t.Helper()
	m, err := mergeItems(a, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestVectorWrite(t *testing.T) {
	t.Parallel()
	db := database(t)
	east := cartsTable(t, db, "us-east")
	west := east
	west.Writer = "eu-west"

	// Absent: read says so; a write on the empty vector creates the row.
	if v, err := east.Read(ctx, db, "c1"); !errors.Is(err, occ.ErrNotFound) || !v.Vector.IsZero() || v.Value != nil {
		t.Fatalf("Read of a missing row = %+v, %v", v, err)
	}
	v1, err := east.Write(ctx, db, "c1", occ.Vector{}, itemsJSON([]string{"apple"}))
	if err != nil || v1.String() != "us-east:1" {
		t.Fatalf("create = [%s], %v", v1, err)
	}
	// West saw it and writes on top: no conflict.
	r, err := west.Read(ctx, db, "c1")
	if err != nil || r.Vector.String() != "us-east:1" || !slices.Equal(items(t, r.Value), []string{"apple"}) {
		t.Fatalf("Read = %+v, %v", r, err)
	}
	v2, err := west.Write(ctx, db, "c1", r.Vector, itemsJSON([]string{"apple", "pear"}))
	if err != nil || v2.String() != "eu-west:1,us-east:1" {
		t.Fatalf("write on top = [%s], %v", v2, err)
	}
	// East writes on what it last saw (v1): concurrent with west's write.
	plum := itemsJSON([]string{"apple", "plum"})
	_, err = east.Write(ctx, db, "c1", v1, plum)
	var ce *occ.VectorConflictError
	if !errors.As(err, &ce) || !errors.Is(err, occ.ErrConflict) || !errors.Is(err, occ.ErrConcurrent) {
		t.Fatalf("stale write = %v, want a concurrent VectorConflictError", err)
	}
	if ce.Order != occ.Concurrent || ce.Base.String() != "us-east:1" || ce.Stored.String() != "eu-west:1,us-east:1" ||
		string(ce.Value) != string(plum) || !slices.Equal(items(t, ce.StoredValue), []string{"apple", "pear"}) ||
		ce.ID != "c1" || ce.Writer != "us-east" || ce.Table != "occ_carts" {
		t.Fatalf("conflict = %+v", ce)
	}
	if !strings.Contains(ce.Error(), "concurrent") {
		t.Errorf("Error() = %q", ce.Error())
	}
	// Merge the siblings and write the merge on MergedBase.
	merged := union(t, ce.StoredValue, ce.Value)
	v3, err := east.Write(ctx, db, "c1", ce.MergedBase(), merged)
	if err != nil || v3.String() != "eu-west:1,us-east:2" {
		t.Fatalf("merged write = [%s], %v", v3, err)
	}
	// The same write again (a retry whose reply was lost) is answered as done.
	if again, err := east.Write(ctx, db, "c1", ce.MergedBase(), merged); err != nil || again.Compare(v3) != occ.Equal {
		t.Fatalf("repeated write = [%s], %v", again, err)
	}
	// The same base with another value is a conflict (After-or-Equal, not concurrent).
	_, err = east.Write(ctx, db, "c1", ce.MergedBase(), itemsJSON([]string{"fig"}))
	if !errors.As(err, &ce) || errors.Is(err, occ.ErrConcurrent) || ce.Order != occ.Equal {
		t.Fatalf("same base, other value = %v", err)
	}
	// An even older base of the same writer: the row holds later writes of
	// it, so the stored vector is After the write's.
	_, err = east.Write(ctx, db, "c1", occ.Vector{}, itemsJSON([]string{"fig"}))
	if !errors.As(err, &ce) || ce.Order != occ.After {
		t.Fatalf("write on the empty vector over a row at [%s] = %v", v3, err)
	}
	r, err = east.Read(ctx, db, "c1")
	if err != nil || r.Vector.Compare(v3) != occ.Equal || !slices.Equal(items(t, r.Value), []string{"apple", "pear", "plum"}) {
		t.Fatalf("final row = [%s] %s, %v", r.Vector, r.Value, err)
	}
	// A base that descends from the stored vector (seen elsewhere, then
	// merged) is fine: the stored vector is Before it.
	ahead := v3.Merge(vec(t, "ap-south:4"))
	if v4, err := west.Write(ctx, db, "c1", ahead, merged); err != nil || v4.String() != "ap-south:4,eu-west:2,us-east:2" {
		t.Fatalf("write on a base ahead of the row = [%s], %v", v4, err)
	}
}

func TestVectorWriteBadInput(t *testing.T) {
	t.Parallel()
	db := database(t)
	tbl := cartsTable(t, db, "w")
	for name, bad := range map[string]occ.VectorTable{
		"no name":     {Writer: "w"},
		"no writer":   {Name: "occ_carts", ValueColumn: "items"},
		"bad writer":  {Name: "occ_carts", ValueColumn: "items", Writer: "a\x00"},
		"NUL in name": {Name: "occ_carts\x00", ValueColumn: "items", Writer: "w"},
		"same column": {Name: "occ_carts", ValueColumn: "id", Writer: "w"},
	} {
		if _, err := bad.Write(ctx, db, "x", occ.Vector{}, []byte(`[]`)); err == nil || errors.Is(err, occ.ErrConflict) {
			t.Errorf("%s: Write = %v, want a plain error", name, err)
		}
	}
	if _, err := tbl.Write(ctx, nil, "x", occ.Vector{}, []byte(`[]`)); err == nil {
		t.Error("Write with a nil Querier succeeded")
	}
	if _, err := tbl.Read(ctx, nil, "x"); err == nil {
		t.Error("Read with a nil Querier succeeded")
	}
	// A value the column refuses is the database's error, not a conflict.
	if _, err := tbl.Write(ctx, db, "x", occ.Vector{}, []byte(`not json`)); err == nil || errors.Is(err, occ.ErrConflict) {
		t.Errorf("invalid jsonb = %v", err)
	}
	// A table without a unique id cannot be written (two creators would make two rows).
	mustExec(t, db, `CREATE TABLE occ_nokey (id text, value bytea)`)
	nokey := occ.VectorTable{Name: "occ_nokey", Writer: "w"}
	m, _ := nokey.Migration()
	mustExec(t, db, m.Up)
	if _, err := nokey.Write(ctx, db, "x", occ.Vector{}, []byte("v")); err == nil {
		t.Error("Write to a table without a unique id succeeded")
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM occ_carts) + (SELECT count(*) FROM occ_nokey)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("bad writes left %d rows (%v)", n, err)
	}
}

// TestVectorMigration: the column's CHECK keeps out what Vector cannot
// read; Down removes it; names with quotes and a schema work.
func TestVectorMigration(t *testing.T) {
	t.Parallel()
	db := database(t)
	schema := "occ mig " + rand.Text()[:8] // a schema of this test's own, with a space to quote
	mustExec(t, db, `CREATE SCHEMA "`+schema+`"`)
	t.Cleanup(func() { _, _ = db.ExecContext(ctx, `DROP SCHEMA "`+schema+`" CASCADE`) })
	weird := `"` + schema + `"."we""ird"`
	mustExec(t, db, `CREATE TABLE `+weird+` (k bigint PRIMARY KEY, "v al" bytea)`)
	tbl := occ.VectorTable{Schema: schema, Name: `we"ird`, IDColumn: "k", ValueColumn: "v al", VectorColumn: `vv"`, Writer: "w"}
	m, err := tbl.Migration()
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "vector_column" || !strings.Contains(m.Up, weird) {
		t.Fatalf("migration = %+v", m)
	}
	mustExec(t, db, m.Up)
	if _, err := db.ExecContext(ctx, m.Up); err == nil {
		t.Error("Up ran twice")
	}
	mustExec(t, db, `INSERT INTO `+weird+` (k, "v al") VALUES (1, 'x')`) // the default '{}'
	for _, bad := range []string{`[]`, `{"a":0}`, `{"a":-1}`, `{"a":1.5}`, `{"a":"1"}`, `{"":1}`, `{"a":18446744073709551616}`, `{"a":{"b":1}}`, `{"a":null}`, `"x"`} {
		if _, err := db.ExecContext(ctx, `UPDATE `+weird+` SET "vv""" = $1 WHERE k = 1`, bad); err == nil {
			t.Errorf("the column took %s", bad)
		}
	}
	mustExec(t, db, `UPDATE `+weird+` SET "vv""" = '{"a":18446744073709551615,"b":2}' WHERE k = 1`)
	r, err := tbl.Read(ctx, db, 1)
	if err != nil || r.Vector.String() != "a:18446744073709551615,b:2" || string(r.Value) != "x" {
		t.Fatalf("Read = %+v, %v", r, err)
	}
	if v, err := tbl.Write(ctx, db, 1, r.Vector, []byte("y")); err != nil || v.Get("w") != 1 {
		t.Fatalf("Write = [%s], %v", v, err)
	}
	mustExec(t, db, m.Down)
	if _, err := tbl.Read(ctx, db, 1); err == nil {
		t.Error("Read after Down succeeded")
	}
	// The single-version column's migration, on the same table.
	vt := occ.VersionedTable{Schema: schema, Name: `we"ird`, IDColumn: "k"}
	vm, err := vt.Migration()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, vm.Up)
	if v, err := vt.Update(ctx, db, 1, 1, map[string]any{"v al": []byte("z")}); err != nil || v != 2 {
		t.Fatalf("Update after the version migration = %d, %v", v, err)
	}
	mustExec(t, db, vm.Down)
	if _, err := (occ.VectorTable{}).Migration(); err == nil {
		t.Error("Migration of a table without a name succeeded")
	}
}

// TestVectorCounters: counters compare exactly up to 2^64-1 in the
// database (a float comparison would take 2^64-2 and 2^64-1 as equal).
func TestVectorCounters(t *testing.T) {
	t.Parallel()
	db := database(t)
	tbl := cartsTable(t, db, "a")
	near := vec(t, "a:18446744073709551613")
	top, err := tbl.Write(ctx, db, "c", near, []byte(`["x"]`))
	if err != nil || top.Get("a") != math.MaxUint64-1 {
		t.Fatalf("write = [%s], %v", top, err)
	}
	other := tbl
	other.Writer = "b"
	if _, err := other.Write(ctx, db, "c", near.Increment("b"), []byte(`["y"]`)); !errors.Is(err, occ.ErrConcurrent) {
		t.Fatalf("write on a base one below the stored counter = %v, want ErrConcurrent", err)
	}
	if v, err := tbl.Write(ctx, db, "c", top, []byte(`["z"]`)); err != nil || v.Get("a") != math.MaxUint64 {
		t.Fatalf("write to the largest counter = [%s], %v", v, err)
	}
	r, err := tbl.Read(ctx, db, "c")
	if err != nil || r.Vector.Get("a") != math.MaxUint64 {
		t.Fatalf("Read = [%s], %v", r.Vector, err)
	}
	// No counter past the largest: an error, not a panic, and nothing written.
	if _, err := tbl.Write(ctx, db, "c", r.Vector, []byte(`["w"]`)); err == nil || errors.Is(err, occ.ErrConflict) {
		t.Fatalf("write past the largest counter = %v", err)
	}
	if r2, err := tbl.Read(ctx, db, "c"); err != nil || string(r2.Value) != string(r.Value) {
		t.Fatalf("the refused write changed the row: %s, %v", r2.Value, err)
	}
}

// TestVectorScanValue: vectors survive the jsonb column, whose own
// formatting (key order by length, spaces) Scan reads back.
func TestVectorScanValue(t *testing.T) {
	t.Parallel()
	db := database(t)
	for _, s := range []string{"", "a:1", "bb:2,c:3", "%22q%22:5,x%3Ay:2,%C3%A9:18446744073709551615"} {
		v := vec(t, s)
		var back occ.Vector
		var text string
		if err := db.QueryRowContext(ctx, `SELECT $1::jsonb, $1::jsonb::text`, v).Scan(&back, &text); err != nil {
			t.Fatalf("[%s]: %v", s, err)
		}
		if back.Compare(v) != occ.Equal {
			t.Errorf("[%s] came back as [%s] (jsonb %s)", s, back, text)
		}
	}
	var n sql.Null[occ.Vector]
	if err := db.QueryRowContext(ctx, `SELECT NULL::jsonb`).Scan(&n); err != nil || n.Valid {
		t.Errorf("NULL into sql.Null[Vector] = %v, %+v", err, n)
	}
	var v occ.Vector
	if err := db.QueryRowContext(ctx, `SELECT NULL::jsonb`).Scan(&v); err == nil {
		t.Error("NULL scanned into a Vector")
	}
}

// TestVectorConcurrentCreate: two regions create the same cart at once.
// The second one's insert waits for the first's transaction, then is
// judged against the row it made: a concurrent sibling, not a duplicate
// row or a unique-violation error.
func TestVectorConcurrentCreate(t *testing.T) {
	t.Parallel()
	db := database(t)
	east := cartsTable(t, db, "us-east")
	west := east
	west.Writer = "eu-west"
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := east.Write(ctx, tx, "c", occ.Vector{}, itemsJSON([]string{"apple"})); err != nil {
		t.Fatal(err)
	}
	var xid string
	if err := tx.QueryRowContext(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := west.Write(ctx, db, "c", occ.Vector{}, itemsJSON([]string{"pear"}))
		done <- err
	}()
	// Wait until west's insert waits on east's transaction (a condition,
	// polled; not a sleep standing in for one).
	testenv.WaitFor(t, 30*time.Second, "west's write to wait on east's transaction", func() bool {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'transactionid' AND transactionid::text = $1 AND NOT granted`, xid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("west's write ended before east committed: %v", err)
		default:
		}
		return waiting > 0
	})
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var ce *occ.VectorConflictError
	if !errors.As(err, &ce) || ce.Order != occ.Concurrent || ce.Stored.String() != "us-east:1" ||
		!slices.Equal(items(t, ce.StoredValue), []string{"apple"}) {
		t.Fatalf("second creator = %v, want a concurrent sibling of east's cart", err)
	}
	if _, err := west.Write(ctx, db, "c", ce.MergedBase(), union(t, ce.StoredValue, ce.Value)); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM occ_carts`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v)", rows, err)
	}
	r, err := east.Read(ctx, db, "c")
	if err != nil || r.Vector.String() != "eu-west:1,us-east:1" || !slices.Equal(items(t, r.Value), []string{"apple", "pear"}) {
		t.Fatalf("cart = [%s] %s, %v", r.Vector, r.Value, err)
	}
}

// TestVectorReadsWhatTheCheckTakes: the migration's CHECK takes a counter
// another client wrote with a fraction of zeros ({"a": 3.0}), and jsonb
// keeps it so; Read and Write must read such a row, not fail on it.
func TestVectorReadsWhatTheCheckTakes(t *testing.T) {
	t.Parallel()
	db := database(t)
	tbl := cartsTable(t, db, "w")
	mustExec(t, db, `INSERT INTO occ_carts (id, items, version_vector) VALUES ('c', '["x"]', '{"a": 3.0, "b": 1.00, "w": 18446744073709551614.000}')`)
	r, err := tbl.Read(ctx, db, "c")
	if err != nil || r.Vector.String() != "a:3,b:1,w:18446744073709551614" {
		t.Fatalf("Read of a row the CHECK took = [%s], %v", r.Vector, err)
	}
	if v, err := tbl.Write(ctx, db, "c", r.Vector, []byte(`["y"]`)); err != nil || v.String() != "a:3,b:1,w:18446744073709551615" {
		t.Fatalf("Write on it = [%s], %v", v, err)
	}
	// A stale writer is refused with both versions, the stored one read.
	mustExec(t, db, `UPDATE occ_carts SET version_vector = '{"a": 4.0, "w": 18446744073709551615}' WHERE id = 'c'`)
	var vc *occ.VectorConflictError
	if _, err := (occ.VectorTable{Name: "occ_carts", ValueColumn: "items", Writer: "b"}).Write(ctx, db, "c", r.Vector, []byte(`["z"]`)); !errors.As(err, &vc) || vc.Stored.String() != "a:4,w:18446744073709551615" {
		t.Fatalf("stale write = %v", err)
	}
}
