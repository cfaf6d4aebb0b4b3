package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/httpx"
)

// Scenario names of the adapters.
const (
	HTTP       = "http"        // POST through httpx.Guard, a new key each
	HTTPReplay = "http-replay" // POST through httpx.Guard with a completed key: a replay
	HTTPPlain  = "http-plain"  // baseline: the same POST and handler, unguarded
	// The floors: unguarded POSTs whose handler makes the native Redis calls
	// a guard could not do with less, through the client's autopipeliner.
	// Their ratio to http-plain is the most the http rows could reach on
	// the machine that runs them.
	HTTPGetAuto      = "http-get-auto"       // floor of http-replay: the handler GETs a stored result first
	HTTPSetNXSetAuto = "http-setnx+set-auto" // floor of http: the handler runs SET NX PX before its work, SET PX after
	Consumer         = "consumer"            // a Redis Stream batch of 16 new messages through consumerx.Processor.ProcessBatch
	ConsumerPlain    = "consumer-plain"      // baseline: the same stream batch, handled unguarded
	ConsumerStorm    = "consumer-storm"      // consumerx.Wrap under Keys × Duplicates redeliveries
)

func init() {
	scenarios = append(scenarios,
		scenario{name: HTTPPlain, about: "baseline: POST to the same handler over loopback HTTP, unguarded", prepare: prepareHTTP(false, false)},
		scenario{name: HTTP, baseline: HTTPPlain, about: "POST through httpx.Guard over loopback HTTP, a new key each", prepare: prepareHTTP(true, false)},
		scenario{name: HTTPReplay, baseline: HTTPPlain, about: "POST through httpx.Guard over loopback HTTP with a completed key (a replay)", prepare: prepareHTTP(true, true)},
		scenario{name: HTTPGetAuto, baseline: HTTPPlain, about: "floor of http-replay: the unguarded POST, its handler first GETs a stored result of its key through the client's autopipeliner", prepare: prepareHTTPFloor(getFloor)},
		scenario{name: HTTPSetNXSetAuto, baseline: HTTPPlain, about: "floor of http: the unguarded POST, its handler runs SET NX PX on a new key before its work and SET PX of the result after, through the client's autopipeliner", prepare: prepareHTTPFloor(setNXSetFloor)},
		scenario{name: ConsumerPlain, about: "baseline: one op adds 16 messages to a Redis Stream (one pipeline of XADD), reads 16 with XREADGROUP, runs the handler on each, acknowledges them with one XACK", prepare: prepareConsumer(false)},
		scenario{name: Consumer, baseline: ConsumerPlain, about: "the same stream batch through consumerx.Processor.ProcessBatch: its 16 claims in one round trip, its completions in another", prepare: prepareConsumer(true)},
		scenario{name: ConsumerStorm, baseline: NaiveStormAuto, storm: true, about: "consumerx.Wrap under Keys × Duplicates concurrent deliveries", prepare: prepareConsumerStorm},
	)
}

// prepareHTTP serves a handler on loopback, behind httpx.Guard when
// guarded, and returns an op that POSTs to it with a new key each time,
// or, for replays, with one of Keys keys completed beforehand.
func prepareHTTP(guarded, replays bool) func(context.Context, *env) (op, error) {
	return serveHTTP(guarded, replays, nil)
}

// floor is the native Redis work of a floor row's handler, on the name of
// the request's key: before its own work and after it.
type floor struct {
	stored bool // the op cycles over Keys results stored beforehand, as replays do
	before func(ctx context.Context, c redis.Cmdable, name string, res []byte, ttl time.Duration) error
	after  func(ctx context.Context, c redis.Cmdable, name string, res []byte, ttl time.Duration) error // may be nil
}

// getFloor reads the key's stored result: what a replay must do at least.
var getFloor = &floor{stored: true, before: func(ctx context.Context, c redis.Cmdable, name string, res []byte, _ time.Duration) error {
	v, err := c.Get(ctx, name).Bytes()
	if err == nil && len(v) != len(res) {
		err = fmt.Errorf("GET %s returned %d bytes, want %d", name, len(v), len(res))
	}
	return err
}}

