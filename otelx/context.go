package otelx

import "context"

// afterFuncer is a context that runs a function when it ends without a
// goroutine of its own: guard's context of a store call is one.
type afterFuncer interface {
	AfterFunc(f func()) (stop func() bool)
}

// keepAfterFunc returns ctx, parent with a span added, with parent's
// AfterFunc method when parent has one. A context derived from ctx
// (fallback.Store bounds every call so) is then registered with parent,
// as one derived from parent itself is, where the context package would
// start a goroutine for each to watch parent's Done channel: the wrapper
// would have added a goroutine to every store call.
func keepAfterFunc(parent, ctx context.Context) context.Context {
	if a, ok := parent.(afterFuncer); ok {
		return &afterFuncCtx{Context: ctx, parent: a}
	}
	return ctx
}

// afterFuncCtx is a context (parent with a span) that ends when parent
// does, and says so through parent's AfterFunc.
type afterFuncCtx struct {
	context.Context
	parent afterFuncer
}

// AfterFunc runs f when the context ends: when its parent does.
func (c *afterFuncCtx) AfterFunc(f func()) (stop func() bool) { return c.parent.AfterFunc(f) }
