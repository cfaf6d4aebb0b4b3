package conformance

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// StormFigures is what a storm saw.
type StormFigures struct {
	Keys, Copies      int
	Took              time.Duration
	Created, Replayed int64 // 201 answers, and those of them marked replayed
	Conflicts         int64 // 409 answers (retried by the client)
}

func (f StormFigures) String() string {
	return fmt.Sprintf("%d keys × %d copies over 2 instances in %s: %d first answers, %d replays, %d 409s retried",
		f.Keys, f.Copies, f.Took.Round(time.Millisecond), f.Created-f.Replayed, f.Replayed, f.Conflicts)
}

// Storm starts two servers of the binding (two framework instances, each
// with its own guard and Redis client) over one real Redis, sends copies
// copies of each of keys keys, spread over both, at once, and checks
// that each key's effect happened exactly once and that every copy got
// the first one's body. Copies answered 409 are retried after a short
// pause, as a client honouring Retry-After would (sooner, to keep the
// test short).
func Storm(t *testing.T, newServer NewServer, keys, copies int) StormFigures {
	prefix := testenv.Prefix(t)
	var mu sync.Mutex
	effects := make(map[string]int, keys)
	handler := func(_ context.Context, r Req) Resp {
		k := string(r.Body)
		mu.Lock()
		effects[k]++
		n := effects[k]
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // an effect that takes a while, so copies overlap
		return Resp{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}},
			Body: fmt.Appendf(nil, "%s effect %d fence %d", k, n, r.Lease.Fence)}
	}
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	var clients [2]*client
	for i := range clients {
		g := guard.New(guardenv.Store(t, guard.RedisOptions{Prefix: prefix}), guard.Options{})
		clients[i] = newClient(t, newServer(t, g, opts, handler))
	}

	var created, replayed, conflicts atomic.Int64
	bodies := make([][]byte, keys)
	var bodyMu sync.Mutex
	jobs := make(chan int)
	const workers = 64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				k, copyNo := j/copies, j%copies
				c := clients[copyNo%2]
				id := "storm-" + strconv.Itoa(k)
				for attempt := 0; ; attempt++ {
					r, err := c.try(context.Background(), "POST", "/storm", id, key, id)
					if err != nil {
						t.Errorf("%s: %v", id, err)
						break
					}
					if r.status == http.StatusConflict && attempt < 1000 {
						conflicts.Add(1)
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if r.status != http.StatusCreated {
						t.Errorf("%s: %d %s", id, r.status, r.body)
						break
					}
					created.Add(1)
					if r.header.Get(httpx.ReplayedHeader) == "true" {
						replayed.Add(1)
					}
					bodyMu.Lock()
					if bodies[k] == nil {
						bodies[k] = r.body
					} else if !bytes.Equal(bodies[k], r.body) {
						t.Errorf("%s: copies got %q and %q", id, bodies[k], r.body)
					}
					bodyMu.Unlock()
					break
				}
			}
		})
	}
	for j := range keys * copies {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	f := StormFigures{Keys: keys, Copies: copies, Took: time.Since(start), Created: created.Load(),
		Replayed: replayed.Load(), Conflicts: conflicts.Load()}

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != keys {
		t.Errorf("%d keys had an effect, want %d", len(effects), keys)
	}
	for k, n := range effects {
		if n != 1 {
			t.Errorf("key %s: %d effects, want exactly 1", k, n)
		}
	}
	if want := int64(keys * copies); f.Created != want {
		t.Errorf("%d copies answered 201, want %d", f.Created, want)
	}
	if want := int64(keys * (copies - 1)); f.Replayed != want {
		t.Errorf("%d replays, want %d", f.Replayed, want)
	}
	return f
}
