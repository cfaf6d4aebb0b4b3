package kafkax

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// revokeGroup is a group "billing" on topic "orders" (3 partitions) of
// members whose clients give Consumers kafkax's rebalance callbacks.
type revokeGroup struct {
	t        *testing.T
	addrs    []string
	producer *kgo.Client
	manual   *kgo.Client // a partitionProducer
	g        *guard.Guard
	done     chan error
	members  int
	stop     context.CancelFunc
	runCtx   context.Context

	mu       sync.Mutex
	revoked  map[int32]bool // partitions revoked from member A, told A's own callback
	assigned atomic.Int32   // partitions assigned to A
}

func newRevokeGroup(t *testing.T) *revokeGroup {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	rg := &revokeGroup{t: t, addrs: addrs, producer: producer, manual: partitionProducer(t, addrs), g: g, done: make(chan error, 2), revoked: map[int32]bool{}}
	rg.runCtx, rg.stop = context.WithCancel(context.Background())
	return rg
}

// member starts a member's Consumer of h; A's callbacks of its own record
// what the rebalance does to it, behind kafkax's.
func (rg *revokeGroup) member(name string, h consumerx.Handler, opts Options) {
	t := rg.t
	var onRevoked, onAssigned func(context.Context, *kgo.Client, map[string][]int32)
	if name == "A" {
		onRevoked = func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			rg.mu.Lock()
			defer rg.mu.Unlock()
			for _, p := range m["orders"] {
				rg.revoked[p] = true
			}
		}
		onAssigned = func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			rg.assigned.Add(int32(len(m["orders"])))
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(rg.addrs...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchMinBytes(1<<20), // a fetch waits its MaxWait: it takes every partition's records
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		OnPartitionsRevoked(onRevoked), OnPartitionsLost(nil), kgo.OnPartitionsAssigned(onAssigned))
	if err != nil {
		t.Fatal(err)
	}
	opts.Process.Logger = testenv.Logger(t)
	opts.RetryDelay = 20 * time.Millisecond
	c, err := New(cl, rg.g, h, opts)
	if err != nil {
		cl.Close()
		t.Fatal(err)
	}
	rg.members++
	go func() {
		err := c.Run(rg.runCtx)
		cl.Close()
		rg.done <- err
	}()
}

// wait stops the members and waits for their Runs.
func (rg *revokeGroup) wait() {
	rg.stop()
	for range rg.members {
		if err := <-rg.done; err != nil {
			rg.t.Error(err)
		}
	}
	rg.members = 0
}

// warm produces a record to each partition once A has them all and waits
// until they are committed, so that A's next poll takes every partition.
func (rg *revokeGroup) warm() {
	t := rg.t
	testenv.WaitFor(t, 20*time.Second, "A assigned every partition", func() bool { return rg.assigned.Load() == 3 })
	for p := range int32(3) {
		rg.produce(&kgo.Record{Topic: "orders", Partition: p, Value: []byte("warm")})
	}
	testenv.WaitFor(t, 20*time.Second, "the warm-up records committed", func() bool { return lag(t, rg.producer, "billing", "orders") == 0 })
}

// produce produces recs in one request (produceTogether): a fetch
// holds all of them or none.
func (rg *revokeGroup) produce(recs ...*kgo.Record) {
	rg.t.Helper()
	produceTogether(rg.t, rg.manual, recs...)
}

