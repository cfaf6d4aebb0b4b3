package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryPoolBounded: during a Redis outage every guarded
// request goes to the fallback PostgreSQL. A storm of concurrent requests
// while PostgreSQL is slow (here: its keys table locked for a moment) must
// not open one PostgreSQL backend per request: the pool has no bound
// (database/sql's default MaxOpenConns 0), so a gateway fleet's storm
// exhausts max_connections of a PostgreSQL the README says services may
// share. The bound checked is the pool the gateway keeps (64).
func TestSecondaryPoolBounded(t *testing.T) {
	rs := testenv.StartRedis(t)
	db := secondaryPostgres(t)
	cfg, _ := secondaryConfig(t, rs, "")
	e := startConfigured(t, cfg)
	outage(t, rs, e)

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `LOCK TABLE idemguard_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	const storm = secondaryIdleConns + 8
	var wg sync.WaitGroup
	for i := range storm {
		wg.Go(func() {
			key := fmt.Sprintf("storm-%d", i)
			post(t, e.srv.URL+"/orders", key, `{"order":"`+key+`"}`, "X-Account-Id", "acct")
		})
	}
	peak := 0
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline) && peak < storm; time.Sleep(10 * time.Millisecond) {
		peak = max(peak, e.gw.db.Stats().OpenConnections)
	}
	_ = tx.Rollback()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the storm's requests did not end")
	}
	t.Logf("%d concurrent requests during the outage: %d connections to the secondary open at the peak", storm, peak)
	if peak > secondaryIdleConns {
		t.Errorf("%d connections to the fallback PostgreSQL for %d concurrent requests: the pool has no bound", peak, storm)
	}
}
