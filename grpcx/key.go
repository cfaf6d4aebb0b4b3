package grpcx

import (
	"context"

	"github.com/idemguard/idemguard/grpcx/internal/core"
)

// DefaultMetadata is the request metadata that carries the idempotency
// key: the gRPC spelling (metadata names are lower case) of the HTTP
// Idempotency-Key header, so a gateway that maps one to the other needs
// no configuration.
const DefaultMetadata = core.DefaultMetadata

// MaxKeyLen is the longest idempotency key accepted, in bytes (Stripe's
// limit, and the IETF draft's guidance).
const MaxKeyLen = core.MaxKeyLen

// ErrMalformedKey is returned (wrapped) for a key that cannot be used: empty,
// longer than MaxKeyLen, or with a byte outside visible ASCII.
var ErrMalformedKey = core.ErrMalformedKey

// CheckKey reports whether key can be used as an idempotency key: 1 to
// MaxKeyLen bytes of visible ASCII (0x21 to 0x7e), which a UUID, a ULID and
// every key Stripe's libraries make satisfy. The error wraps
// ErrMalformedKey. The server answers InvalidArgument for such a key, and
// the client refuses to send one.
func CheckKey(key string) error { return core.CheckKey(key) }

// KeyFunc finds a call's idempotency key in its request (Options.Key).
// It returns "" and a nil error when the request carries none, and an
// error for a key it cannot read; the server answers both with
// InvalidArgument (the first only when the key is required).
type KeyFunc func(ctx context.Context, req any) (string, error)

// KeyFromField returns a KeyFunc that reads the key from a string field of
// the request message, named by its protobuf field name; a dotted path
// ("order.request_id") reaches into nested messages. A request without the
// field set, or with an unset message on the path, has no key; a field
// with presence (proto2 optional, proto3 optional, editions) set to ""
// is an empty key, refused as malformed (ErrMalformedKey), as an empty
// metadata value is. This is the
// AIP-155 request_id pattern: the key travels in the message, so it
// survives any proxy that drops metadata.
//
// A request that is not a proto.Message, or whose field at the path is
// not a string, gets an error (InvalidArgument, naming the path): check
// the path against the messages of the methods it guards. KeyFromField
// panics on a path with an empty name.
func KeyFromField(path string) KeyFunc { return core.KeyFromField("grpcx", path) }

// WithIdempotencyKey returns a context that makes the client interceptor
// send key as the idempotency key of a call made with it, when the call's
// outgoing metadata carries none, instead of a fresh UUIDv7: for calls
// whose key must be the same in every attempt of an effect, such as
// guard.Lease.KeyFor(step) for a call to another guarded service. An empty
// key removes one set before. The interceptor refuses (InvalidArgument,
// nothing sent) a key CheckKey refuses.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return core.WithKey(ctx, key)
}

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
	return core.CallerFromContext("grpcx", key, name)
}
