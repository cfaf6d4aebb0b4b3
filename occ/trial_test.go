package occ_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/occ"
)

// TestVectorCounterNoLostIncrements: 8 writers, each with an id of its
// own, add 1 to a grow-only counter (a JSON map writer → count) 12 times
// each, all at once through one pool, starting before the row exists.
// Each reads the row, adds to its own entry and writes on the vector it
// read; a refused write (*VectorConflictError) is done again on the row as
// it is. No increment is lost or counted twice (the sum is 96), and each
// writer's counter in the stored vector is the number of its writes that
// went through.
func TestVectorCounterNoLostIncrements(t *testing.T) {
	t.Parallel()
	const writers, increments = 8, 12
	db := database(t)
	mustExec(t, db, `CREATE TABLE occ_gcounter (id text PRIMARY KEY, value bytea NOT NULL DEFAULT '{}')`)
	base := occ.VectorTable{Name: "occ_gcounter"}
	m, err := base.Migration()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, m.Up)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		wrote     = map[string]uint64{}
		conflicts int
	)
	errs := make(chan error, writers)
	start := make(chan struct{})
	for i := range writers {
		tbl := base
		tbl.Writer = fmt.Sprintf("w%d", i)
		wg.Go(func() {
			<-start
			for range increments {
				for {
					v, err := tbl.Read(ctx, db, "c")
					if err != nil && !errors.Is(err, occ.ErrNotFound) {
						errs <- err
						return
					}
					counts := map[string]int{}
					if len(v.Value) > 0 {
						if err := json.Unmarshal(v.Value, &counts); err != nil {
							errs <- err
							return
						}
					}
					counts[tbl.Writer]++
					b, _ := json.Marshal(counts)
					_, err = tbl.Write(ctx, db, "c", v.Vector, b)
					var ce *occ.VectorConflictError
					if errors.As(err, &ce) {
						mu.Lock()
						conflicts++
						mu.Unlock()
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					wrote[tbl.Writer]++
					mu.Unlock()
					break
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	v, err := base.Read(ctx, db, "c")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	if err := json.Unmarshal(v.Value, &counts); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for w, n := range counts {
		sum += n
		if n != increments {
			t.Errorf("writer %s: %d increments stored, want %d", w, n, increments)
		}
	}
	if sum != writers*increments {
		t.Errorf("sum %d, want %d: increments lost or doubled", sum, writers*increments)
	}
	for w, n := range wrote {
		if got := v.Vector.Get(w); got != n {
			t.Errorf("writer %s: vector counter %d, %d writes went through", w, got, n)
		}
	}
	t.Logf("%d conflicts redone; vector %s", conflicts, v.Vector)
}
