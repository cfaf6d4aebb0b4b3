package fiberx_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// keptRecords is a slog.Handler that keeps its records to handle later,
// as a batching or asynchronous handler (an OpenTelemetry log bridge) does.
type keptRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (*keptRecords) Enabled(context.Context, slog.Level) bool { return true }
func (k *keptRecords) Handle(_ context.Context, r slog.Record) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.records = append(k.records, r)
	return nil
}
func (k *keptRecords) WithAttrs([]slog.Attr) slog.Handler { return k }
func (k *keptRecords) WithGroup(string) slog.Handler      { return k }

// TestLoggedPathOutlivesRequest: the path the guard logs (here, of a
// handler that panicked) is the request's, not a view of Fiber's buffer
// that the next requests overwrite before a handler that keeps records
// writes them.
func TestLoggedPathOutlivesRequest(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	logs := &keptRecords{}
	app := newApp()
	app.Post("/p/:id", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true, Logger: slog.New(logs)}}), func(c fiber.Ctx) error {
		if c.Params("id") == "aaaaaaaa" {
			panic("boom")
		}
		return c.SendStatus(http.StatusCreated)
	})
	base := listen(t, app)
	tr := &http.Transport{MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	send := func(path, key string) {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader("{}"))
		req.Header.Set(httpx.DefaultHeader, key)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	send("/p/aaaaaaaa", "k0")
	for i := range 8 {
		send("/p/bbbbbbbb", "k"+string(rune('1'+i)))
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	var paths []string
	for _, r := range logs.records {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "path" {
				paths = append(paths, a.Value.String())
			}
			return true
		})
	}
	if len(paths) != 1 || paths[0] != "/p/aaaaaaaa" {
		t.Fatalf("logged paths %q, want [/p/aaaaaaaa] (the panicking request's)", paths)
	}
}
