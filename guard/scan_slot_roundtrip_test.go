package guard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// scanDone is a hook on one node's client that tells when a SCAN of
// it answered cursor 0 (its scan is over), and then runs after, once.
type scanDone struct {
	done  chan struct{}
	once  sync.Once
	after func()
}

func (h *scanDone) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scanDone) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scanDone) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if sc, ok := cmd.(*redis.ScanCmd); ok && err == nil {
			if _, cursor := sc.Val(); cursor == 0 {
				h.once.Do(func() {
					if h.after != nil {
						h.after()
					}
					close(h.done)
				})
			}
		}
		return err
	}
}

// TestScanSlotMovedAwayAndBack: ScanRecords promises "A record kept for
// the whole scan is given" and that the masters are scanned again "while
// any slot moved, or was moving, during the pass before". A slot that
// moves away from its master while that master is scanned (to a master
// already scanned) and comes back once the scan of its master is over
// leaves each master serving the slots it served before: the pass's
// layout (node ids and slot ranges) is the same before and after, and the
// scan ends with nil although the records of that slot the master had not
// yet listed were never given. The masters' config epochs, which every
// slot a master imports raises, do tell.
func TestScanSlotMovedAwayAndBack(t *testing.T) {
	rc := startOwnCluster(t, 3, 0)
	c := rc.client(nil)
	hooks := map[string]*scanDone{}
	var hmu sync.Mutex
	hook := func(addr string) *scanDone {
		hmu.Lock()
		defer hmu.Unlock()
		if hooks[addr] == nil {
			hooks[addr] = &scanDone{done: make(chan struct{})}
		}
		return hooks[addr]
	}
	c.OnNewNode(func(n *redis.Client) { n.AddHook(hook(n.Options().Addr)) })
	s := guardenv.StoreOn(t, c, guard.RedisOptions{Prefix: "scan{roundtrip}:"})
	ctx := context.Background()
	const n = 2000
	claimScanKeys(t, s, n)
	slot := int(guard.KeySlot(s.Name(guard.Key{Scope: "scan", ID: "0"})))
	src := rc.owner(slot)
	var dst *testenv.Server
	for _, m := range rc.masters {
		if m != src {
			dst = m
		}
	}
	// Once src's scan is over, the slot comes back to it.
	moved := false
	hook(src.Addr()).after = func() {
		if moved {
			rc.beginMove(slot, dst, src)
			for rc.moveKeys(slot, dst, src, 500) > 0 {
			}
			rc.endMove(slot, dst, src)
		}
	}
	given := map[string]bool{}
	err := s.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
		given[name] = true
		if !moved {
			moved = true
			// dst holds no record: its scan is over once it answered its
			// one SCAN.
			select {
			case <-hook(dst.Addr()).done:
			case <-time.After(10 * time.Second):
				t.Fatal("dst's scan did not end")
			}
			rc.beginMove(slot, src, dst)
			for rc.moveKeys(slot, src, dst, 500) > 0 {
			}
			rc.endMove(slot, src, dst)
		}
		return true
	})
	if k, _ := rc.cl(src).DBSize(ctx).Result(); k != n {
		t.Fatalf("%d keys back on the slot's master, want %d", k, n)
	}
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	if len(given) != n {
		t.Errorf("ScanRecords returned nil having given %d of the %d records kept for the whole scan (their slot moved away from its master during its scan and back after it)", len(given), n)
	}
}
