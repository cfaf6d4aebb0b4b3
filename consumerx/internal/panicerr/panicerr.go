// Package panicerr is the failure of a consumer's handler that panicked,
// shared by consumerx's batches and the adapters that run a handler
// themselves (jetstreamx, watermillx), so that a panic is one more failed
// attempt of its message everywhere.
package panicerr

import (
	"fmt"
	"runtime/debug"

	"github.com/idemguard/idemguard/guard"
)

// Error is the failure of a handler that panicked: it matches
// guard.ErrPanicked, and errors.As finds the *guard.PanicError with the
// value and the stack. Returned as the handler's own error, it is
// counted as an attempt, unlike a *guard.PanicError the guard returns.
type Error struct{ p *guard.PanicError }

// New is the failure of key's handler that panicked with v. Call it in
// the deferred function that recovered v, so that the stack is the
// panic's.
func New(key guard.Key, v any) error {
	return &Error{&guard.PanicError{Key: key, Value: v, Stack: debug.Stack()}}
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s: %v", guard.ErrPanicked, e.p.Key, e.p.Value)
}

// Unwrap returns the *guard.PanicError.
func (e *Error) Unwrap() error { return e.p }
