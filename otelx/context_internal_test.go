package otelx

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// endable is a context with an AfterFunc of its own, as guard's store-call
// context is: end ends it and runs the functions registered.
type endable struct {
	context.Context // values
	mu              sync.Mutex
	done            chan struct{}
	err             error
	afters          []func()
}

func newEndable() *endable { return &endable{Context: context.Background(), done: make(chan struct{})} }

func (c *endable) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *endable) Done() <-chan struct{}       { return c.done }
func (c *endable) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *endable) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.afters = append(c.afters, f)
	return func() bool { return false }
}

func (c *endable) end(err error) {
	c.mu.Lock()
	c.err = err
	fs := c.afters
	c.mu.Unlock()
	close(c.done)
	for _, f := range fs {
		f()
	}
}

// TestKeepAfterFuncEnds: a context derived from the span's context of a
// store call over a context with AfterFunc ends when that context ends,
// with its error, and keeps the span context's values.
func TestKeepAfterFuncEnds(t *testing.T) {
	type key struct{}
	parent := newEndable()
	sctx := keepAfterFunc(parent, context.WithValue(parent, key{}, "span"))
	if _, ok := sctx.(afterFuncer); !ok {
		t.Fatal("the span's context hides its parent's AfterFunc")
	}
	derived, cancel := context.WithTimeout(sctx, time.Hour)
	defer cancel()
	parent.mu.Lock()
	registered := len(parent.afters)
	parent.mu.Unlock()
	if registered != 1 {
		t.Fatalf("%d functions registered with the parent, want 1 (the derived context's)", registered)
	}
	cause := errors.New("lease lost")
	parent.end(cause)
	<-derived.Done()
	if !errors.Is(derived.Err(), cause) || derived.Value(key{}) != "span" {
		t.Fatalf("derived context: Err %v, value %v", derived.Err(), derived.Value(key{}))
	}
	if plain := context.Background(); keepAfterFunc(plain, sctx) != sctx {
		t.Fatal("a parent without AfterFunc: the context was wrapped")
	}
}
