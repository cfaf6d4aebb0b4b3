package backstop

import (
	"context"
	"strings"
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
	if _, err := db.ExecContext(ctx, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'tenant-' || (i % 50), 'key-' || i, 'fp', 'completed', 't', 1, 'r', now() + interval '1 hour'
		FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE idemguard_keys`); err != nil {
		t.Fatal(err)
	}
	b, err := New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]string{
		"Backstop.Lookup":      b.q.lookup,
		"Backstop.Commit lock": b.q.lock,
		"Backstop mark read":   b.q.read,
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
