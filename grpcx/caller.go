package grpcx

import (
	"context"
	"fmt"
)

// CallerFromContext returns an Options.Caller func that names the caller
// by the value an authentication interceptor, running before the guard,
// stored in the call's context under key (the account, user or client it
// authenticated). name turns that value into the caller's name, e.g. its
// account id; a nil name uses the value itself when it is a string or a
// fmt.Stringer.
//
// The name must identify the caller, not its credential: a client that
// refreshes its token between two retries is the same caller, and its
// retry must be replayed, not run again. A call without a value under
// key, or whose value is not a T, gets "" (the interceptor then answers
// Unauthenticated and stores nothing).
func CallerFromContext[T any](key any, name func(T) string) func(ctx context.Context) string {
	if key == nil {
		panic("grpcx.CallerFromContext: nil context key")
	}
	return func(ctx context.Context) string {
		v, ok := ctx.Value(key).(T)
		if !ok {
			return ""
		}
		if name != nil {
			return name(v)
		}
		switch s := any(v).(type) {
		case string:
			return s
		case fmt.Stringer:
			return s.String()
		}
		return ""
	}
}
