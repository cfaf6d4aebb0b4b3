package backstop_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapMarkNotExtendedEndsHolder: holder A runs under guard.Do, which
// extends its lease every third of a lease. PostgreSQL stalls on A's row
// (a lock held elsewhere), so Redis takes every extension and A's mark
// none: the mark's lease runs out while A runs. Then Redis forgets the
// key (a failover that lost it, FLUSHALL) and B claims it. The mark no
// longer keeps B out, so A must have stopped by then: an Extend that
// extended the lease in Redis but not the mark must not report success,
// or A's keepalive believed its lease good and B ran beside A (the
// backstop's fence still refused A's commit, but an effect outside the
// transaction ran twice at once).
func TestWrapMarkNotExtendedEndsHolder(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: 900 * time.Millisecond})
	key := newKey(t)

	var aRunning atomic.Bool
	aIn, finish, aDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			aRunning.Store(true)
			defer aRunning.Store(false)
			close(aIn)
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-finish:
				return []byte("A"), nil
			}
		})
		aDone <- err
	}()
	<-aIn
	defer func() {
		close(finish)
		<-aDone
	}()

	// PostgreSQL refuses every extension of A's mark (a trigger of this
	// test's schema stands in for a database that cannot be reached).
	pgenv.Exec(t, db, `CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P03'; END $$`)
	pgenv.Exec(t, db, `CREATE TRIGGER stall BEFORE UPDATE ON idemguard_keys FOR EACH ROW
		WHEN (OLD.token = NEW.token AND NEW.status = 'pending' AND NEW.leased_until IS NOT NULL) EXECUTE FUNCTION stall()`)
	// Well after the mark's lease ended (A's keepalive had all that time
	// to find its lease unconfirmed)…
	testenv.WaitFor(t, 10*time.Second, "A's mark's lease ended 300 ms ago", func() bool {
		var ended bool
		if err := db.QueryRowContext(ctx, `SELECT COALESCE(leased_until <= clock_timestamp() - interval '300 ms', true)
			FROM idemguard_keys WHERE id = $1`, key.ID).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		return ended
	})
	// …Redis forgets the key and B claims it (B's mark is not A's
	// extension: the trigger lets it through).
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		if aRunning.Load() {
			t.Errorf("B runs beside A: A's keepalive took an extension its mark never got")
		}
		return []byte("B"), nil
	})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	t.Logf("B answered %q", res.Value)
}

// TestWrapExtendReportsMarkNotExtended: Extend, and an extension in a
// batch (WriteBatch), whose lease Redis extended but whose mark
// PostgreSQL refused, answer ErrUnavailable, not success; once PostgreSQL
// takes it again, so does the next extension.
func TestWrapExtendReportsMarkNotExtended(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	s := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
	pgenv.Exec(t, db, `CREATE TABLE down (on_ bool NOT NULL)`)
	pgenv.Exec(t, db, `INSERT INTO down VALUES (false)`)
	pgenv.Exec(t, db, `CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN IF (SELECT on_ FROM down) THEN RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P03'; END IF; RETURN NEW; END $$`)
	pgenv.Exec(t, db, `CREATE TRIGGER stall BEFORE UPDATE ON idemguard_keys FOR EACH ROW EXECUTE FUNCTION stall()`)
	for _, batch := range []bool{false, true} {
		extend := func(l guard.Lease) error {
			if !batch {
				return s.Extend(ctx, l, time.Minute)
			}
			return s.(guard.BatchStore).WriteBatch(ctx, []guard.Write{{Kind: guard.WriteExtend, Lease: l, TTL: time.Minute}})[0]
		}
		key := newKey(t)
		out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Minute})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim = %s, %v", out.Status, err)
		}
		pgenv.Exec(t, db, `UPDATE down SET on_ = true`)
		if err := extend(out.Lease); !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("batch %t: extension with the mark refused = %v; want ErrUnavailable", batch, err)
		}
		pgenv.Exec(t, db, `UPDATE down SET on_ = false`)
		if err := extend(out.Lease); err != nil {
			t.Errorf("batch %t: extension with PostgreSQL back = %v", batch, err)
		}
	}
}
