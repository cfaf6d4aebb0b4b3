package pgstore

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestKeyLookupUsesPrimaryKey: with 20,000 analysed rows, the planner
// reads one key through the primary-key index in every lookup statement of
// the Store. (Package backstop checks its own statements the same way.)
// The planner chooses freely (enable_seqscan stays on): the table is big
// enough that a sequential scan costs more.
func TestKeyLookupUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testenv.Postgres(t)
	if err := Migrate(ctx, db, Options{}); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.UsesKeysPrimaryKey(t, db, map[string]string{
		"Store.Get":        s.q.get,
		"Store.Claim read": s.q.selectForUpdate,
		"Store.Complete":   s.q.complete,
	})
}