// revokedFromA returns the partitions revoked from A so far.
func (rg *revokeGroup) revokedFromA() []int32 {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	var ps []int32
	for p := range rg.revoked {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// A holds the first record of each partition in a handler that waits on
// its context, on a client without kgo.BlockRebalanceOnPoll; B joins and
// takes a partition. A's handler of the revoked partition sees its context
// end with ErrRevoked at once and returns: the record is Interrupted and
// released, and B runs it, while A's other handlers still hold their
// records (no waiting for the guard's lease). A's own revoke callback is
// called behind kafkax's. Every record's effect happens once, and the
// group ends with everything committed.
func TestRevokedPartitionsHandlerInterrupted(t *testing.T) {
	const n = 30
	rg := newRevokeGroup(t)
	var (
		mu       sync.Mutex
		effects  = map[string][]string{} // id → members that ran it to success
		running  = map[string]int{}
		overlap  []string
		heldOnce = map[int32]string{} // partition → the id of its record A holds
		held     atomic.Int32
		release  = make(chan struct{})
		aOut     = map[string]consumerx.Outcome{} // A's last outcome of each record
		aErr     = map[string]error{}
	)
	handler := func(member string) consumerx.Handler {
		return func(ctx context.Context, msg consumerx.Message) error {
			r := msg.Raw.(*kgo.Record)
			mu.Lock()
			running[msg.ID]++
			if running[msg.ID] > 1 {
				overlap = append(overlap, msg.ID)
			}
			_, seen := heldOnce[r.Partition]
			hold := member == "A" && string(r.Value) != "warm" && !seen
			if hold {
				heldOnce[r.Partition] = msg.ID
			}
			mu.Unlock()
			var err error
			if hold {
				held.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
					err = context.Cause(ctx)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			running[msg.ID]--
			if err == nil {
				effects[msg.ID] = append(effects[msg.ID], member)
			}
			return err
		}
	}
	var releaseOnce sync.Once
	defer func() {
		releaseOnce.Do(func() { close(release) })
		rg.wait()
	}()
	rg.member("A", handler("A"), Options{Process: consumerx.Options{OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
		mu.Lock()
		defer mu.Unlock()
		aOut[msg.ID], aErr[msg.ID] = o, err
	}}})
	rg.warm()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i % 3), Value: fmt.Appendf(nil, "charge %d", i)})
	}
	rg.produce(recs...)
	testenv.WaitFor(t, 20*time.Second, "A holding the first record of each partition", func() bool { return held.Load() == 3 })
	rg.member("B", handler("B"), Options{})
	// Nothing is released: only the revocation can end A's handlers.
	testenv.WaitFor(t, 20*time.Second, "a partition revoked from A, its held record Interrupted at A and run by B", func() bool {
		ps := rg.revokedFromA()
		if len(ps) == 0 {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range ps {
			id := heldOnce[p]
			if aOut[id] != consumerx.Interrupted || !slices.Equal(effects[id], []string{"B"}) {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for _, p := range rg.revokedFromA() {
		if id := heldOnce[p]; !errors.Is(aErr[id], ErrRevoked) {
			t.Errorf("A's outcome of %s: %v, want one matching ErrRevoked", id, aErr[id])
		}
	}
	stillHeld := 0
	for p, id := range heldOnce {
		if !slices.Contains(rg.revokedFromA(), p) && len(effects[id]) == 0 {
			stillHeld++
		}
	}
	mu.Unlock()
	if stillHeld == 0 {
		t.Errorf("no record of a partition A kept still held: the test proves nothing")
	}
	t.Logf("partitions %v revoked from A; A still holds %d records", rg.revokedFromA(), stillHeld)
	releaseOnce.Do(func() { close(release) })
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return lag(t, rg.producer, "billing", "orders") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("records run at once by both members: %v", overlap)
	}
	for _, r := range recs {
		if got := effects[ID(r)]; len(got) != 1 {
			t.Errorf("%s (%s) ran to success by %v, want once", ID(r), r.Value, got)
		}
	}
}

// The first record of each partition fails at A, retried in place for ever
// (MaxAttempts -1), on a client without kgo.BlockRebalanceOnPoll; B joins
// and takes a partition, where the record fails for ever too. The
// partitions A keeps then succeed at A; the revoked one's retries stop, so
// A's poll ends (committed for the partitions it kept) and A goes on with
// the next records of its partitions.
func TestRevokedPartitionsRetryStops(t *testing.T) {
	rg := newRevokeGroup(t)
	var (
		mu       sync.Mutex
		failing  = map[int32]int{} // partition → A's failed runs of its first record
		ranAfter = map[string]string{}
	)
	handler := func(member string) consumerx.Handler {
		return func(ctx context.Context, msg consumerx.Message) error {
			r := msg.Raw.(*kgo.Record)
			switch string(r.Value) {
			case "poison":
				ps := rg.revokedFromA()
				if len(ps) == 0 || slices.Contains(ps, r.Partition) {
					if member == "A" {
						mu.Lock()
						failing[r.Partition]++
						mu.Unlock()
					}
					return errors.New("declined")
				}
			case "after":
				mu.Lock()
				ranAfter[msg.ID] = member
				mu.Unlock()
			}
			return nil
		}
	}
	defer rg.wait()
	forever := Options{Process: consumerx.Options{MaxAttempts: -1}}
	rg.member("A", handler("A"), forever)
	rg.warm()
	// One produce for the three partitions, so that A's one poll has
	// them all: a poll that took one partition alone would retry its
	// poison for ever and never fetch the others.
	var recs []*kgo.Record
	for p := range int32(3) {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("poison")},
			&kgo.Record{Topic: "orders", Partition: p, Value: []byte("next")})
	}
	rg.produce(recs...)
	testenv.WaitFor(t, 20*time.Second, "A retrying the first record of each partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failing) == 3
	})
	rg.member("B", handler("B"), forever)
	testenv.WaitFor(t, 20*time.Second, "a partition revoked from A", func() bool { return len(rg.revokedFromA()) > 0 })
	revoked := rg.revokedFromA()
	var after []*kgo.Record
	for p := range int32(3) {
		if !slices.Contains(revoked, p) {
			after = append(after, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("after")})
		}
	}
	if len(after) == 0 {
		t.Fatalf("every partition revoked from A (%v): the test proves nothing", revoked)
	}
	rg.produce(after...)
	testenv.WaitFor(t, 20*time.Second, "A running the next records of the partitions it kept", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range after {
			if ranAfter[ID(r)] != "A" {
				return false
			}
		}
		return true
	})
	t.Logf("partitions %v revoked from A; A's failed runs by partition: %v", revoked, failing)
}

