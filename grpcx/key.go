package grpcx

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemguard/idemguard/guard"
)

// DefaultMetadata is the request metadata that carries the idempotency
// key: the gRPC spelling (metadata names are lower case) of the HTTP
// Idempotency-Key header, so a gateway that maps one to the other needs
// no configuration.
const DefaultMetadata = "idempotency-key"

// MaxKeyLen is the longest idempotency key accepted, in bytes (Stripe's
// limit, and the IETF draft's guidance).
const MaxKeyLen = guard.MaxIDLen

// ErrMalformedKey is returned (wrapped) for a key that cannot be used: empty,
// longer than MaxKeyLen, or with a byte outside visible ASCII.
var ErrMalformedKey = errors.New("grpcx: malformed idempotency key")

// CheckKey reports whether key can be used as an idempotency key: 1 to
// MaxKeyLen bytes of visible ASCII (0x21 to 0x7e), which a UUID, a ULID and
// every key Stripe's libraries make satisfy. The error wraps
// ErrMalformedKey. The server answers InvalidArgument for such a key, and
// the client refuses to send one.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrMalformedKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrMalformedKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= 0x20 || c >= 0x7f {
			return fmt.Errorf("%w: byte 0x%02x at %d is not visible ASCII", ErrMalformedKey, c, i)
		}
	}
	return nil
}

// KeyFunc finds a call's idempotency key in its request (Options.Key).
// It returns "" and a nil error when the request carries none, and an
// error for a key it cannot read; the server answers both with
// InvalidArgument (the first only when the key is required).
type KeyFunc func(ctx context.Context, req any) (string, error)

// KeyFromField returns a KeyFunc that reads the key from a string field of
// the request message, named by its protobuf field name; a dotted path
// ("order.request_id") reaches into nested messages. A request without the
// field set, or with an unset message on the path, has no key. This is the
// AIP-155 request_id pattern: the key travels in the message, so it
// survives any proxy that drops metadata.
//
// A request that is not a proto.Message, or whose field at the path is
// not a string, gets an error (InvalidArgument, naming the path): check
// the path against the messages of the methods it guards.
func KeyFromField(path string) KeyFunc {
	names := strings.Split(path, ".")
	for _, n := range names {
		if n == "" {
			panic(fmt.Sprintf("grpcx.KeyFromField: empty name in path %q", path))
		}
	}
	return func(_ context.Context, req any) (string, error) {
		m, ok := req.(proto.Message)
		if !ok {
			return "", fmt.Errorf("grpcx: key field %q: request is %T, not a proto.Message", path, req)
		}
		msg := m.ProtoReflect()
		for i, n := range names {
			fd := msg.Descriptor().Fields().ByName(protoreflect.Name(n))
			if fd == nil {
				return "", fmt.Errorf("grpcx: key field %q: %s has no field %q", path, msg.Descriptor().FullName(), n)
			}
			last := i == len(names)-1
			switch {
			case fd.IsList() || fd.IsMap():
				return "", fmt.Errorf("grpcx: key field %q: %s is repeated", path, fd.FullName())
			case last && fd.Kind() != protoreflect.StringKind:
				return "", fmt.Errorf("grpcx: key field %q: %s is a %s, not a string", path, fd.FullName(), fd.Kind())
			case last:
				return msg.Get(fd).String(), nil
			case fd.Message() == nil:
				return "", fmt.Errorf("grpcx: key field %q: %s is not a message", path, fd.FullName())
			case !msg.Has(fd):
				return "", nil
			}
			msg = msg.Get(fd).Message()
		}
		return "", nil
	}
}

// keyContext is the context key of WithIdempotencyKey.
type keyContext struct{}

// WithIdempotencyKey returns a context that makes the client interceptor
// send key as the idempotency key of a call made with it, when the call's
// outgoing metadata carries none, instead of a fresh UUIDv7: for calls
// whose key must be the same in every attempt of an effect, such as
// guard.Lease.KeyFor(step) for a call to another guarded service. An empty
// key removes one set before. The interceptor refuses (InvalidArgument,
// nothing sent) a key CheckKey refuses.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

func keyFromContext(ctx context.Context) string {
	k, _ := ctx.Value(keyContext{}).(string)
	return k
}
