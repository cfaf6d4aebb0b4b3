package testenv

import (
	"context"
	"database/sql"
	"strings"
	"testing"
)

// UsesKeysPrimaryKey fills idemguard_keys (migrated by the caller) with
// 20,000 analysed rows and checks that the planner reads one key of each
// statement in queries (name → SQL, $1 scope and $2 id, later parameters
// filled with "0") through the table's primary key. The planner chooses
// freely (enable_seqscan stays on): the table is big enough that a
// sequential scan costs more.
func UsesKeysPrimaryKey(t *testing.T, db *sql.DB, queries map[string]string) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'tenant-' || (i % 50), 'key-' || i, 'fp', 'completed', 't', 1, 'r', now() + interval '1 hour'
		FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE idemguard_keys`); err != nil {
		t.Fatal(err)
	}
	for name, q := range queries {
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
