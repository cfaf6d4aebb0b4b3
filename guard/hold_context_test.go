package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// hangingWrite is a store whose next write that ends a claim (Complete,
// Fail, Release) hangs until its context ends, as a write to a store that
// went away does while go-redis dials it; entered is closed when it
// starts. The writes after it go through.
type hangingWrite struct {
	guard.Store
	entered chan struct{}
	value   any // the write's context's value for valueKey
}

type valueKey struct{}

func (s *hangingWrite) hang(ctx context.Context) error {
	if s.entered == nil {
		return nil
	}
	s.value = ctx.Value(valueKey{})
	close(s.entered)
	s.entered = nil
	<-ctx.Done()
	return ctx.Err()
}

func (s *hangingWrite) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if err := s.hang(ctx); err != nil {
		return err
	}
	return s.Store.Complete(ctx, lease, result, ttl)
}

func (s *hangingWrite) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	if err := s.hang(ctx); err != nil {
		return err
	}
	return s.Store.Fail(ctx, lease, reason, ttl)
}

func (s *hangingWrite) Release(ctx context.Context, lease guard.Lease) error {
	if err := s.hang(ctx); err != nil {
		return err
	}
	return s.Store.Release(ctx, lease)
}

// A Held's write deadline bounds its writes that end the claim, well
// before max(Lease, 1s): an unknown outcome (ErrUnavailable) after which
// the claim is still the holder's, so the write tried again with the
// deadline removed ends it. The write keeps the values of Hold's context.
func TestHeldWriteDeadline(t *testing.T) {
	const lease = 30 * time.Second // the bound the writes have without one
	writes := []struct {
		name  string
		write func(h *guard.Held) error
		state guard.State // after the write; 0: no record
	}{
		{"complete", func(h *guard.Held) error { return h.Complete([]byte("v")) }, guard.StateCompleted},
		{"fail", func(h *guard.Held) error { return h.Fail(errors.New("declined")) }, guard.StateFailed},
		{"release", func(h *guard.Held) error { return h.Release() }, 0},
	}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			s := &hangingWrite{Store: realStore(t), entered: make(chan struct{})}
			g := guard.New(s, guard.Options{Lease: lease})
			key := guard.Key{Scope: "s", ID: "held-write-deadline-" + w.name}
			_, h, err := g.Hold(context.WithValue(bg, valueKey{}, "hold's"), key, "fp")
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			h.SetWriteDeadline(start.Add(50 * time.Millisecond))
			err = w.write(h)
			if took := time.Since(start); !errors.Is(err, guard.ErrUnavailable) || took > lease/3 {
				t.Fatalf("write past its deadline = %v after %v; want ErrUnavailable, at the deadline", err, took)
			}
			if s.value != "hold's" {
				t.Errorf("the write's context has value %v, want Hold's context's", s.value)
			}
			h.SetWriteDeadline(time.Time{})
			if err := w.write(h); err != nil {
				t.Fatalf("the write tried again = %v; the claim should still be the holder's", err)
			}
			rec, err := g.Get(bg, key)
			switch {
			case w.state == 0 && !errors.Is(err, guard.ErrNotFound):
				t.Fatalf("after release: %+v, %v; want no record", rec, err)
			case w.state != 0 && (err != nil || rec.State != w.state):
				t.Fatalf("record %+v, %v; want state %v", rec, err, w.state)
			}
		})
	}
}

// A write deadline already past when the write starts: the write is not
// waited for, and nothing is lost (it may be made again).
func TestHeldWriteDeadlinePassed(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "held-write-deadline-passed"}
	_, h, err := g.Hold(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	h.SetWriteDeadline(time.Now().Add(-time.Second))
	if err := h.Complete([]byte("v")); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Complete past its write deadline = %v; want ErrUnavailable", err)
	}
	h.SetWriteDeadline(time.Now().Add(time.Minute))
	if err := h.Complete([]byte("v")); err != nil {
		t.Fatal(err)
	}
	if rec, err := g.Get(bg, key); err != nil || string(rec.Result) != "v" {
		t.Fatalf("record %+v, %v; want completed with v", rec, err)
	}
}