// setNXSetFloor takes a new key before the work and stores the result
// after it: what a new key must do at least (setnx+set-auto around the
// handler).
var setNXSetFloor = &floor{
	before: func(ctx context.Context, c redis.Cmdable, name string, _ []byte, _ time.Duration) error {
		ok, err := c.SetNX(ctx, name, "token", 30*time.Second).Result()
		if err == nil && !ok {
			err = fmt.Errorf("fresh key %s exists", name)
		}
		return err
	},
	after: func(ctx context.Context, c redis.Cmdable, name string, res []byte, ttl time.Duration) error {
		return c.Set(ctx, name, res, ttl).Err()
	},
}

// prepareHTTPFloor serves the unguarded handler with f's Redis work
// around it, through the client's autopipeliner, as the guard's default
// store sends its calls when many are under way.
func prepareHTTPFloor(f *floor) func(context.Context, *env) (op, error) {
	return serveHTTP(false, f.stored, f)
}

// serveHTTP serves the row's handler on loopback (see prepareHTTP; a
// floor's work around it when f is not nil) and returns the row's op.
func serveHTTP(guarded, replays bool, f *floor) func(context.Context, *env) (op, error) {
	return func(ctx context.Context, e *env) (op, error) {
		res := e.result()
		var c redis.Cmdable
		if f != nil {
			var err error
			if c, err = e.cmdable(true); err != nil {
				return nil, err
			}
		}
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var name string
			if f != nil {
				name = e.prefix + "p:" + r.Header.Get(httpx.DefaultHeader)
				if err := f.before(r.Context(), c, name, res, e.opts.TTL); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if e.opts.Work > 0 {
				time.Sleep(e.opts.Work) // the business effect
			}
			if f != nil && f.after != nil {
				if err := f.after(r.Context(), c, name, res, e.opts.TTL); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(res)
		})
		if guarded {
			h = httpx.Guard(e.guard(), httpx.Options{SingleCaller: true})(h) // one benchmark client
		}
		mux := http.NewServeMux()
		mux.Handle("POST /orders", h)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		tr := &http.Transport{MaxIdleConns: e.opts.Concurrency, MaxIdleConnsPerHost: e.opts.Concurrency}
		client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		e.close = func() {
			tr.CloseIdleConnections()
			_ = srv.Close()
		}
		url := "http://" + ln.Addr().String() + "/orders"
		body := []byte(`{"item":"book","quantity":1}`)
		post := func(ctx context.Context, key int64, replay bool) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(httpx.DefaultHeader, httpKey(key))
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusCreated || n != int64(len(res)) {
				return fmt.Errorf("POST: status %d, %d bytes", resp.StatusCode, n)
			}
			if got := resp.Header.Get(httpx.ReplayedHeader) == "true"; got != replay {
				return fmt.Errorf("POST: %s %t, want %t", httpx.ReplayedHeader, got, replay)
			}
			return nil
		}
		if !replays {
			return func(ctx context.Context, i int64) error { return post(ctx, i, false) }, nil
		}
		keys := int64(e.opts.Keys)
		if f != nil { // a floor reads results stored as plain strings
			if err := e.storeResults(ctx, keys, func(i int64) string { return e.prefix + "p:" + httpKey(i) }); err != nil {
				return nil, err
			}
			return func(ctx context.Context, i int64) error { return post(ctx, i%keys, false) }, nil
		}
		_, _, _, err = drive(ctx, min(e.opts.Concurrency, 64), keys, 0, func(ctx context.Context, i int64) error {
			return post(ctx, i, false)
		})
		if err != nil {
			return nil, err
		}
		// The measured ops dial their connections, as their baseline's do.
		tr.CloseIdleConnections()
		return func(ctx context.Context, i int64) error { return post(ctx, i%keys, true) }, nil
	}
}

