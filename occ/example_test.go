package occ_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/idemguard/idemguard/occ"
)

// Two regions write on top of the same version: their writes are
// concurrent, and the merge descends from both.
func ExampleVector_Compare() {
	var start occ.Vector // the empty vector
	a := start.Increment("eu-west")
	b := start.Increment("us-east")
	fmt.Println(start.Compare(a), a.Compare(b))
	m := a.Merge(b)
	fmt.Println(a.Compare(m), m.Compare(b), m)
	// Output:
	// before concurrent
	// before after eu-west:1,us-east:1
}

// Merge takes each writer's greater counter.
func ExampleVector_Merge() {
	a, _ := occ.Parse("eu-west:3,us-east:1")
	b, _ := occ.Parse("ap-south:2,us-east:5")
	fmt.Println(a.Merge(b))
	// Output: ap-south:2,eu-west:3,us-east:5
}

// Increment makes the version of one more write by a writer.
func ExampleVector_Increment() {
	v, _ := occ.Parse("eu-west:3")
	fmt.Println(v.Increment("eu-west"), v.Increment("us-east"), v)
	// Output: eu-west:4 eu-west:3,us-east:1 eu-west:3
}

// The text form is canonical: writers in order, unusual bytes escaped.
func ExampleParse() {
	v, err := occ.Parse("eu-west:3,us-east:12")
	fmt.Println(v.Get("us-east"), err)
	_, err = occ.Parse("us-east:12,eu-west:3")
	fmt.Println(err)
	w, _ := occ.FromMap(map[string]uint64{"arn:aws:x": 1})
	fmt.Println(w)
	// Output:
	// 12 <nil>
	// occ: version vector text, entry 1 "eu-west:3": writers out of order or repeated
	// arn%3Aaws%3Ax:1
}

// The JSON form is an object from writer to counter; it is also the
// jsonb column form (Scan, Value).
func ExampleVector_MarshalJSON() {
	v, _ := occ.FromMap(map[string]uint64{"us-east": 12, "eu-west": 3})
	b, _ := json.Marshal(struct {
		Version occ.Vector `json:"version"`
	}{v})
	fmt.Println(string(b))
	var back occ.Vector
	err := json.Unmarshal([]byte(`{"us-east": 12, "eu-west": 3}`), &back)
	fmt.Println(back.Compare(v), err)
	// Output:
	// {"version":{"eu-west":3,"us-east":12}}
	// equal <nil>
}

// FromMap drops zero counters and checks the writer ids.
func ExampleFromMap() {
	v, err := occ.FromMap(map[string]uint64{"eu-west": 2, "us-east": 0})
	fmt.Println(v, v.Len(), err)
	_, err = occ.FromMap(map[string]uint64{"": 1})
	fmt.Println(err)
	// Output:
	// eu-west:2 1 <nil>
	// occ: empty writer id
}

// Migration gives the SQL that adds the vector column to the
// application's table, for its own migration tool.
func ExampleVectorTable_Migration() {
	carts := occ.VectorTable{Name: "carts", ValueColumn: "items"}
	m, err := carts.Migration()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.Down)
	// Output: ALTER TABLE "carts" DROP COLUMN "version_vector";
}

// Migration gives the SQL that adds the version column.
func ExampleVersionedTable_Migration() {
	m, err := occ.VersionedTable{Name: "accounts"}.Migration()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(m.Up)
	// Output:
	// -- Single-version optimistic concurrency: every update names the version it
	// -- read and bumps it (occ.VersionedTable.Update).
	// ALTER TABLE "accounts" ADD COLUMN "version" bigint NOT NULL DEFAULT 1;
}

// IsConflict tells a conflict worth another try from other errors.
func ExampleIsConflict() {
	err := fmt.Errorf("saving order 7: %w", occ.ErrConflict)
	fmt.Println(occ.IsConflict(err), occ.IsConflict(errors.New("disk full")))
	// Output: true false
}

