package guard

import (
	"context"
	"errors"
	"testing"
)

// reply is an error reply of the server, as go-redis returns one.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// TestStoreErrTryLater: a reply that says the server cannot answer now
// (loading, busy, failing over, full, a replica, or without the script,
// after a restart or SCRIPT FLUSH) is ErrUnavailable, which callers retry;
// any other reply is the store's error. NOSCRIPT is answered with EVAL where
// the store sends EVALSHA; yet one reached a claim during make test's
// kill-and-restart storm (fallback's TestChaosStormKillRestart, fresh15:
// "claim …: fallback: primary: redis: NOSCRIPT No matching script"), and
// httpx answered it 500 "store error" for a request it could have run a
// moment later.
func TestStoreErrTryLater(t *testing.T) {
	ctx := context.Background()
	for _, msg := range []string{
		"LOADING Redis is loading the dataset in memory",
		"BUSY Redis is busy running a script",
		"READONLY You can't write against a read only replica.",
		"OOM command not allowed when used memory > 'maxmemory'.",
		"NOSCRIPT No matching script. Please use EVAL.",
	} {
		if err := storeErr(ctx, reply(msg)); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%q: %v, want ErrUnavailable", msg, err)
		}
	}
	for _, msg := range []string{
		"ERR user_script:12: Script attempted to access nonexistent global variable 'x'",
		"WRONGTYPE Operation against a key holding the wrong kind of value",
	} {
		if err := storeErr(ctx, reply(msg)); errors.Is(err, ErrUnavailable) {
			t.Errorf("%q: %v, want the store's error, not ErrUnavailable", msg, err)
		}
	}
}
