package kafkax

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A Kafka topic name may be 249 characters long: with a large offset,
// "<topic>/<partition>/<offset>" is longer than guard.MaxIDLen. Such a
// record still gets a usable key of its own and runs (it is not
// dead-lettered as a bad id); a short topic's id is unchanged.
func TestLongTopicRecordsHaveUsableKeys(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p, err := consumerx.NewProcessor(g, "billing", consumerx.Options{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("t", 249) // Kafka's longest topic name
	recs := []*kgo.Record{
		{Topic: long, Partition: 0, Offset: 1000, Value: []byte("charge 1")},
		{Topic: long, Partition: 0, Offset: 1001, Value: []byte("charge 2")},
		{Topic: long, Partition: 12, Offset: 1000, Value: []byte("charge 3")},
		{Topic: long + "x", Partition: 0, Offset: 1000, Value: []byte("charge 4")}, // another topic (of a broker allowing it)
	}
	msgs := make([]consumerx.Message, len(recs))
	seen := map[string]bool{}
	for i, r := range recs {
		msgs[i] = message(r)
		k, err := p.Key(msgs[i])
		if err != nil {
			t.Errorf("record %d: %v", i, err)
			continue
		}
		if seen[k.ID] {
			t.Errorf("record %d: id %q given twice", i, k.ID)
		}
		seen[k.ID] = true
	}
	ran := 0
	res := p.ProcessBatch(context.Background(), msgs, func(context.Context, consumerx.Message) error { ran++; return nil },
		consumerx.BatchOptions{Ordered: true})
	for i, r := range res {
		if r.Outcome != consumerx.Processed {
			t.Errorf("record %d: %s, %v; want processed", i, r.Outcome, r.Err)
		}
	}
	if ran != len(recs) {
		t.Errorf("ran %d handlers, want %d", ran, len(recs))
	}
	if id := ID(&kgo.Record{Topic: "orders", Partition: 3, Offset: 42}); id != "orders/3/42" {
		t.Errorf("short topic's id %q, want orders/3/42", id)
	}
	sum := sha256.Sum256([]byte(long))
	want := "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:]) + "/12/1000"
	if id := ID(recs[2]); id != want {
		t.Errorf("long topic's id %q, want %q", id, want)
	}
}

// A record's id costs one allocation, made for every record of every
// poll (two before: "/<partition>/<offset>" had its own), and keeps its
// form at the extremes of partition and offset.
func TestIDAllocatesOnce(t *testing.T) {
	r := &kgo.Record{Topic: "orders", Partition: 12, Offset: 1 << 40}
	if n := testing.AllocsPerRun(100, func() { _ = ID(r) }); n != 1 {
		t.Errorf("ID allocates %v times, want 1", n)
	}
	r = &kgo.Record{Topic: "orders", Partition: math.MinInt32, Offset: math.MinInt64}
	if id, want := ID(r), fmt.Sprintf("orders/%d/%d", int32(math.MinInt32), int64(math.MinInt64)); id != want {
		t.Errorf("id %q, want %q", id, want)
	}
}

// Through a broker: a topic with Kafka's longest name, past offset 1000
// (where "<topic>/<partition>/<offset>" outgrows guard.MaxIDLen): every
// record runs once and is committed, none is dead-lettered.
func TestLongTopicConsumedPastOffsetThousand(t *testing.T) {
	const n = 1010
	g, _, _ := consumertest.Guard(t, guard.Options{})
	topic := strings.Repeat("t", 249)
	addrs, producer, _ := startKafka(t, topic)
	ctx := context.Background()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("customer-1"), Value: fmt.Appendf(nil, "charge %d", i)}
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", topic)
	defer cl.CloseAllowingRebalance()
	var runs, dead atomic.Int32
	c, err := New(cl, g, func(context.Context, consumerx.Message) error { runs.Add(1); return nil },
		Options{MaxPollRecords: 500, Process: consumerx.Options{Logger: testenv.Logger(t),
			DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", topic) == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != n || dead.Load() != 0 {
		t.Errorf("ran %d, dead-lettered %d; want %d, 0", runs.Load(), dead.Load(), n)
	}
}
