package main

import (
	"context"
	"database/sql"
	"strings"
	"sync"
)

// demoEffects records the business effects: in memory, or as rows of a
// PostgreSQL table when the demo has a database.
type demoEffects struct {
	run   string // the demo run the effects belong to
	table string // the PostgreSQL table of effects, when db is set
	mu    sync.Mutex
	runs  map[string]int
	db    *sql.DB
}

func (e *demoEffects) record(ctx context.Context, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, kind, key string) error {
	if e.db != nil {
		_, err := q.ExecContext(ctx, `INSERT INTO `+e.table+` (run, kind, key) VALUES ($1, $2, $3)`, e.run, kind, key)
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// In memory the write is the effect. Like a statement under ctx, it is
	// not made once the holder's context has ended (its lease lost:
	// docs/design.md, section 4), and the check and the write are one step
	// under the lock.
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	e.runs[kind+"/"+key]++
	return nil
}

// count returns the effects of kind and the distinct keys they touched.
func (e *demoEffects) count(ctx context.Context, kind string) (effects, distinct int64, err error) {
	if e.db != nil {
		err = e.db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT key) FROM `+e.table+` WHERE run = $1 AND kind = $2`, e.run, kind).Scan(&effects, &distinct)
		return effects, distinct, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, n := range e.runs {
		if strings.HasPrefix(k, kind+"/") {
			effects += int64(n)
			distinct++
		}
	}
	return effects, distinct, nil
}
