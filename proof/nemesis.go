package proof

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemguard/idemguard/internal/wait"
)

// FaultKind makes one random fault of a kind from a seeded source.
type FaultKind struct {
	Name string
	Make func(r *rand.Rand) Fault
}

// Fault kinds the nemesis draws from.
var (
	// Latency delays requests or replies by 1–30 ms (± jitter).
	Latency = FaultKind{"latency", func(r *rand.Rand) Fault {
		return Fault{Type: LatencyType, Stream: pick(r, "upstream", "downstream"),
			Attributes: map[string]any{"latency": 1 + r.IntN(30), "jitter": r.IntN(10)}}
	}}
	// ResetRequest resets a share of connections on their next request,
	// before it reaches Redis: the command does not run.
	ResetRequest = FaultKind{"reset-request", func(r *rand.Rand) Fault {
		return Fault{Type: ResetType, Stream: "upstream", Toxicity: 0.3 + 0.5*r.Float32(),
			Attributes: map[string]any{"timeout": r.IntN(5)}}
	}}
	// ResetReply resets a share of connections when Redis replies: the
	// command ran but the client never hears so, and go-redis retries it.
	ResetReply = FaultKind{"reset-reply", func(r *rand.Rand) Fault {
		return Fault{Type: ResetType, Stream: "downstream", Toxicity: 0.3 + 0.5*r.Float32(),
			Attributes: map[string]any{"timeout": r.IntN(5)}}
	}}
	// DropReply swallows replies on a share of connections and closes them
	// after 5–60 ms: the command ran, the reply is lost, the client retries.
	DropReply = FaultKind{"drop-reply", func(r *rand.Rand) Fault {
		return Fault{Type: SwallowType, Stream: "downstream", Toxicity: 0.3 + 0.5*r.Float32(),
			Attributes: map[string]any{"timeout": 5 + r.IntN(55)}}
	}}
	// TruncateReply lets 1–12 bytes of a reply through, then closes.
	TruncateReply = FaultKind{"truncate-reply", func(r *rand.Rand) Fault {
		return Fault{Type: TruncateType, Stream: "downstream", Toxicity: 0.3 + 0.5*r.Float32(),
			Attributes: map[string]any{"bytes": 1 + r.IntN(12)}}
	}}
	// Bandwidth limits a direction to 2–16 KB/s.
	Bandwidth = FaultKind{"bandwidth", func(r *rand.Rand) Fault {
		return Fault{Type: BandwidthType, Stream: pick(r, "upstream", "downstream"),
			Attributes: map[string]any{"rate": 2 + r.IntN(15)}}
	}}
	// Slice splits replies into 1–7 byte pieces, so replies are read in parts.
	Slice = FaultKind{"slice", func(r *rand.Rand) Fault {
		return Fault{Type: SliceType, Stream: "downstream",
			Attributes: map[string]any{"size": 7, "delay": r.IntN(200)}}
	}}
)

// Partition drops everything one direction carries, requests or
// replies, for as long as it is held, on every connection: the link
// stays open and nothing arrives. It is not among DefaultFaults; hold it
// for about a lease to cut a holder off.
var Partition = FaultKind{"partition", func(r *rand.Rand) Fault {
	return Fault{Type: SwallowType, Stream: pick(r, "upstream", "downstream"), Attributes: map[string]any{"timeout": 600_000}}
}}

// DefaultFaults is what a Nemesis draws from when NemesisOptions.Faults is
// empty: every kind above but Partition.
var DefaultFaults = []FaultKind{Latency, ResetRequest, ResetReply, DropReply, TruncateReply, Bandwidth, Slice}

func pick(r *rand.Rand, s ...string) string { return s[r.IntN(len(s))] }

