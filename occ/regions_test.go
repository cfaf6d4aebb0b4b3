package occ_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/occ"
)

// attempt is one call of VectorTable.Write, as the test saw it.
type attempt struct {
	row, writer string
	next        occ.Vector // the vector the write would store: base.Increment(writer)
	value       []byte
	err         error
}

type regionsLog struct {
	mu       sync.Mutex
	attempts []attempt
}

func (l *regionsLog) add(a attempt) {
	l.mu.Lock()
	l.attempts = append(l.attempts, a)
	l.mu.Unlock()
}

// addItem is one region's change to a cart: add op to what it read, write;
// on a conflict merge the siblings (union) and write the merge on
// MergedBase, until it goes through. It returns how many conflicts it met.
// It runs on the regions' goroutines, so it reports by error, not t.Fatal.
func addItem(q occ.Querier, tbl occ.VectorTable, log *regionsLog, row, op string, read occ.Version) (int, error) {
	value, err := mergeItems(read.Value, itemsJSON([]string{op}))
	if err != nil {
		return 0, err
	}
	base := read.Vector
	for conflicts := 0; ; conflicts++ {
		_, err := tbl.Write(ctx, q, row, base, value)
		log.add(attempt{row: row, writer: tbl.Writer, next: base.Increment(tbl.Writer), value: value, err: err})
		var ce *occ.VectorConflictError
		if !errors.As(err, &ce) {
			return conflicts, err
		}
		if value, err = mergeItems(ce.StoredValue, value); err != nil {
			return conflicts, err
		}
		base = ce.MergedBase()
	}
}

func readOrEmpty(q occ.Querier, tbl occ.VectorTable, row string) (occ.Version, error) {
	r, err := tbl.Read(ctx, q, row)
	if errors.Is(err, occ.ErrNotFound) {
		return r, nil // the zero Version: a write on it creates the cart
	}
	return r, err
}