// offsets returns the group's committed offset and the end offset of the
// partition p of topic.
func offsets(t *testing.T, producer *kgo.Client, group, topic string, p int32) (committed, end int64) {
	t.Helper()
	ctx := context.Background()
	adm := kadm.NewClient(producer)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := ends.Lookup(topic, p)
	fetched, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return -1, e.Offset
	}
	c, _ := fetched.Lookup(topic, p)
	return c.At, e.Offset
}

// A runs the one record of each partition of its poll in a handler that
// does not heed its context; B joins and takes a partition, and A's record
// of it completes there after the revocation, the last of its poll in that
// partition. B finds it done and commits the partition on, past records
// produced since. When A's poll ends it commits the partitions it kept,
// not the revoked one: the group's offset there does not go back.
func TestRevokedPartitionsNotCommitted(t *testing.T) {
	rg := newRevokeGroup(t)
	var (
		release = map[int32]chan struct{}{}
		held    atomic.Int32
		ranMore atomic.Int32
	)
	for p := range int32(3) {
		release[p] = make(chan struct{})
	}
	handler := func(member string) consumerx.Handler {
		return func(ctx context.Context, msg consumerx.Message) error {
			r := msg.Raw.(*kgo.Record)
			switch {
			case member == "A" && string(r.Value) == "hold":
				held.Add(1)
				<-release[r.Partition]
			case string(r.Value) == "more":
				ranMore.Add(1)
			}
			return nil
		}
	}
	var released sync.Map
	free := func(p int32) {
		if _, done := released.LoadOrStore(p, true); !done {
			close(release[p])
		}
	}
	defer func() {
		for p := range int32(3) {
			free(p)
		}
		rg.wait()
	}()
	rg.member("A", handler("A"), Options{})
	rg.warm()
	// One produce for the three partitions, so that A's one poll has them
	// all: a poll that took fewer would hold its record for ever and never
	// fetch the others.
	var holds []*kgo.Record
	for p := range int32(3) {
		holds = append(holds, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("hold")})
	}
	rg.produce(holds...)
	testenv.WaitFor(t, 20*time.Second, "A holding the record of each partition", func() bool { return held.Load() == 3 })
	rg.member("B", handler("B"), Options{})
	testenv.WaitFor(t, 20*time.Second, "a partition revoked from A", func() bool { return len(rg.revokedFromA()) > 0 })
	revoked := rg.revokedFromA()
	var kept []int32
	for p := range int32(3) {
		if !slices.Contains(revoked, p) {
			kept = append(kept, p)
		}
	}
	if len(kept) == 0 {
		t.Fatalf("every partition revoked from A (%v): the test proves nothing", revoked)
	}
	// A's record of the revoked partition completes; B finds it done,
	// commits it, and runs and commits the records produced since.
	for _, p := range revoked {
		free(p)
		rg.produce(&kgo.Record{Topic: "orders", Partition: p, Value: []byte("more")},
			&kgo.Record{Topic: "orders", Partition: p, Value: []byte("more")})
	}
	testenv.WaitFor(t, 20*time.Second, "B committing the revoked partitions to their end", func() bool {
		for _, p := range revoked {
			if c, e := offsets(t, rg.producer, "billing", "orders", p); c != e {
				return false
			}
		}
		return true
	})
	for _, p := range kept {
		free(p)
	}
	testenv.WaitFor(t, 20*time.Second, "A committing the partitions it kept", func() bool {
		for _, p := range kept {
			if c, e := offsets(t, rg.producer, "billing", "orders", p); c != e {
				return false
			}
		}
		return true
	})
	for _, p := range revoked {
		if c, e := offsets(t, rg.producer, "billing", "orders", p); c != e {
			t.Errorf("partition %d revoked from A: committed offset %d after A's commit, want %d (B's)", p, c, e)
		}
	}
	t.Logf("partitions %v revoked from A, %v kept; %d records produced since run", revoked, kept, ranMore.Load())
}