// A region adds an item to a cart: read, change, write on the version
// read. When another region wrote concurrently, merge the two carts and
// write the merge on the merged vector.
func ExampleVectorTable_Write() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// CREATE TABLE carts (id text PRIMARY KEY, items jsonb NOT NULL DEFAULT '[]'),
	// then VectorTable.Migration's Up.
	carts := occ.VectorTable{Name: "carts", ValueColumn: "items", Writer: "eu-west"}

	cur, err := carts.Read(ctx, db, "cart-42")
	if err != nil && !errors.Is(err, occ.ErrNotFound) { // not found: the empty vector creates it
		log.Fatal(err)
	}
	value := addToCart(cur.Value, "apple")
	base := cur.Vector
	for {
		_, err := carts.Write(ctx, db, "cart-42", base, value)
		var conflict *occ.VectorConflictError
		if !errors.As(err, &conflict) {
			if err != nil {
				log.Fatal(err)
			}
			break
		}
		value = mergeCarts(conflict.StoredValue, conflict.Value) // siblings: keep both carts' items
		base = conflict.MergedBase()
	}
}

// Read returns a row's vector and value; a missing row is ErrNotFound.
func ExampleVectorTable_Read() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	carts := occ.VectorTable{Name: "carts", ValueColumn: "items"}
	v, err := carts.Read(ctx, db, "cart-42")
	switch {
	case errors.Is(err, occ.ErrNotFound):
		fmt.Println("no such cart")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Printf("cart at [%s]: %s\n", v.Vector, v.Value)
	}
}

// The error of a refused vector write carries both versions.
func ExampleVectorConflictError() {
	stored, _ := occ.Parse("eu-west:1,us-east:1")
	base, _ := occ.Parse("us-east:1")
	var err error = &occ.VectorConflictError{
		Table: "carts", ID: "cart-42", Writer: "us-east",
		Base: base, Value: []byte(`["plum"]`),
		Stored: stored, StoredValue: []byte(`["pear"]`),
		Order: stored.Compare(base.Increment("us-east")),
	}
	var ce *occ.VectorConflictError
	fmt.Println(errors.Is(err, occ.ErrConflict), errors.Is(err, occ.ErrConcurrent), errors.As(err, &ce))
	fmt.Printf("%s and %s, write the merge on [%s]\n", ce.StoredValue, ce.Value, ce.MergedBase())
	// Output:
	// true true true
	// ["pear"] and ["plum"], write the merge on [eu-west:1,us-east:1]
}

func addToCart(cart []byte, item string) []byte {
	var items []string
	_ = json.Unmarshal(cart, &items)
	b, _ := json.Marshal(append(items, item))
	return b
}

func mergeCarts(a, b []byte) []byte {
	var x, y []string
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	seen := map[string]bool{}
	var out []string
	for _, s := range append(x, y...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	r, _ := json.Marshal(out)
	return r
}

// Scan reads the jsonb column, as PostgreSQL formats it; Value writes it.
// A nullable column scans into sql.Null[occ.Vector].
func ExampleVector_Scan() {
	var v occ.Vector
	err := v.Scan([]byte(`{"us-east": 12, "eu-west": 3}`)) // as a driver returns jsonb
	fmt.Println(v, err)
	val, _ := v.Value()
	fmt.Println(val)
	// Output:
	// eu-west:3,us-east:12 <nil>
	// {"eu-west":3,"us-east":12}
}

// All walks the counters in writer order.
func ExampleVector_All() {
	v, _ := occ.Parse("eu-west:3,us-east:12")
	for w, n := range v.All() {
		fmt.Println(w, n)
	}
	// Output:
	// eu-west 3
	// us-east 12
}

// ValidWriter checks an id before it is used, e.g. one read from the
// environment at start-up.
func ExampleValidWriter() {
	fmt.Println(occ.ValidWriter("eu-west-1"), occ.ValidWriter(""))
	// Output: <nil> occ: empty writer id
}
