package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// firstLeaseLapses is a store whose extensions of each key's first
// holder fail, as a Redis that stopped answering them would: that
// holder's heartbeat cannot keep its lease, and its context ends at the
// lease's deadline, before another claim can take the key. Later holders
// of the key extend as usual.
type firstLeaseLapses struct {
	guard.Store
	first sync.Map // key ID → the token of its first holder to extend
}

func (s *firstLeaseLapses) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	if token, _ := s.first.LoadOrStore(lease.Key.ID, lease.Token); token == lease.Token {
		return fmt.Errorf("%w: test: the first holder's extensions are lost", guard.ErrUnavailable)
	}
	return s.Store.Extend(ctx, lease, d)
}

// TestDemoHandlerStopsWhenItsLeaseIsLost: the demo's handlers are what
// users copy, and a handler must stop when its context ends (the lease is
// lost: docs/design.md, section 4). Here every key's first holder loses
// its lease early in its work; the copy that then takes the key places
// the order, once. A handler that slept through its context placed it a
// second time.
func TestDemoHandlerStopsWhenItsLeaseIsLost(t *testing.T) {
	const lease = 300 * time.Millisecond
	mr := miniredis.RunT(t)
	stopClock := realTime(mr)
	defer stopClock()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(&firstLeaseLapses{Store: guard.NewRedisStore(rdb, guard.RedisOptions{})}, guard.Options{Lease: lease, TTL: time.Minute})
	// The work outlasts the pause of a copy told the key is in flight
	// (the client's InFlightDelay, 1 s): the copy comes back after the
	// first holder's lease was lost, and takes the key while that holder
	// would still be working.
	c := demoConfig{keys: 4, copies: 2, clients: 8, work: 2 * time.Second, lease: lease}
	effects := &demoEffects{run: "lease", runs: map[string]int{}}
	st, err := httpStorm(t.Context(), c, g, nil, effects, testenv.Logger(t), newProgress(io.Discard, c.keys*c.copies, false))
	if err != nil {
		t.Fatal(err)
	}
	if st.effects != int64(c.keys) || st.distinct != int64(c.keys) || st.mismatched != 0 {
		t.Errorf("%d orders placed for %d keys (%d touched, %d answers unlike their key's first); want one each: %+v",
			st.effects, c.keys, st.distinct, st.mismatched, st)
	}
	t.Logf("%+v", st)
}