// httpKey is the Idempotency-Key of the http rows' key i.
func httpKey(i int64) string { return "k" + strconv.FormatInt(i, 10) }

var quietConsumer = consumerx.Options{Logger: discardLogger}

// ConsumerBatch is how many messages one op of the consumer rows adds,
// reads, handles and acknowledges.
const ConsumerBatch = 16

// prepareConsumer makes the op of the consumer rows: a batch of
// ConsumerBatch messages added to a stream of the row's, read back by a
// consumer group, handled (guarded: through ProcessBatch) and
// acknowledged. Each op reads exactly ConsumerBatch entries: it adds its
// own before it reads, and no read takes more than an op adds.
func prepareConsumer(guarded bool) func(context.Context, *env) (op, error) {
	return func(ctx context.Context, e *env) (op, error) {
		c := e.t.client
		stream := e.prefix + "stream"
		if err := c.XGroupCreateMkStream(ctx, stream, "bench", "$").Err(); err != nil {
			return nil, err
		}
		// As every key a row writes, the stream is kept for Options.TTL.
		if err := c.PExpire(ctx, stream, e.opts.TTL).Err(); err != nil {
			return nil, err
		}
		payload := string(e.result())
		h := func(context.Context, consumerx.Message) error {
			if e.opts.Work > 0 {
				time.Sleep(e.opts.Work) // the business effect
			}
			return nil
		}
		var proc *consumerx.Processor
		if guarded {
			var err error
			if proc, err = consumerx.NewProcessor(e.guard(), "bench", quietConsumer); err != nil {
				return nil, err
			}
		}
		values := []any{"payload", payload}
		return func(ctx context.Context, i int64) error {
			if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for range ConsumerBatch {
					p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
				}
				return nil
			}); err != nil {
				return err
			}
			res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "bench", Consumer: "bench",
				Streams: []string{stream, ">"}, Count: ConsumerBatch, Block: -1}).Result()
			if err != nil {
				return err
			}
			if len(res) != 1 || len(res[0].Messages) != ConsumerBatch {
				return fmt.Errorf("consumer op %d read %d streams, want 1 with %d entries", i, len(res), ConsumerBatch)
			}
			xms := res[0].Messages
			msgs := make([]consumerx.Message, len(xms))
			ids := make([]string, len(xms))
			for j, xm := range xms {
				p, _ := xm.Values["payload"].(string)
				msgs[j] = consumerx.Message{ID: xm.ID, Payload: []byte(p), Raw: xm}
				ids[j] = xm.ID
			}
			if guarded {
				for j, r := range proc.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{}) {
					if r.Outcome != consumerx.Processed {
						return fmt.Errorf("new message %s: %s: %w", msgs[j].ID, r.Outcome, r.Err)
					}
				}
			} else {
				for j := range msgs {
					if err := h(ctx, msgs[j]); err != nil {
						return err
					}
				}
			}
			return c.XAck(ctx, stream, "bench", ids...).Err()
		}, nil
	}
}

func prepareConsumerStorm(_ context.Context, e *env) (op, error) {
	payload := e.result()
	wrapped, err := consumerx.Wrap(e.guard(), "bench", func(_ context.Context, m consumerx.Message) error {
		k, err := strconv.ParseInt(m.ID, 10, 64)
		if err != nil {
			return err
		}
		e.effect(k)
		return nil
	}, quietConsumer)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, i int64) error {
		o, err := wrapped(ctx, consumerx.Message{ID: strconv.FormatInt(e.stormKey(i), 10), Payload: payload})
		switch o {
		case consumerx.Processed:
			return nil
		case consumerx.Duplicate:
			e.replays.Add(1)
			return nil
		case consumerx.InProgress:
			e.conflicts.Add(1) // the broker redelivers it later
			return nil
		}
		return fmt.Errorf("message %d: %s: %w", e.stormKey(i), o, err)
	}, nil
}
