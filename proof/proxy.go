package proof

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Proxy is an in-process Toxiproxy TCP proxy in front of one upstream
// server (a Redis). Faults added to it apply to the connections through it:
// "upstream" faults to what clients send, "downstream" faults to the
// server's replies.
type Proxy struct {
	p *toxiproxy.Proxy

	mu   sync.Mutex
	next int // numbers toxic names
}

// NewProxy starts a proxy on a free loopback port in front of upstream
// (host:port). Close stops it and closes every connection through it.
func NewProxy(upstream string) (*Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proof: start proxy to %s: %w", upstream, err)
	}
	return &Proxy{p: p}, nil
}

// Addr is the proxy's host:port; clients dial it instead of the upstream.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() { p.p.Stop() }

// Fault is one Toxiproxy toxic: its type (one of this package's, such as
// LatencyType, or a stock Toxiproxy type), the direction it acts on, the share of connections it
// hits, and its attributes as Toxiproxy documents them.
type Fault struct {
	Type       string         // toxic type
	Stream     string         // "upstream" (requests) or "downstream" (replies)
	Toxicity   float32        // share of connections affected, in (0, 1]; 0 means 1
	Attributes map[string]any // the toxic's attributes, e.g. {"latency": 20}
}

// String describes the fault for logs, e.g. "idemguard_latency/downstream{jitter=3 latency=20}@1.00".
func (f Fault) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(f.Attributes)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%v", k, f.Attributes[k])
	}
	return fmt.Sprintf("%s/%s{%s}@%.2f", f.Type, f.Stream, b.String(), f.toxicity())
}

func (f Fault) toxicity() float32 {
	if f.Toxicity <= 0 || f.Toxicity > 1 {
		return 1
	}
	return f.Toxicity
}

// Add applies the fault to current and new connections and returns its
// name, for Remove.
func (p *Proxy) Add(f Fault) (string, error) {
	p.mu.Lock()
	p.next++
	name := fmt.Sprintf("%s_%s_%d", f.Type, f.Stream, p.next)
	p.mu.Unlock()
	body, err := json.Marshal(map[string]any{
		"name": name, "type": f.Type, "stream": f.Stream,
		"toxicity": f.toxicity(), "attributes": f.Attributes,
	})
	if err != nil {
		return "", fmt.Errorf("proof: fault %s: %w", f, err)
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		return "", fmt.Errorf("proof: add fault %s: %w", f, err)
	}
	return name, nil
}

// Remove takes a fault off the proxy. Some toxics (timeout) close the
// connections they held when removed.
func (p *Proxy) Remove(name string) error {
	if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("proof: remove fault %s: %w", name, err)
	}
	return nil
}

// DropReplyType is the toxic type this package registers with Toxiproxy:
// on the downstream stream it drops whole replies the server already sent
// (the command ran) and closes the client's connection, as many times as
// its ReplyDropper is armed. go-redis then sends the command again on a
// new connection, so the script runs twice on the server.
const DropReplyType = "idemguard_drop_reply"

// ReplyDropper controls the DropReplyType toxic installed by
// Proxy.DropReplies: it drops the next replies it is armed for and keeps
// what it dropped and what it let through next, so a test can compare the
// first run's reply with the retry's byte for byte.
type ReplyDropper struct {
	mu        sync.Mutex
	armed     int
	onDrop    func(reply []byte)
	dropped   [][]byte
	forwarded [][]byte // the last reply let through after each drop
}

// Arm makes the dropper drop the next n replies. onDrop, if not nil, runs
// after a reply is dropped and before the client's connection is closed,
// so nothing the client sends again can reach the server before it returns.
func (d *ReplyDropper) Arm(n int, onDrop func(reply []byte)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed, d.onDrop = n, onDrop
}

// Dropped returns the replies dropped so far, in order.
func (d *ReplyDropper) Dropped() [][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.dropped)
}

// Forwarded returns, for each drop, the last reply let through after it
// (with one command at a time: the retried command's reply, which follows
// the new connection's handshake), in order.
func (d *ReplyDropper) Forwarded() [][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.forwarded)
}

// Reset forgets the recorded replies and disarms the dropper.
func (d *ReplyDropper) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed, d.onDrop, d.dropped, d.forwarded = 0, nil, nil, nil
}

// take decides the fate of one reply chunk: true means drop it.
func (d *ReplyDropper) take(data []byte) (drop bool, hook func([]byte)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed > 0 {
		d.armed--
		d.dropped = append(d.dropped, bytes.Clone(data))
		d.forwarded = append(d.forwarded, nil)
		return true, d.onDrop
	}
	if n := len(d.forwarded); n > 0 {
		d.forwarded[n-1] = bytes.Clone(data)
	}
	return false, nil
}

var (
	droppersMu sync.Mutex
	droppers   = map[string]*ReplyDropper{}
)

// DropReplies installs a DropReplyType toxic on the downstream stream of
// every connection and returns its control, disarmed. The proxy must carry
// one command at a time per connection for "a reply" to be one chunk; a
// client with PoolSize 1 does that.
func (p *Proxy) DropReplies() (*ReplyDropper, error) {
	d := new(ReplyDropper)
	p.mu.Lock()
	p.next++
	id := fmt.Sprintf("%p-%d", p, p.next)
	p.mu.Unlock()
	droppersMu.Lock()
	droppers[id] = d
	droppersMu.Unlock()
	if _, err := p.Add(Fault{Type: DropReplyType, Stream: "downstream", Attributes: map[string]any{"control": id}}); err != nil {
		return nil, err
	}
	return d, nil
}

// dropReplyToxic is the toxic behind DropReplyType.
type dropReplyToxic struct {
	Control string `json:"control"`
}

func (t *dropReplyToxic) Pipe(stub *toxics.ToxicStub) {
	droppersMu.Lock()
	d := droppers[t.Control]
	droppersMu.Unlock()
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if d != nil {
				if drop, hook := d.take(c.Data); drop {
					if hook != nil {
						hook(c.Data)
					}
					stub.Close()
					return
				}
			}
			if !send(stub, c) {
				return
			}
		}
	}
}

func init() {
	toxics.Register(DropReplyType, new(dropReplyToxic))
}
