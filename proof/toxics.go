package proof

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// Toxic types this package registers with Toxiproxy. They do what
// Toxiproxy's stock latency, reset_peer, timeout, limit_data, bandwidth and
// slicer toxics do, but every send also listens for the stub's interrupt.
// Toxiproxy 2.5's stock toxics send unguarded: when a client closes a
// connection while a reply is in a toxic (a read timeout), the toxic blocks
// for good and removing it deadlocks the whole proxy. The nemesis found
// that within seconds, so it uses these.
const (
	LatencyType   = "idemguard_latency"   // attributes: latency, jitter (ms)
	ResetType     = "idemguard_reset"     // drops the first data and closes the link after timeout (ms)
	SwallowType   = "idemguard_swallow"   // drops all data, closes the link after timeout (ms) from the first
	TruncateType  = "idemguard_truncate"  // passes bytes, then closes the link
	BandwidthType = "idemguard_bandwidth" // rate (KB/s)
	SliceType     = "idemguard_slice"     // splits data into pieces of 1..size bytes, delay (µs) apart
)

// Bites counts, per toxic type of this package, the chunks it dropped or
// cut short and the links it closed: how often the faults hit.
var bites sync.Map // type name -> *atomic.Int64

func bite(typ string) {
	v, _ := bites.LoadOrStore(typ, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// Bites returns how often each of this package's toxic types has hit a
// connection since the process started (a snapshot).
func Bites() map[string]int64 {
	m := map[string]int64{}
	bites.Range(func(k, v any) bool {
		m[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return m
}

// deadLink is how long a send waits before it takes the link for dead:
// the client closed the connection and nothing reads the link any more.
const deadLink = 2 * time.Second

// send passes c on, unless the stub is interrupted first. If nothing
// takes c for deadLink, the link is dead: the stub closes it and stops.
func send(stub *toxics.ToxicStub, c *stream.StreamChunk) bool {
	t := time.NewTimer(deadLink)
	defer t.Stop()
	select {
	case stub.Output <- c:
		return true
	case <-stub.Interrupt:
		// Removed or replaced while holding c: pass it on if the link
		// still reads, else drop it (the client sees a lost reply).
		_ = stub.WriteOutput(c, 50*time.Millisecond)
		return false
	case <-t.C:
		stub.Close()
		return false
	}
}

// hold waits d unless the stub is interrupted first.
func hold(stub *toxics.ToxicStub, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stub.Interrupt:
		return false
	}
}

// pipe runs each chunk through f until the link ends or the stub is
// interrupted. f returns false to stop the toxic.
func pipe(stub *toxics.ToxicStub, f func(c *stream.StreamChunk) bool) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if !f(c) {
				return
			}
		}
	}
}

type latencyToxic struct {
	Latency int64 `json:"latency"`
	Jitter  int64 `json:"jitter"`
}

func (t *latencyToxic) Pipe(stub *toxics.ToxicStub) {
	pipe(stub, func(c *stream.StreamChunk) bool {
		d := t.Latency
		if t.Jitter > 0 {
			d += rand.Int64N(2*t.Jitter+1) - t.Jitter
		}
		if !hold(stub, time.Duration(d)*time.Millisecond) {
			_ = stub.WriteOutput(c, 50*time.Millisecond)
			return false
		}
		return send(stub, c)
	})
}

type resetToxic struct {
	Timeout int64 `json:"timeout"`
}

func (t *resetToxic) Pipe(stub *toxics.ToxicStub) {
	pipe(stub, func(*stream.StreamChunk) bool {
		bite(ResetType)
		if hold(stub, time.Duration(t.Timeout)*time.Millisecond) {
			stub.Close()
		}
		return false
	})
}

type swallowToxic struct {
	Timeout int64 `json:"timeout"`
}

func (t *swallowToxic) Pipe(stub *toxics.ToxicStub) {
	var deadline <-chan time.Time
	for {
		select {
		case <-stub.Interrupt:
			return
		case <-deadline:
			stub.Close()
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if deadline == nil {
				bite(SwallowType)
				deadline = time.After(time.Duration(t.Timeout) * time.Millisecond)
			}
		}
	}
}

type truncateToxic struct {
	Bytes int `json:"bytes"`
}

func (t *truncateToxic) Pipe(stub *toxics.ToxicStub) {
	left := t.Bytes
	pipe(stub, func(c *stream.StreamChunk) bool {
		if len(c.Data) < left {
			left -= len(c.Data)
			return send(stub, c)
		}
		if left > 0 && !send(stub, &stream.StreamChunk{Data: c.Data[:left], Timestamp: c.Timestamp}) {
			return false
		}
		bite(TruncateType)
		stub.Close()
		return false
	})
}

type bandwidthToxic struct {
	Rate int64 `json:"rate"`
}

func (t *bandwidthToxic) Pipe(stub *toxics.ToxicStub) {
	pipe(stub, func(c *stream.StreamChunk) bool {
		if t.Rate > 0 && !hold(stub, time.Duration(len(c.Data))*time.Millisecond/time.Duration(t.Rate)) {
			_ = stub.WriteOutput(c, 50*time.Millisecond)
			return false
		}
		return send(stub, c)
	})
}

type sliceToxic struct {
	Size  int   `json:"size"`
	Delay int64 `json:"delay"`
}

func (t *sliceToxic) Pipe(stub *toxics.ToxicStub) {
	pipe(stub, func(c *stream.StreamChunk) bool {
		data := c.Data
		for len(data) > 0 {
			n := min(len(data), 1+rand.IntN(max(t.Size, 1)))
			if !send(stub, &stream.StreamChunk{Data: data[:n], Timestamp: c.Timestamp}) {
				return false
			}
			data = data[n:]
			if len(data) > 0 && !hold(stub, time.Duration(t.Delay)*time.Microsecond) {
				_ = stub.WriteOutput(&stream.StreamChunk{Data: data, Timestamp: c.Timestamp}, 50*time.Millisecond)
				return false
			}
		}
		return true
	})
}

func init() {
	toxics.Register(LatencyType, new(latencyToxic))
	toxics.Register(ResetType, new(resetToxic))
	toxics.Register(SwallowType, new(swallowToxic))
	toxics.Register(TruncateType, new(truncateToxic))
	toxics.Register(BandwidthType, new(bandwidthToxic))
	toxics.Register(SliceType, new(sliceToxic))
}
