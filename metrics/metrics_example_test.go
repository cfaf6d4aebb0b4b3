package metrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

func ExampleNewLogger() {
	h := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a fixed output for the example
			}
			return a
		},
	})
	log := metrics.NewLogger(slog.New(h), metrics.LogOptions{})
	key := guard.Key{Scope: "orders-consumer", ID: "msg-7"}
	log.Observe(context.Background(), guard.Event{Kind: guard.EventAcquired, Key: key, Attempt: 1})
	log.Observe(context.Background(), guard.Event{Kind: guard.EventReplayed, Key: key})
	log.Observe(context.Background(), guard.Event{Kind: guard.EventMismatch, Key: key})
	// Output:
	// level=INFO msg="idemguard replayed" event=replayed scope=orders-consumer key=9d9fd7fb17ce
	// level=WARN msg="idemguard mismatch" event=mismatch scope=orders-consumer key=9d9fd7fb17ce
}

// Keys are logged as a digest unless LogKeys; the digest is the same in
// every process, so one key's records can be found by computing it.
func ExampleKeyDigest() {
	key := guard.Key{Scope: "orders-consumer", ID: "msg-7"}
	fmt.Println(metrics.KeyDigest(key))
	// Output: 9d9fd7fb17ce
}

// Log replays and conflicts and hand the events to another observer too.
func ExampleTee() {
	var replays int
	count := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventReplayed {
			replays++
		}
	})
	logs := metrics.NewLogger(slog.New(slog.DiscardHandler), metrics.LogOptions{})
	obs := metrics.Tee(count, logs)
	obs.Observe(context.Background(), guard.Event{Kind: guard.EventReplayed, Key: guard.Key{Scope: "s", ID: "i"}})
	fmt.Println("replayed:", replays)
	// Output:
	// replayed: 1
}

// Error texts name keys; Redact hides them behind their digest, as the
// Logger does unless LogKeys.
func ExampleRedact() {
	key := guard.Key{Scope: "POST /charges", ID: "ch_1842"}
	err := fmt.Errorf("claim %s: card ch_1842 declined", key)
	fmt.Println(metrics.Redact(err.Error(), key))
	// Output: claim POST /charges/<key 236c8ad0c7ec>: card <key 236c8ad0c7ec> declined
}
