package proof

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// Windows records when each holder's effect acted, per key, so that a
// test can check that no two holders of one key acted at once. An effect
// that honours its context checks it before each action (Effect.Live);
// its window runs from when it started to its last action made with its
// context live. It is safe for concurrent use.
type Windows struct {
	start time.Time

	mu    sync.Mutex
	byKey map[guard.Key][]Window
}

// Window is one effect's time of action, as offsets from the start of
// the recording.
type Window struct {
	Key        guard.Key
	Token      string
	Fence      int64
	Start, End time.Duration
	// Cut: the effect observed its context's cancellation and stopped.
	Cut bool
}

// NewWindows returns an empty recording that starts now.
func NewWindows() *Windows {
	return &Windows{start: time.Now(), byKey: map[guard.Key][]Window{}}
}

// Open starts the window of an effect running under lease.
func (w *Windows) Open(lease guard.Lease) *Effect {
	now := time.Since(w.start)
	return &Effect{w: w, win: Window{Key: lease.Key, Token: lease.Token, Fence: lease.Fence, Start: now, End: now}}
}

// Effect is one effect's window while it runs.
type Effect struct {
	w   *Windows
	win Window
}

// Live reports whether ctx is still live, as an effect asks before each
// action; if so, the window reaches to now. The time is taken before ctx
// is asked, so the window ends no later than the cancellation.
func (e *Effect) Live(ctx context.Context) bool {
	now := time.Since(e.w.start)
	if ctx.Err() != nil {
		e.win.Cut = true
		return false
	}
	e.win.End = now
	return true
}

// Steps acts every step for d, or until ctx ends; it reports whether it
// ran to the end.
func (e *Effect) Steps(ctx context.Context, d, step time.Duration) bool {
	end := time.Now().Add(d)
	for e.Live(ctx) {
		if !time.Now().Before(end) {
			return true
		}
		wait.For(ctx, min(step, time.Until(end)))
	}
	return false
}

// Close records the window.
func (e *Effect) Close() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.w.byKey[e.win.Key] = append(e.w.byKey[e.win.Key], e.win)
}

// Overlaps describes every pair of windows of one key that overlap.
func (w *Windows) Overlaps() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, k := range slices.SortedFunc(maps.Keys(w.byKey), func(a, b guard.Key) int { return cmp.Compare(a.String(), b.String()) }) {
		ws := slices.SortedFunc(slices.Values(w.byKey[k]), func(a, b Window) int { return cmp.Compare(a.Start, b.Start) })
		for i, a := range ws {
			for _, b := range ws[i+1:] {
				if b.Start >= a.End {
					break
				}
				out = append(out, fmt.Sprintf("%s: fence %d [%s, %s] overlaps fence %d [%s, %s]",
					k, a.Fence, a.Start, a.End, b.Fence, b.Start, b.End))
			}
		}
	}
	return out
}

// Count returns how many windows were recorded and how many of them were
// cut short by their context.
func (w *Windows) Count() (windows, cut int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ws := range w.byKey {
		for _, x := range ws {
			windows++
			if x.Cut {
				cut++
			}
		}
	}
	return windows, cut
}
