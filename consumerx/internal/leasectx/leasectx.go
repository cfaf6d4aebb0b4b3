// Package leasectx is the context key under which consumerx.LeaseFrom
// finds a handler's guard lease, shared with the adapters that hand a
// lease of their own to a user's function (redisstream's dead letters).
package leasectx

import (
	"context"

	"github.com/idemguard/idemguard/guard"
)

// Key is the context key; its value is a *guard.Lease.
type Key struct{}

// With returns ctx carrying lease for consumerx.LeaseFrom.
func With(ctx context.Context, lease guard.Lease) context.Context {
	return context.WithValue(ctx, Key{}, &lease)
}
