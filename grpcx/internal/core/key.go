// Package core is what grpcx (grpc-go) and connectx (Connect) share: keys,
// statuses, the stored call's format, the server's claim, replay and
// completion, and the client's retry policy. It imports neither gRPC
// library.
package core

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemguard/idemguard/guard"
)

// DefaultMetadata is the request metadata that carries the key.
const DefaultMetadata = "idempotency-key"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = guard.MaxIDLen

// ErrMalformedKey is returned (wrapped) for a key that cannot be used.
var ErrMalformedKey = errors.New("grpcx: malformed idempotency key")

// CheckKey reports whether key is 1 to MaxKeyLen bytes of visible ASCII.
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

// KeyFromField reads the key from a string field of the request message at
// a dotted path; see grpcx.KeyFromField. pkg names the caller in panics.
func KeyFromField(pkg, path string) func(ctx context.Context, req any) (string, error) {
	names := strings.Split(path, ".")
	for _, n := range names {
		if n == "" {
			panic(fmt.Sprintf("%s.KeyFromField: empty name in path %q", pkg, path))
		}
	}
	return func(_ context.Context, req any) (string, error) {
		m, ok := req.(proto.Message)
		if !ok {
			return "", fmt.Errorf("%s: key field %q: request is %T, not a proto.Message", pkg, path, req)
		}
		msg := m.ProtoReflect()
		for i, n := range names {
			fd := msg.Descriptor().Fields().ByName(protoreflect.Name(n))
			if fd == nil {
				return "", fmt.Errorf("%s: key field %q: %s has no field %q", pkg, path, msg.Descriptor().FullName(), n)
			}
			last := i == len(names)-1
			switch {
			case fd.IsList() || fd.IsMap():
				return "", fmt.Errorf("%s: key field %q: %s is repeated", pkg, path, fd.FullName())
			case last && fd.Kind() != protoreflect.StringKind:
				return "", fmt.Errorf("%s: key field %q: %s is a %s, not a string", pkg, path, fd.FullName(), fd.Kind())
			case last && fd.HasPresence() && !msg.Has(fd):
				return "", nil // not set: its default (proto2, editions) is no key
			case last && fd.HasPresence() && msg.Get(fd).String() == "":
				// Set, to "": an empty key, as an empty metadata value is.
				return "", fmt.Errorf("%w: key field %q is set and empty", ErrMalformedKey, path)
			case last:
				return msg.Get(fd).String(), nil
			case fd.Message() == nil:
				return "", fmt.Errorf("%s: key field %q: %s is not a message", pkg, path, fd.FullName())
			case !msg.Has(fd):
				return "", nil
			}
			msg = msg.Get(fd).Message()
		}
		return "", nil
	}
}

// keyContext is the context key of WithKey.
type keyContext struct{}

// WithKey returns a context that carries the key a client interceptor
// sends (grpcx.WithIdempotencyKey, connectx.WithIdempotencyKey: one
// context key, so either package's client reads either's).
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// KeyFrom returns the key WithKey put in ctx, or "".
func KeyFrom(ctx context.Context) string {
	k, _ := ctx.Value(keyContext{}).(string)
	return k
}

// CallerFromContext is grpcx.CallerFromContext.
func CallerFromContext[T any](pkg string, key any, name func(T) string) func(ctx context.Context) string {
	if key == nil {
		panic(pkg + ".CallerFromContext: nil context key")
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
		// A string of a type of its own (type AccountID string), as
		// httpx.TenantFromContext takes it.
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.String {
			return rv.String()
		}
		return ""
	}
}
