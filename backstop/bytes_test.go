package backstop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestCommitAnyBytes: a fingerprint may be any bytes (NUL, not UTF-8, a
// leading 0x01, the very text another fingerprint is stored as) and a
// result any bytes of any size (binary, 8 MiB, empty): Commit stores them,
// a duplicate gets the result byte for byte (never nil), and Func's read
// of the committed row after its effect failed finds it by the same
// fingerprint. Two fingerprints stored alike would let one replay the
// other's result: the encoded form of one is refused as a mismatch.
func TestCommitAnyBytes(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	big := bytes.Repeat([]byte{0, 0xff, 0xfe, '\n'}, 2<<20)
	for name, c := range map[string]struct {
		fp     string
		result []byte
	}{
		"NUL":             {"a\x00b", []byte{0}},
		"not UTF-8":       {"\xc3\x28", []byte("\xc3\x28")},
		"leading 0x01":    {"\x01abc", big},
		"long not UTF-8":  {strings.Repeat("\xff", 5000), nil},
		"empty result":    {"plain", []byte{}},
		"encoded looking": {"\x01" + base64.StdEncoding.EncodeToString([]byte("\xff")), []byte("r")},
	} {
		t.Run(name, func(t *testing.T) {
			key := newKey(t)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if err := b.Commit(ctx, tx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}, c.fp, c.result); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			tx2, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx2.Rollback() }()
			err = b.Commit(ctx, tx2, guard.Lease{Key: key, Token: "B", Fence: 2, Attempt: 2}, c.fp, []byte("other"))
			var ace *backstop.AlreadyCommittedError
			if !errors.As(err, &ace) || ace.Result == nil || !bytes.Equal(ace.Result, c.result) {
				t.Fatalf("duplicate Commit = %v; want ErrAlreadyCommitted with the stored %d bytes", err, len(c.result))
			}
			_ = tx2.Rollback()
			failing := func(context.Context, *sql.Tx, guard.Lease) ([]byte, error) { return nil, errors.New("made before") }
			if r, err := b.Func(c.fp, failing)(ctx, guard.Lease{Key: key, Token: "C", Fence: 3, Attempt: 3}); err != nil || r == nil || !bytes.Equal(r, c.result) {
				t.Fatalf("Func whose effect failed = %d bytes, %v; want the stored %d bytes", len(r), err, len(c.result))
			}
			// The stored form of "\xff" is "\x01" and its base64: the
			// fingerprint spelled that way is another one.
			if c.fp == "\x01"+base64.StdEncoding.EncodeToString([]byte("\xff")) {
				other := newKey(t)
				tx, _ := db.BeginTx(ctx, nil)
				defer func() { _ = tx.Rollback() }()
				if err := b.Commit(ctx, tx, guard.Lease{Key: other, Token: "A", Fence: 1, Attempt: 1}, "\xff", []byte("x")); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				tx, _ = db.BeginTx(ctx, nil)
				if err := b.Commit(ctx, tx, guard.Lease{Key: other, Token: "B", Fence: 2, Attempt: 2}, c.fp, nil); !errors.Is(err, guard.ErrMismatch) {
					t.Fatalf("Commit with the stored form of another fingerprint = %v; want ErrMismatch", err)
				}
			}
		})
	}
}

// TestQuotedSchemaAndPrefix: a schema and a table prefix with a double
// quote, upper case, a space and a dot are quoted in every statement of
// Commit, Func, CommitStep and their lookups.
func TestQuotedSchemaAndPrefix(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	schema := `My"Sch ema.X`
	opts := pgstore.Options{Schema: schema, TablePrefix: `P"x_`}
	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), `DROP SCHEMA "`+strings.ReplaceAll(schema, `"`, `""`)+`" CASCADE`)
	})
	b := mustBackstop(t, db, opts)
	key := newKey(t)
	l := guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}
	if r, err := b.Func("fp", func(context.Context, *sql.Tx, guard.Lease) ([]byte, error) { return []byte("r"), nil })(ctx, l); err != nil || string(r) != "r" {
		t.Fatalf("Func = %q, %v", r, err)
	}
	if r, _, found, err := b.Lookup(ctx, key); err != nil || !found || string(r) != "r" {
		t.Fatalf("Lookup = %q, %t, %v", r, found, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := b.CommitStep(ctx, tx, l, "s", []byte("s")); err != nil {
		t.Fatalf("CommitStep: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r, _, found, err := b.LookupStep(ctx, key, "s"); err != nil || !found || string(r) != "s" {
		t.Fatalf("LookupStep = %q, %t, %v", r, found, err)
	}
}
