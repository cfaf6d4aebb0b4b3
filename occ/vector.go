package occ

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"sort"
	"strings"
	"unicode/utf8"
)

// Ordering is how two version vectors relate, as Vector.Compare reports it.
type Ordering int

// The four answers of Vector.Compare. Before and After are strict: a
// vector is Before another when every counter is less or equal and at least
// one is less.
const (
	Equal      Ordering = iota // the same counters: the same version
	Before                     // the receiver happened before the argument: the argument descends from it
	After                      // the receiver descends from the argument
	Concurrent                 // neither descends from the other: siblings, to be merged
)

// String returns "equal", "before", "after" or "concurrent".
func (o Ordering) String() string {
	switch o {
	case Equal:
		return "equal"
	case Before:
		return "before"
	case After:
		return "after"
	case Concurrent:
		return "concurrent"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// A Vector is a version vector: for each writer (a node, region or service
// instance) the number of writes it has made to one entity. A writer that
// has not written counts 0, and is not stored. Vectors are ordered by
// Compare: one happened before another when it has no counter greater,
// and two are concurrent when each has a write the other has not seen
// (DeCandia et al., "Dynamo", SOSP 2007, §4.4).
//
// A Vector is an immutable value: Increment and Merge return new vectors
// and never change the receiver, so a Vector may be shared between
// goroutines. The zero value is the empty vector, before every other.
// Vectors are not comparable with ==; use Compare.
type Vector struct {
	e []entry // sorted by writer, every counter > 0
}

type entry struct {
	w string
	n uint64
}

// ValidWriter reports whether w can name a writer: a non-empty valid UTF-8
// string without NUL bytes (PostgreSQL's jsonb cannot hold NUL). The error
// says what is wrong.
func ValidWriter(w string) error {
	switch {
	case w == "":
		return errors.New("occ: empty writer id")
	case !utf8.ValidString(w):
		return fmt.Errorf("occ: writer id %q is not valid UTF-8", w)
	case strings.IndexByte(w, 0) >= 0:
		return fmt.Errorf("occ: writer id %q contains a NUL byte", w)
	}
	return nil
}

// FromMap returns the vector with the counters of m. Zero counters are
// dropped (a writer with no writes is not stored). Every key must pass
// ValidWriter; the map is not retained.
func FromMap(m map[string]uint64) (Vector, error) {
	e := make([]entry, 0, len(m))
	for w, n := range m {
		if err := ValidWriter(w); err != nil {
			return Vector{}, err
		}
		if n > 0 {
			e = append(e, entry{w, n})
		}
	}
	sortEntries(e)
	return Vector{e: e}, nil
}

func sortEntries(e []entry) { sort.Slice(e, func(i, j int) bool { return e[i].w < e[j].w }) }

// Map returns the counters as a new map, which the caller may change.
func (v Vector) Map() map[string]uint64 {
	m := make(map[string]uint64, len(v.e))
	for _, x := range v.e {
		m[x.w] = x.n
	}
	return m
}

// All yields every writer with its counter (never 0), in ascending order of
// writer id.
func (v Vector) All() iter.Seq2[string, uint64] {
	return func(yield func(string, uint64) bool) {
		for _, x := range v.e {
			if !yield(x.w, x.n) {
				return
			}
		}
	}
}

// Len is the number of writers with a counter above 0.
func (v Vector) Len() int { return len(v.e) }

// IsZero reports whether v is the empty vector (no writes).
func (v Vector) IsZero() bool { return len(v.e) == 0 }

// Get returns writer w's counter, 0 when w has not written.
func (v Vector) Get(w string) uint64 {
	i, ok := v.find(w)
	if !ok {
		return 0
	}
	return v.e[i].n
}

func (v Vector) find(w string) (int, bool) {
	i := sort.Search(len(v.e), func(i int) bool { return v.e[i].w >= w })
	return i, i < len(v.e) && v.e[i].w == w
}

// Increment returns v with writer w's counter one higher: the version of a
// write that w makes on top of v, which is After v. v is unchanged.
//
// It panics when w fails ValidWriter or its counter is already
// math.MaxUint64; VectorTable.Write checks its writer first and returns an
// error instead.
func (v Vector) Increment(w string) Vector {
	if err := ValidWriter(w); err != nil {
		panic(err)
	}
	i, ok := v.find(w)
	e := make([]entry, 0, len(v.e)+1)
	e = append(e, v.e[:i]...)
	if ok {
		if v.e[i].n == math.MaxUint64 {
			panic(fmt.Sprintf("occ: writer %q's counter would overflow", w))
		}
		e = append(e, entry{w, v.e[i].n + 1})
		e = append(e, v.e[i+1:]...)
	} else {
		e = append(e, entry{w, 1})
		e = append(e, v.e[i:]...)
	}
	return Vector{e: e}
}

// Merge returns the least upper bound of v and u: each writer's counter is
// the greater of the two. The result is After-or-Equal both, and Before-or-
// Equal every vector that is After-or-Equal both. Merge is commutative,
// associative and idempotent. Neither argument is changed.
func (v Vector) Merge(u Vector) Vector {
	e := make([]entry, 0, max(len(v.e), len(u.e)))
	i, j := 0, 0
	for i < len(v.e) || j < len(u.e) {
		switch {
		case j == len(u.e) || i < len(v.e) && v.e[i].w < u.e[j].w:
			e = append(e, v.e[i])
			i++
		case i == len(v.e) || u.e[j].w < v.e[i].w:
			e = append(e, u.e[j])
			j++
		default:
			e = append(e, entry{v.e[i].w, max(v.e[i].n, u.e[j].n)})
			i++
			j++
		}
	}
	return Vector{e: e}
}

// Compare reports how v relates to u: Equal, Before (u descends from v),
// After (v descends from u) or Concurrent. It is a partial order:
// v.Compare(v) is Equal; v.Compare(u) is Before exactly when u.Compare(v)
// is After; Equal only when every counter is the same; and Before is
// transitive.
func (v Vector) Compare(u Vector) Ordering {
	less, greater := false, false // some counter of v is less / greater than u's
	i, j := 0, 0
	for (i < len(v.e) || j < len(u.e)) && !(less && greater) {
		switch {
		case j == len(u.e) || i < len(v.e) && v.e[i].w < u.e[j].w:
			greater = true // v has a writer u lacks
			i++
		case i == len(v.e) || u.e[j].w < v.e[i].w:
			less = true
			j++
		default:
			if v.e[i].n < u.e[j].n {
				less = true
			} else if v.e[i].n > u.e[j].n {
				greater = true
			}
			i++
			j++
		}
	}
	switch {
	case less && greater:
		return Concurrent
	case less:
		return Before
	case greater:
		return After
	}
	return Equal
}

// descendsOrEqual reports whether u is Before-or-Equal v.
func (v Vector) descendsOrEqual(u Vector) bool {
	o := v.Compare(u)
	return o == Equal || o == After
}