// NemesisOptions configure a Nemesis. The zero value works: seed 0, the
// default faults, 0–15 ms quiet gaps, faults held 30–150 ms, one or two
// at a time.
type NemesisOptions struct {
	Seed             uint64        // the schedule is a function of the seed alone
	Faults           []FaultKind   // kinds drawn from; default DefaultFaults
	MinGap, MaxGap   time.Duration // quiet time between faults; default 0, 15ms
	MinHold, MaxHold time.Duration // how long a fault lasts; default 30ms, 150ms
	MaxAtOnce        int           // faults applied together; default 2
}

func (o NemesisOptions) withDefaults() NemesisOptions {
	if len(o.Faults) == 0 {
		o.Faults = DefaultFaults
	}
	if o.MaxGap <= 0 {
		o.MinGap, o.MaxGap = 0, 15*time.Millisecond
	}
	if o.MaxHold <= 0 {
		o.MinHold, o.MaxHold = 30*time.Millisecond, 150*time.Millisecond
	}
	if o.MaxAtOnce <= 0 {
		o.MaxAtOnce = 2
	}
	return o
}

// Step is one entry of a nemesis schedule: wait Gap, apply Faults, hold
// them for Hold, remove them.
type Step struct {
	Gap, Hold time.Duration
	Faults    []Fault
}

// Schedule returns the first n steps of the schedule of opts: the same
// seed always gives the same steps.
func Schedule(opts NemesisOptions, n int) []Step {
	opts = opts.withDefaults()
	r := rand.New(rand.NewPCG(opts.Seed, 0x1de6a7d))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(r.Int64N(int64(hi-lo)))
	}
	steps := make([]Step, n)
	for i := range steps {
		s := Step{Gap: between(opts.MinGap, opts.MaxGap), Hold: between(opts.MinHold, opts.MaxHold)}
		k := 1 + r.IntN(opts.MaxAtOnce)
		used := map[string]bool{}
		for _, j := range r.Perm(len(opts.Faults))[:min(k, len(opts.Faults))] {
			// One toxic per direction: a toxic that closes the link would
			// leave one before it with nobody to send to.
			if f := opts.Faults[j].Make(r); !used[f.Stream] {
				used[f.Stream] = true
				s.Faults = append(s.Faults, f)
			}
		}
		steps[i] = s
	}
	return steps
}

// Nemesis applies a seeded random schedule of faults to a Proxy while a
// test runs. The schedule depends on the seed only; which operations a
// fault hits depends on timing as well, so a seed reproduces the faults,
// not the interleaving.
type Nemesis struct {
	proxy *Proxy
	opts  NemesisOptions

	mu      sync.Mutex
	applied []string
}

// NewNemesis returns a nemesis for proxy. It does nothing until Run.
func NewNemesis(proxy *Proxy, opts NemesisOptions) *Nemesis {
	return &Nemesis{proxy: proxy, opts: opts.withDefaults()}
}

// Seed is the seed of the nemesis' schedule.
func (n *Nemesis) Seed() uint64 { return n.opts.Seed }

// Run applies the schedule until ctx is done, then removes every fault it
// applied and returns. It returns the first error the proxy gave.
func (n *Nemesis) Run(ctx context.Context) error {
	start := time.Now()
	const batch = 64
	for i := 0; ; i += batch {
		for _, s := range Schedule(n.opts, i+batch)[i:] {
			if !wait.For(ctx, s.Gap) {
				return nil
			}
			var names []string
			for _, f := range s.Faults {
				name, err := n.proxy.Add(f)
				if err != nil {
					n.removeAll(names)
					return err
				}
				names = append(names, name)
				n.mu.Lock()
				n.applied = append(n.applied, fmt.Sprintf("+%s %s for %s", time.Since(start).Round(time.Millisecond), f, s.Hold.Round(time.Millisecond)))
				n.mu.Unlock()
			}
			wait.For(ctx, s.Hold)
			if err := n.removeAll(names); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
		}
	}
}

func (n *Nemesis) removeAll(names []string) error {
	var first error
	for _, name := range names {
		if err := n.proxy.Remove(name); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Applied lists the faults applied so far, with their start offsets.
func (n *Nemesis) Applied() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.applied...)
}
