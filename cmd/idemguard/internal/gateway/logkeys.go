package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
)

// keyDigests is the logger given to package fallback, whose fail-open
// line names the key by its text (scope/id: the caller and the client's
// key). Unless log.keys asks for keys in full, it writes a digest of that
// text instead (README.md: logs with keys as digests). The text cannot be
// split back into scope and id (either may hold a slash), so this digest
// is not metrics.KeyDigest's.
type keyDigests struct{ slog.Handler }

// Handle writes r with a "key" attribute of string kind replaced by its digest.
func (h keyDigests) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "key" && a.Value.Kind() == slog.KindString {
			sum := sha256.Sum256([]byte(a.Value.String()))
			a = slog.String("key", "text:"+hex.EncodeToString(sum[:6]))
		}
		out.AddAttrs(a)
		return true
	})
	return h.Handler.Handle(ctx, out)
}

// WithAttrs keeps the digests on the derived handler.
func (h keyDigests) WithAttrs(as []slog.Attr) slog.Handler {
	return keyDigests{h.Handler.WithAttrs(as)}
}

// WithGroup keeps the digests on the derived handler.
func (h keyDigests) WithGroup(name string) slog.Handler {
	return keyDigests{h.Handler.WithGroup(name)}
}
