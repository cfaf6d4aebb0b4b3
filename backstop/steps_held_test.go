package backstop_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestStepsWithinOneRun: on every step store, through Hold: steps
// asked concurrently with a running one are refused (ErrStepOrder) without
// running; a step whose fn panics or fails stores nothing and may be
// asked again; empty results come back empty; a key takes MaxSteps steps
// and refuses one more (ErrInvalidKey) without running it; the next
// attempt gets all of them back without running any.
func TestStepsWithinOneRun(t *testing.T) {
	for name, s := range stepStores(t) {
		t.Run(name, func(t *testing.T) {
			g := guard.New(s, guard.Options{Lease: 10 * time.Second})
			key := guard.Key{Scope: "steps-run", ID: fmt.Sprint(name, "/", time.Now().UnixNano())}
			_, h, err := g.Hold(bg, key, "fp")
			if err != nil {
				t.Fatal(err)
			}
			ctx, l := h.Context(), h.Lease()
			var ran atomic.Int64
			// One step runs; four more are asked meanwhile.
			inside, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := guard.Step(ctx, l, "s0", func(context.Context) (string, error) {
					close(inside)
					<-release
					ran.Add(1)
					return "v0", nil
				})
				done <- err
			}()
			<-inside
			var wg sync.WaitGroup
			for i := 1; i <= 4; i++ {
				wg.Go(func() {
					_, err := guard.Step(ctx, l, fmt.Sprint("c", i), func(context.Context) (string, error) { ran.Add(1); return "x", nil })
					if !errors.Is(err, guard.ErrStepOrder) {
						t.Errorf("a step asked while s0 runs = %v, want ErrStepOrder", err)
					}
				})
			}
			wg.Wait()
			close(release)
			if err := <-done; err != nil || ran.Load() != 1 {
				t.Fatalf("s0 = %v, %d fns ran; want OK, 1", err, ran.Load())
			}
			// A panicking fn stores nothing; the step may be asked again.
			func() {
				defer func() { _ = recover() }()
				_, _ = guard.Step(ctx, l, "p", func(context.Context) (string, error) { panic("boom") })
			}()
			boom := errors.New("card declined")
			if _, err := guard.Step(ctx, l, "p", func(context.Context) (string, error) { return "", boom }); !errors.Is(err, boom) {
				t.Fatalf("failing fn: %v, want its error", err)
			}
			if v, err := guard.Step(ctx, l, "p", func(context.Context) (string, error) { return "vp", nil }); err != nil || v != "vp" {
				t.Fatalf("p after a panic and an error = %q, %v", v, err)
			}
			if b, err := guard.Step(ctx, l, "empty", func(context.Context) ([]byte, error) { return nil, nil }); err != nil || b == nil || len(b) != 0 {
				t.Fatalf("empty []byte step = %#v, %v", b, err)
			}
			if v, err := guard.Step(ctx, l, "emptystr", func(context.Context) (string, error) { return "", nil }); err != nil || v != "" {
				t.Fatalf("empty string step = %q, %v", v, err)
			}
			for i := 4; i < guard.MaxSteps; i++ {
				if _, err := guard.Step(ctx, l, fmt.Sprint("n", i), func(context.Context) (int, error) { return i, nil }); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			n := ran.Load()
			if _, err := guard.Step(ctx, l, "too-many", func(context.Context) (int, error) { ran.Add(1); return 0, nil }); !errors.Is(err, guard.ErrInvalidKey) || ran.Load() != n {
				t.Fatalf("step %d: %v (ran %t), want ErrInvalidKey without running", guard.MaxSteps+1, err, ran.Load() != n)
			}
			if err := h.Fail(errors.New("crash")); err != nil {
				t.Fatal(err)
			}
			rec, err := s.Get(bg, key)
			if err != nil || len(rec.Steps) != guard.MaxSteps {
				t.Fatalf("failed record: %d steps, %v; want %d", len(rec.Steps), err, guard.MaxSteps)
			}
			var names []string
			for _, st := range rec.Steps[:5] {
				names = append(names, fmt.Sprintf("%s=%s", st.Name, st.Result))
			}
			if got := strings.Join(names, " "); got != `s0="v0" p="vp" empty= emptystr="" n4=4` {
				t.Fatalf("steps %s", got)
			}
			// The next attempt gets every step back and runs none.
			res, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				for _, st := range rec.Steps {
					if _, err := guard.Step(ctx, l, st.Name, func(context.Context) ([]byte, error) {
						t.Errorf("step %s ran again", st.Name)
						return nil, nil
					}); err != nil {
						return nil, err
					}
				}
				return []byte("ok"), nil
			})
			if err != nil || string(res.Value) != "ok" || res.Lease.Attempt != 2 {
				t.Fatalf("resumed = %+v, %v", res, err)
			}
		})
	}
}

// TestStepsHeldMisuse: a Held's writes in the wrong order answer
// alike on every store, and leave the record as the first write that
// ended the claim left it: Complete twice (OK: the same call), Release
// or Fail after Complete (ErrLeaseLost, completed stays), Complete after
// Release (ErrLeaseLost), Release after Fail (OK).
func TestStepsHeldMisuse(t *testing.T) {
	stores := stepStores(t)
	type seq struct {
		name string
		run  func(h *guard.Held) []error
	}
	boom := errors.New("boom")
	seqs := []seq{
		{"complete twice, release, fail", func(h *guard.Held) []error {
			return []error{h.Complete([]byte("a")), h.Complete([]byte("b")), h.Release(), h.Fail(boom)}
		}},
		{"step, release, complete", func(h *guard.Held) []error {
			_, err := guard.Step(h.Context(), h.Lease(), "a", func(context.Context) (string, error) { return "1", nil })
			return []error{err, h.Release(), h.Complete([]byte("a"))}
		}},
		{"release, complete", func(h *guard.Held) []error { return []error{h.Release(), h.Complete([]byte("a"))} }},
		{"fail, release, complete", func(h *guard.Held) []error {
			return []error{h.Fail(boom), h.Release(), h.Complete([]byte("a"))}
		}},
	}
	for _, sq := range seqs {
		t.Run(sq.name, func(t *testing.T) {
			got := map[string]string{}
			for name, s := range stores {
				g := guard.New(s, guard.Options{Lease: 10 * time.Second})
				key := guard.Key{Scope: "steps-held", ID: fmt.Sprint(name, "/", time.Now().UnixNano())}
				_, h, err := g.Hold(bg, key, "fp")
				if err != nil {
					t.Fatal(err)
				}
				var parts []string
				for _, err := range sq.run(h) {
					parts = append(parts, answer(err))
				}
				if h.Context().Err() == nil {
					t.Errorf("%s: Held's context outlived its writes", name)
				}
				got[name] = strings.Join(parts, ", ") + " → " + describe(s.Get(bg, key))
				t.Logf("%-8s %s", name, got[name])
			}
			for name := range stores {
				if got[name] != got["redis"] {
					t.Errorf("%s: %s; redis: %s", name, got[name], got["redis"])
				}
			}
		})
	}
}
