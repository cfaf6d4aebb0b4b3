package testenv

import (
	"context"
	"runtime"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// GoroutineID returns the id of the calling goroutine, from the first line
// of its stack ("goroutine 42 [running]:").
func GoroutineID() string {
	var buf [64]byte
	return strings.Fields(string(buf[:runtime.Stack(buf[:], false)]))[1]
}

// Senders is a go-redis hook that records the goroutine every command (or
// pipeline) of a client is sent from: a test that must know whether a call
// ran on its caller's goroutine adds it with AddHook.
type Senders struct {
	mu  sync.Mutex
	ids []string
}

// DialHook implements redis.Hook.
func (s *Senders) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (s *Senders) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.add()
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (s *Senders) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.add()
		return next(ctx, cmds)
	}
}

func (s *Senders) add() {
	id := GoroutineID()
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
}

// IDs returns the goroutine ids recorded so far, in order.
func (s *Senders) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}
