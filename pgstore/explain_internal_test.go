package pgstore

import (
	"context"
	"strings"
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
	if _, err := db.ExecContext(ctx, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'tenant-' || (i % 50), 'key-' || i, 'fp', 'completed', 't', 1, 'r', now() + interval '1 hour'
		FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE idemguard_keys`); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]string{
		"Store.Get":        s.q.get,
		"Store.Claim read": s.q.selectForUpdate,
		"Store.Complete":   s.q.complete,
	} {
		args := []any{"tenant-7", "key-7"}
		for i := 3; strings.Contains(q, "$"+string(rune('0'+i))); i++ {
			args = append(args, "0") // extra parameters: values do not matter for the plan
		}
		rows, err := db.QueryContext(ctx, "EXPLAIN "+q, args...)
		if err != nil {
			t.Fatalf("%s: EXPLAIN: %v", name, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		if !(strings.Contains(text, "Index Scan using idemguard_keys_pkey") || strings.Contains(text, "Index Only Scan using idemguard_keys_pkey")) {
			t.Errorf("%s does not use the primary key:\n%s", name, text)
		} else {
			t.Logf("%s:\n%s", name, text)
		}
	}
}