// TestTwoRegions: two regions write the same carts at once, each through
// read, add an item, conditional write, merge on conflict. Three phases:
// lock-step rounds (both read the same version, then both write: exactly
// one must be refused as concurrent), free running (any interleaving), and
// strictly alternating writes (never a conflict). Afterwards, per cart:
// the writes that went through form a chain (no two concurrent ones both
// succeeded: every concurrent pair was detected), every refusal is a
// concurrent pair, each successful value keeps every item of the writes
// before it, and the final cart has every item: no update is lost.
func TestTwoRegions(t *testing.T) {
	t.Parallel()
	db := database(t)
	east := cartsTable(t, db, "us-east")
	west := east
	west.Writer = "eu-west"
	regions := []occ.VectorTable{west, east}
	const carts, lockstep, free, sequential = 4, 10, 40, 20
	rows := make([]string, carts)
	for i := range rows {
		rows[i] = fmt.Sprintf("cart-%d", i)
	}
	var log regionsLog
	want := make(map[string][]string) // every item added to each cart

	// Phase 1: lock-step. Both regions read every cart, then all writes start together.
	for round := range lockstep {
		reads := make([][]occ.Version, len(regions))
		for ri, reg := range regions {
			for _, row := range rows {
				r, err := readOrEmpty(db, reg, row)
				if err != nil {
					t.Fatal(err)
				}
				reads[ri] = append(reads[ri], r)
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		conflicts := make([][]int, len(regions))
		for ri, reg := range regions {
			conflicts[ri] = make([]int, len(rows))
			for ci, row := range rows {
				op := fmt.Sprintf("%s/lockstep/%d", reg.Writer, round)
				want[row] = append(want[row], op)
				wg.Go(func() {
					<-start
					n, err := addItem(db, reg, &log, row, op, reads[ri][ci])
					if err != nil {
						t.Errorf("%s %s: %v", reg.Writer, row, err)
					}
					conflicts[ri][ci] = n
				})
			}
		}
		close(start)
		wg.Wait()
		for ci, row := range rows {
			if got := conflicts[0][ci] + conflicts[1][ci]; got != 1 {
				t.Fatalf("round %d, %s: %d conflicts between two writes on one version, want exactly 1", round, row, got)
			}
		}
	}

	// Phase 2: free running, every region on every cart at once.
	var wg sync.WaitGroup
	for _, reg := range regions {
		for _, row := range rows {
			for i := range free {
				want[row] = append(want[row], fmt.Sprintf("%s/free/%d", reg.Writer, i))
			}
			wg.Go(func() {
				for i := range free {
					op := fmt.Sprintf("%s/free/%d", reg.Writer, i)
					r, err := readOrEmpty(db, reg, row)
					if err == nil {
						_, err = addItem(db, reg, &log, row, op, r)
					}
					if err != nil {
						t.Errorf("%s %s: %v", reg.Writer, row, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()

	// Phase 3: strictly alternating, each write on a fresh read: never a conflict.
	for i := range sequential {
		for _, row := range rows {
			reg := regions[i%2]
			op := fmt.Sprintf("%s/sequential/%d", reg.Writer, i)
			want[row] = append(want[row], op)
			r, err := readOrEmpty(db, reg, row)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := addItem(db, reg, &log, row, op, r); err != nil || n != 0 {
				t.Fatalf("sequential write %d on %s: %d conflicts, %v", i, row, n, err)
			}
		}
	}

	var refused int
	for _, row := range rows {
		var ok []attempt
		for _, a := range log.attempts {
			if a.row != row {
				continue
			}
			if a.err == nil {
				ok = append(ok, a)
				continue
			}
			refused++
			var ce *occ.VectorConflictError
			if !errors.As(a.err, &ce) || !errors.Is(a.err, occ.ErrConcurrent) || ce.Order != occ.Concurrent ||
				ce.Stored.Compare(a.next) != occ.Concurrent {
				t.Errorf("%s: refused write on [%s] is not a concurrent pair: %v", row, a.next, a.err)
			}
		}
		// Every pair of writes that went through is ordered: no concurrent pair slipped by.
		for i := range ok {
			for j := i + 1; j < len(ok); j++ {
				if o := ok[i].next.Compare(ok[j].next); o == occ.Concurrent || o == occ.Equal {
					t.Fatalf("%s: writes [%s] (%s) and [%s] (%s) both went through: %s",
						row, ok[i].next, ok[i].writer, ok[j].next, ok[j].writer, o)
				}
			}
		}
		// Along the chain, each value keeps the items of the one before.
		slices.SortFunc(ok, func(a, b attempt) int {
			if a.next.Compare(b.next) == occ.Before {
				return -1
			}
			return 1
		})
		for i := 1; i < len(ok); i++ {
			prev, cur := items(t, ok[i-1].value), items(t, ok[i].value)
			for _, it := range prev {
				if !slices.Contains(cur, it) {
					t.Fatalf("%s: write [%s] dropped %q that [%s] had", row, ok[i].next, it, ok[i-1].next)
				}
			}
		}
		// The row holds the last of the chain, with every item ever added.
		final, err := east.Read(ctx, db, row)
		if err != nil {
			t.Fatal(err)
		}
		last := ok[len(ok)-1]
		if final.Vector.Compare(last.next) != occ.Equal {
			t.Fatalf("%s: row at [%s], last successful write [%s]", row, final.Vector, last.next)
		}
		for _, reg := range regions {
			var n uint64
			for _, a := range ok {
				if a.writer == reg.Writer {
					n++
				}
			}
			if final.Vector.Get(reg.Writer) != n {
				t.Errorf("%s: %s's counter is %d after %d successful writes", row, reg.Writer, final.Vector.Get(reg.Writer), n)
			}
		}
		got, w := items(t, final.Value), slices.Sorted(slices.Values(want[row]))
		if !slices.Equal(got, w) {
			t.Fatalf("%s: %d items, want %d: an update was lost", row, len(got), len(w))
		}
	}
	if refused < carts*lockstep {
		t.Fatalf("%d refusals, fewer than the %d lock-step rounds force", refused, carts*lockstep)
	}
	t.Logf("%d writes, %d refused as concurrent and merged", len(log.attempts), refused)
}
