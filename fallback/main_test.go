package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// quiet is a logger for tests that provoke outages on purpose.
var quiet = slog.New(slog.DiscardHandler)

// commands counts the commands (and pipelines) callers give a go-redis client, so a test can
// prove the open breaker makes no network call.
type commands struct{ n atomic.Int64 }

// DialHook does not count: the pool dials in the background, and a call
// abandoned at its bound may still be retrying.
func (c *commands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// primary is a redis-server of the test's own (it gets killed) and a
// RedisStore on it whose every command is counted.
type primary struct {
	srv   *testenv.Server
	store *guard.RedisStore
	sent  *commands
}

func newPrimary(t *testing.T, adjust ...func(*redis.Options)) primary {
	t.Helper()
	srv := testenv.StartRedis(t)
	// One dial attempt per command (go-redis's default of 5, with its
	// command retries, makes a call on a dead server take ~1.7s here; the
	// fallback's Timeout bounds that, TestFailClosedWithinBound shows it).
	o := &redis.Options{Addr: srv.Addr(), PoolSize: 64, DialerRetries: 1}
	for _, f := range adjust {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	sent := &commands{}
	c.AddHook(sent)
	return primary{srv: srv, store: guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)}), sent: sent}
}

// get reads key straight from the primary, bypassing the fallback.
func (p primary) get(t *testing.T, key guard.Key) (guard.Record, error) {
	t.Helper()
	return p.store.Get(bg, key)
}

// pgStore is a Postgres Store in a fresh schema, the secondary of the
// design.
// paymentsBackstop makes db's payments table (pgenv.PaymentsTable) and
// returns a backstop on db's default tables, which must be migrated.
func paymentsBackstop(t testing.TB, db *sql.DB) *backstop.Backstop {
	t.Helper()
	pgenv.PaymentsTable(t, db)
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pgStore(t testing.TB) (*pgstore.Store, *sql.DB) {
	t.Helper()
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(bg, db, pgstore.Options{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	return s, db
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// openBreaker fails claims on a dead primary until the breaker opens.
func openBreaker(t *testing.T, s *fallback.Store) {
	t.Helper()
	for i := 0; i < 100 && s.State().String() != "open"; i++ {
		_, _ = s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "probe", ID: "open"}, Token: "T", Fingerprint: "fp",
			Lease: time.Second, TTL: time.Minute})
	}
	if s.State().String() != "open" {
		t.Fatalf("breaker did not open: %v", s.State())
	}
}

// closeBreaker waits until a claim on a live primary has closed the
// breaker (the open timeout must pass first).
func closeBreaker(t *testing.T, s *fallback.Store, limit time.Duration) {
	t.Helper()
	waitFor(t, limit, "breaker closed", func() bool {
		_, _ = s.Get(bg, guard.Key{Scope: "probe", ID: "close"})
		return s.State().String() == "closed"
	})
}

// effects counts how often each key's effect ran.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: map[string]int{}} }

func (e *effects) add(id string) {
	e.mu.Lock()
	e.n[id]++
	e.mu.Unlock()
}

func (e *effects) get(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[id]
}

func isUnavailable(err error) bool { return errors.Is(err, guard.ErrUnavailable) }

// newStore is fallback.New for options the test knows are good.
func newStore(t testing.TB, primary guard.Store, opts fallback.Options) *fallback.Store {
	t.Helper()
	s, err := fallback.New(primary, opts)
	if err != nil {
		t.Fatalf("fallback.New: %v", err)
	}
	return s
}
