package consumerx_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// An Options.OnOutcome that panics (a metrics call on a nil map) changes
// nothing of what becomes of the message: its outcome was decided and
// stored before the observer hears it, so Process and ProcessBatch return
// that outcome, as if the observer had not panicked, and every other
// message of a batch is heard and returned too. Escaping, the panic lost
// the whole batch's answers (no message acknowledged) and took the
// consumer down, again on every redelivery, where the message is a
// Duplicate and the observer panics once more. The panic is logged at
// Error level.
func TestOnOutcomePanicChangesNothing(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var (
		mu      sync.Mutex
		heard   = map[string][]consumerx.Outcome{}
		effects = map[string]int{}
		logs    bytes.Buffer
	)
	p := newProcessor(t, g, "billing", consumerx.Options{
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil)),
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			mu.Lock()
			heard[msg.ID] = append(heard[msg.ID], o)
			mu.Unlock()
			if msg.ID == "m1" || msg.ID == "single" {
				panic("assignment to entry in nil map")
			}
		},
	})
	h := func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		defer mu.Unlock()
		effects[msg.ID]++
		return nil
	}
	ctx := context.Background()
	noPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("%s: the observer's panic escaped: %v", name, v)
			}
		}()
		f()
	}
	single := consumerx.Message{ID: "single", Payload: []byte("charge")}
	for _, want := range []consumerx.Outcome{consumerx.Processed, consumerx.Duplicate} {
		noPanic("Process", func() {
			if o, err := p.Process(ctx, single, h); o != want || err != nil {
				t.Errorf("Process: %s, %v; want %s", o, err, want)
			}
		})
	}
	msgs := batchOf(3)
	for _, want := range []consumerx.Outcome{consumerx.Processed, consumerx.Duplicate} {
		noPanic("ProcessBatch", func() {
			for i, r := range p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{}) {
				if r.Outcome != want || r.Err != nil {
					t.Errorf("ProcessBatch, m%d: %s, %v; want %s", i, r.Outcome, r.Err, want)
				}
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"single", "m0", "m1", "m2"} {
		if effects[id] != 1 || len(heard[id]) != 2 {
			t.Errorf("%s: ran %d times, heard %v; want once, heard processed and duplicate", id, effects[id], heard[id])
		}
	}
	if n := strings.Count(logs.String(), "OnOutcome panicked"); n != 4 {
		t.Errorf("%d panics logged, want 4:\n%s", n, logs.String())
	}
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
