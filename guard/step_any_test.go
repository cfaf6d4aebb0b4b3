package guard_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// A step whose type is an interface and whose fn returns a []byte: the
// bytes were stored raw (the value's type) but decoded by the type (JSON
// into the interface), so Step answered ErrCorrupt on its first run and
// on every resumed one (the key could never get past it), or a float64
// where the []byte was JSON by chance. The type decides both ways now: a
// first run and a resumed one return one value, and fn runs once.
func TestStepInterfaceHoldingBytes(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	ctx := context.Background()
	for _, b := range []string{"ch_1", "123"} {
		key := guard.Key{Scope: "steps", ID: "any-" + b}
		runs := 0
		var got []any
		effect := func(ctx context.Context, l guard.Lease) ([]byte, error) {
			v, err := guard.Step(ctx, l, "charge", func(context.Context) (any, error) {
				runs++
				return []byte(b), nil
			})
			if err != nil {
				return nil, err
			}
			got = append(got, v)
			if len(got) == 1 {
				return nil, errors.New("the attempt fails after its step") // the next attempt resumes
			}
			return nil, nil
		}
		_, err1 := g.Do(ctx, key, "fp", effect)
		_, err2 := g.Do(ctx, key, "fp", effect)
		if err2 != nil || len(got) != 2 || runs != 1 || !reflect.DeepEqual(got[0], got[1]) {
			t.Errorf("Step[any] returning []byte(%q): attempts %v, %v; values %#v; fn ran %d times; want one value, fn run once", b, err1, err2, got, runs)
		}
	}
}
