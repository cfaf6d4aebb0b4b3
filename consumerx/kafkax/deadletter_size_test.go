package kafkax

import (
	"bytes"
	"context"
	"errors"
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

// TestDeadLetterOfVerboseFailureSent: a large record (950 KB, which the
// topic took) whose handler fails with a verbose error (an upstream's
// 64 KB error page) is dead-lettered once, and the record behind it
// runs. ProduceDeadLetter put the whole cause text in a header: record
// and cause were over the producer's batch limit, so the dead letter was
// refused (MESSAGE_TOO_LARGE) on every delivery, and the partition never
// moved on (found by review).
func TestDeadLetterOfVerboseFailureSent(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, _ := startKafkaCluster(t, 1, "orders", "orders.dead")
	ctx := context.Background()
	big := bytes.Repeat([]byte("o"), 950_000)
	for _, v := range [][]byte{big, []byte("charge 2")} {
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("k"), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	verbose := errors.New("upstream 502: " + strings.Repeat("<p>bad gateway</p>", 64<<10/18))
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var (
		runs     atomic.Int32
		ran2     atomic.Int32
		dlErrors atomic.Int32
		lastDL   atomic.Value
	)
	dl := ProduceDeadLetter(producer, "orders.dead")
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		if len(msg.Payload) == len(big) {
			runs.Add(1)
			return verbose
		}
		ran2.Add(1)
		return nil
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{MaxAttempts: 2, Logger: testenv.Logger(t),
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			err := dl(ctx, msg, cause)
			if err != nil {
				dlErrors.Add(1)
				lastDL.Store(err.Error())
			}
			return err
		}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 15*time.Second, "the failing record dead-lettered and the one behind it run", func() bool {
		return ran2.Load() == 1 && lag(t, producer, "billing", "orders") == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 2 || dlErrors.Load() != 0 {
		msg, _ := lastDL.Load().(string)
		t.Fatalf("the failing record ran %d times (MaxAttempts 2); its dead letter failed %d times (last: %.200s)", n, dlErrors.Load(), msg)
	}
}
