package sqlbackstop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/lib/pq"
)

// VersionedTable names a table whose rows carry a version column, for
// optimistic concurrency: an update names the version it read and applies
// only if the row is still at it.
type VersionedTable struct {
	Schema        string // "" for the connection's search_path
	Name          string // the table; required
	IDColumn      string // the key column; default "id"
	VersionColumn string // an integer column; default "version"
}

func (v VersionedTable) names() (table, idCol, verCol string, err error) {
	if v.Name == "" {
		return "", "", "", errors.New("sqlbackstop: VersionedTable without a Name")
	}
	for _, s := range []string{v.Schema, v.Name, v.IDColumn, v.VersionColumn} {
		if strings.ContainsRune(s, 0) {
			return "", "", "", errors.New("sqlbackstop: VersionedTable names must not contain NUL bytes")
		}
	}
	table = pq.QuoteIdentifier(v.Name)
	if v.Schema != "" {
		table = pq.QuoteIdentifier(v.Schema) + "." + table
	}
	idCol, verCol = orDefault(v.IDColumn, "id"), orDefault(v.VersionColumn, "version")
	return table, idCol, verCol, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Update sets the columns in set on the row id, if it is still at version,
// and bumps the version:
//
//	UPDATE table SET col = $3, …, version = version + 1 WHERE id = $1 AND version = $2
//
// It returns the new version. When no row matched (another writer moved
// the version on, or the row is gone) it returns ErrConflict and changes
// nothing. Column names are quoted; values are parameters.
func (v VersionedTable) Update(ctx context.Context, q Querier, id any, version int64, set map[string]any) (int64, error) {
	table, idCol, verCol, err := v.names()
	if err != nil {
		return 0, err
	}
	if q == nil {
		return 0, errors.New("sqlbackstop: Update: nil Querier")
	}
	if len(set) == 0 {
		return 0, errors.New("sqlbackstop: Update with no columns to set")
	}
	cols := make([]string, 0, len(set))
	for c := range set {
		switch {
		case c == "" || strings.ContainsRune(c, 0):
			return 0, fmt.Errorf("sqlbackstop: Update: bad column name %q", c)
		case c == idCol || c == verCol:
			return 0, fmt.Errorf("sqlbackstop: Update may not set %q: it is the id or version column", c)
		}
		cols = append(cols, c)
	}
	sort.Strings(cols) // one statement text per column set
	var sb strings.Builder
	args := []any{id, version}
	sb.WriteString("UPDATE " + table + " SET ")
	for _, c := range cols {
		args = append(args, set[c])
		fmt.Fprintf(&sb, "%s = $%d, ", pq.QuoteIdentifier(c), len(args))
	}
	qv, qi := pq.QuoteIdentifier(verCol), pq.QuoteIdentifier(idCol)
	fmt.Fprintf(&sb, "%s = %s + 1 WHERE %s = $1 AND %s = $2 RETURNING %s", qv, qv, qi, qv, qv)
	var next int64
	err = q.QueryRowContext(ctx, sb.String(), args...).Scan(&next)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("%w: %s %s=%v is no longer at version %d", ErrConflict, v.Name, idCol, id, version)
		}
		return 0, dbErr(ctx, "versioned update", err)
	}
	return next, nil
}

// UpdateRetry is Update inside RetryOnConflict: before every try it calls
// read, which must read the row afresh and return the version it read and
// the values to set from what it read. It returns the new version, or the
// last ErrConflict when the tries run out.
func (v VersionedTable) UpdateRetry(ctx context.Context, q Querier, id any, opts RetryOptions,
	read func(ctx context.Context) (version int64, set map[string]any, err error)) (int64, error) {
	if read == nil {
		return 0, errors.New("sqlbackstop: UpdateRetry: nil read func")
	}
	var next int64
	err := RetryOnConflict(ctx, opts, func(ctx context.Context) error {
		version, set, err := read(ctx)
		if err != nil {
			return err
		}
		next, err = v.Update(ctx, q, id, version, set)
		return err
	})
	return next, err
}

// RetryOptions shape RetryOnConflict's backoff. The zero value is ready to
// use.
type RetryOptions struct {
	// MaxTries bounds the tries, the first included. Default 10.
	MaxTries uint
	// InitialInterval is the first wait. Default 5ms.
	InitialInterval time.Duration
	// MaxInterval caps one wait. Default 1s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each conflict. Default 2.
	Multiplier float64
	// Jitter spreads each wait uniformly by ± this fraction, so writers
	// that conflicted together do not retry together. Default 0.5; a
	// negative value means none.
	Jitter float64
}

func (o RetryOptions) withDefaults() RetryOptions {
	if o.MaxTries == 0 {
		o.MaxTries = 10
	}
	if o.InitialInterval <= 0 {
		o.InitialInterval = 5 * time.Millisecond
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = time.Second
	}
	if o.Multiplier < 1 {
		o.Multiplier = 2
	}
	switch {
	case o.Jitter == 0:
		o.Jitter = 0.5
	case o.Jitter < 0:
		o.Jitter = 0
	}
	return o
}

// RetryOnConflict calls try until it does not fail with ErrConflict, with
// exponential backoff and jitter between tries, at most MaxTries times.
// try must read the row afresh each time and update from what it read:
//
//	err := RetryOnConflict(ctx, RetryOptions{}, func(ctx context.Context) error {
//		n, ver, err := readCounter(ctx, db, id)            // re-read before each try
//		if err != nil {
//			return err
//		}
//		_, err = counters.Update(ctx, db, id, ver, map[string]any{"n": n + 1})
//		return err
//	})
//
// Any other error ends the loop and is returned as it is; so is the last
// ErrConflict when the tries run out, and the context's error when it ends.
func RetryOnConflict(ctx context.Context, opts RetryOptions, try func(ctx context.Context) error) error {
	if try == nil {
		return errors.New("sqlbackstop: RetryOnConflict: nil func")
	}
	o := opts.withDefaults()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     o.InitialInterval,
		RandomizationFactor: o.Jitter,
		Multiplier:          o.Multiplier,
		MaxInterval:         o.MaxInterval,
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		if err := ctx.Err(); err != nil {
			return struct{}{}, backoff.Permanent(err)
		}
		err := try(ctx)
		if err != nil && !errors.Is(err, ErrConflict) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(o.MaxTries), backoff.WithMaxElapsedTime(0))
	return err
}
