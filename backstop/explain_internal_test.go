package backstop

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestKeyLookupUsesPrimaryKey: with 20,000 analysed rows, the planner
// reads one key through the primary-key index in the backstop's lookup
// statements. The planner chooses freely (enable_seqscan stays on): the
// table is big enough that a sequential scan costs more. (Package pgstore
// checks the Store's statements the same way.)
func TestKeyLookupUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	b, err := New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.UsesKeysPrimaryKey(t, db, map[string]string{
		"Backstop.Lookup":      b.q.lookup,
		"Backstop.Func done":   b.q.done,
		"Backstop.Commit lock": b.q.lock,
		"Backstop mark read":   b.q.read,
		"Backstop peek":        b.q.peek,
		"Backstop mark extend": b.q.extend,
		"Backstop mark holder": b.q.holder,
	})
}
