package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestBatchStepLostEndsOnlyItsItem: in DoBatch a Step that finds
// its lease lost ends that item's effect context at once (Step's holder,
// the batch's heartbeat, is told which lease: stepLog.item), and "each
// key's outcome stays independent (one key's failure, panic or lost lease
// never touches another)" (docs/design.md, section 10). TestStepLeaseLostEndsEffect
// runs DoBatch with one item only, where item 0 is the only index there is.
//
// Item 1's record goes (a failover lost it), so its Step answers
// ErrLeaseLost: item 1's context must end, item 0's must stay live.
func TestBatchStepLostEndsOnlyItsItem(t *testing.T) {
	rdb := testenv.Redis(t)
	s := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(s, guard.Options{Lease: 30 * time.Second})
	scope := "batch-step-lost-" + time.Now().Format(time.RFC3339Nano)
	items := []guard.BatchItem{{Key: guard.Key{Scope: scope, ID: "a"}, Fingerprint: "fp"}, {Key: guard.Key{Scope: scope, ID: "b"}, Fingerprint: "fp"}}
	lostDone := make(chan struct{})
	var live [2]bool
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		if i == 0 {
			<-lostDone // item 1's step found its lease lost
			live[0] = ctx.Err() == nil
			return []byte("a"), nil
		}
		defer close(lostDone)
		if err := rdb.Del(ctx, s.Name(l.Key)).Err(); err != nil {
			return nil, err
		}
		_, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) { return "ch_b", nil })
		if !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("item 1's step: %v, want ErrLeaseLost", err)
		}
		live[1] = ctx.Err() == nil
		return nil, err
	}, guard.BatchOptions{Concurrency: 2})
	if live[1] {
		t.Error("item 1's effect context is still live after its Step found its lease lost")
	}
	if !live[0] {
		t.Errorf("item 0's effect context ended when item 1's Step found item 1's lease lost (cause %v)", fmt.Sprint(res[0].Err))
	}
	if res[0].Err != nil || string(res[0].Value) != "a" {
		t.Errorf("item 0 = %+v, want completed with a", res[0])
	}
	if !errors.Is(res[1].Err, guard.ErrLeaseLost) {
		t.Errorf("item 1 = %+v, want ErrLeaseLost", res[1])
	}
}
