package occ_test

import (
	"errors"
	"testing"

	"github.com/idemguard/idemguard/occ"
)

// TestSharedWriterEqualValues pins what VectorTable.Writer's comment
// warns of: two writes by one writer id on one base with one value are
// taken for one write repeated (the rule that makes a retry after a lost
// reply harmless), so both succeed and the row holds one. Two deposits of
// 10 on a balance of 100 by goroutines sharing an id leave 110, not 120;
// with ids of their own, the second is refused as concurrent.
func TestSharedWriterEqualValues(t *testing.T) {
	t.Parallel()
	db := database(t)
	tbl := cartsTable(t, db, "node-1")
	v1, err := tbl.Write(ctx, db, "acct", occ.Vector{}, []byte(`100`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // two goroutines read 100 at v1, each deposits 10
		if _, err := tbl.Write(ctx, db, "acct", v1, []byte(`110`)); err != nil {
			t.Fatalf("deposit %d by the shared id: %v", i, err)
		}
	}
	got, err := tbl.Read(ctx, db, "acct")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != "110" || got.Vector.Compare(v1.Increment("node-1")) != occ.Equal {
		t.Fatalf("row = %s at [%s], want 110 at [%s]: one write", got.Value, got.Vector, v1.Increment("node-1"))
	}

	other := tbl
	other.Writer = "node-2" // an id of its own: the second deposit is refused
	if _, err := other.Write(ctx, db, "acct", v1, []byte(`110`)); !errors.Is(err, occ.ErrConcurrent) {
		t.Fatalf("deposit by another id on the same base = %v, want ErrConcurrent", err)
	}
}
