package consumerx_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet(t testing.TB, o consumerx.Options) consumerx.Options {
	if o.Logger == nil {
		o.Logger = testenv.Logger(t)
	}
	return o
}

func newProcessor(t *testing.T, g *guard.Guard, group string, o consumerx.Options) *consumerx.Processor {
	t.Helper()
	p, err := consumerx.NewProcessor(g, group, quiet(t, o))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var order = consumerx.Message{ID: "order-1", Payload: []byte(`{"amount":100}`)}

func TestDuplicateAckedWithoutRunningAndLogged(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var logs bytes.Buffer
	p := newProcessor(t, g, "billing", consumerx.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var runs atomic.Int32
	h := func(context.Context, consumerx.Message) error { runs.Add(1); return nil }
	ctx := context.Background()
	if o, err := p.Process(ctx, order, h); o != consumerx.Processed || err != nil {
		t.Fatalf("first delivery: %s, %v", o, err)
	}
	for range 3 {
		if o, err := p.Process(ctx, order, h); o != consumerx.Duplicate || err != nil || !o.Ack() {
			t.Fatalf("redelivery: %s, %v", o, err)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times", runs.Load())
	}
	if n := strings.Count(logs.String(), "duplicate message"); n != 3 || !strings.Contains(logs.String(), "id=order-1") ||
		!strings.Contains(logs.String(), "group=billing") {
		t.Errorf("log has %d duplicate lines:\n%s", n, logs.String())
	}
}

// Many consumers handed the same message at once: it runs once; the rest
// are duplicates or told it is in progress (and not acknowledged).
func TestConcurrentDeliveriesRunOnce(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	var runs atomic.Int32
	release := make(chan struct{})
	h := func(context.Context, consumerx.Message) error {
		runs.Add(1)
		<-release // hold the claim while the others arrive
		return nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	count := map[consumerx.Outcome]int{}
	var returned atomic.Int32
	for range 50 {
		wg.Go(func() {
			defer returned.Add(1)
			o, err := p.Process(context.Background(), order, h)
			if o == consumerx.InProgress && !errors.Is(err, guard.ErrInProgress) {
				t.Errorf("in progress with %v", err)
			}
			mu.Lock()
			count[o]++
			mu.Unlock()
		})
	}
	testenv.WaitFor(t, 30*time.Second, "49 deliveries answered while one holds the message",
		func() bool { return returned.Load() == 49 })
	close(release)
	wg.Wait()
	if runs.Load() != 1 || count[consumerx.Processed] != 1 || count[consumerx.InProgress]+count[consumerx.Duplicate] != 49 {
		t.Errorf("runs = %d, outcomes = %v", runs.Load(), count)
	}
}

func TestFailsTwiceThenSucceeds(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	boom := errors.New("gateway timeout")
	var attempts []int
	h := func(ctx context.Context, _ consumerx.Message) error {
		lease, ok := consumerx.LeaseFrom(ctx)
		if !ok {
			t.Error("no lease in the handler's context")
		}
		attempts = append(attempts, lease.Attempt)
		if len(attempts) < 3 {
			return boom
		}
		return nil
	}
	ctx := context.Background()
	for i, want := range []consumerx.Outcome{consumerx.Failed, consumerx.Failed, consumerx.Processed, consumerx.Duplicate} {
		o, err := p.Process(ctx, order, h)
		if o != want || (want == consumerx.Failed) != errors.Is(err, boom) {
			t.Fatalf("delivery %d: %s, %v; want %s", i+1, o, err, want)
		}
	}
	key, _ := p.Key(order)
	rec, err := g.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(attempts) != "[1 2 3]" || rec.Attempt != 3 || rec.State != guard.StateCompleted {
		t.Errorf("attempts = %v, record %s after %d", attempts, rec.State, rec.Attempt)
	}
}

// A handler that always fails is dead-lettered on its last attempt, with
// its last error, once, however often the message comes back.
func TestAlwaysFailsDeadLetteredOnce(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{MaxAttempts: 3})
	var dead []error
	p := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: func(_ context.Context, msg consumerx.Message, cause error) error {
		dead = append(dead, cause)
		return nil
	}})
	if p.MaxAttempts() != 3 {
		t.Fatalf("MaxAttempts = %d, want the guard's 3", p.MaxAttempts())
	}
	declined := errors.New("card declined")
	runs := 0
	h := func(context.Context, consumerx.Message) error {
		runs++
		return fmt.Errorf("attempt %d: %w", runs, declined)
	}
	ctx := context.Background()
	for i, want := range []consumerx.Outcome{consumerx.Failed, consumerx.Failed, consumerx.DeadLettered, consumerx.DeadLettered, consumerx.DeadLettered} {
		if o, _ := p.Process(ctx, order, h); o != want {
			t.Fatalf("delivery %d: %s, want %s", i+1, o, want)
		}
	}
	if runs != 3 || len(dead) != 1 {
		t.Fatalf("runs = %d, dead letters = %d; want 3, 1", runs, len(dead))
	}
	var exh *guard.ExhaustedError
	if !errors.As(dead[0], &exh) || exh.Attempts != 3 || exh.LastError != "attempt 3: card declined" || !errors.Is(dead[0], declined) ||
		!errors.Is(dead[0], guard.ErrExhausted) {
		t.Errorf("cause = %v", dead[0])
	}
}

// Exhausted at claim time (the last attempt's consumer died before
// dead-lettering): the next delivery dead-letters it with the stored error.
func TestExhaustedAtClaimDeadLettered(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{MaxAttempts: 2})
	ctx := context.Background()
	p := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: func(context.Context, consumerx.Message, error) error {
		return errors.New("dead-letter queue down")
	}})
	h := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	if o, _ := p.Process(ctx, order, h); o != consumerx.Failed {
		t.Fatalf("first: %s", o)
	}
	// The last attempt fails and the dead letter fails too: not acked.
	if o, err := p.Process(ctx, order, h); o != consumerx.Failed || !strings.Contains(fmt.Sprint(err), "dead-letter queue down") {
		t.Fatalf("second: %s, %v", o, err)
	}
	var cause error
	p2 := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error {
		cause = c
		return nil
	}})
	if o, _ := p2.Process(ctx, order, h); o != consumerx.DeadLettered {
		t.Fatalf("third: %s", o)
	}
	var exh *guard.ExhaustedError
	if !errors.As(cause, &exh) || exh.Attempts != 2 || exh.LastError != "card declined" {
		t.Errorf("cause = %v", cause)
	}
}

func TestMaxAttemptsOptions(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	if n := newProcessor(t, g, "a", consumerx.Options{}).MaxAttempts(); n != consumerx.DefaultMaxAttempts {
		t.Errorf("default MaxAttempts = %d", n)
	}
	p := newProcessor(t, g, "b", consumerx.Options{MaxAttempts: -1})
	h := func(context.Context, consumerx.Message) error { return errors.New("no") }
	for i := range 2 * consumerx.DefaultMaxAttempts {
		if o, _ := p.Process(context.Background(), order, h); o != consumerx.Failed {
			t.Fatalf("delivery %d without a limit: %s", i+1, o)
		}
	}
}

func TestTwoGroupsRunOnceEach(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	runs := map[string]int{}
	for _, group := range []string{"billing", "shipping", "billing", "shipping"} {
		p := newProcessor(t, g, group, consumerx.Options{})
		if _, err := p.Process(context.Background(), order, func(context.Context, consumerx.Message) error {
			runs[group]++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if runs["billing"] != 1 || runs["shipping"] != 1 {
		t.Errorf("runs = %v", runs)
	}
}

// The same id with a different payload is dead-lettered as a mismatch by
// default, and is a duplicate when the fingerprint ignores the payload.
func TestChangedPayload(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	ctx := context.Background()
	changed := consumerx.Message{ID: order.ID, Payload: []byte(`{"amount":999}`)}
	var causes []error
	p := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error {
		causes = append(causes, c)
		return nil
	}})
	runs := 0
	h := func(context.Context, consumerx.Message) error { runs++; return nil }
	if o, _ := p.Process(ctx, order, h); o != consumerx.Processed {
		t.Fatal(o)
	}
	for range 2 {
		if o, err := p.Process(ctx, changed, h); o != consumerx.DeadLettered || !errors.Is(err, guard.ErrMismatch) {
			t.Fatalf("changed payload: %s, %v", o, err)
		}
	}
	if runs != 1 || len(causes) != 1 || !errors.Is(causes[0], guard.ErrMismatch) {
		t.Errorf("runs = %d, dead letters = %v", runs, causes)
	}
	lax := newProcessor(t, g, "audit", consumerx.Options{Fingerprint: func(consumerx.Message) string { return "" }})
	lax.Process(ctx, order, h)
	if o, err := lax.Process(ctx, changed, h); o != consumerx.Duplicate || err != nil || runs != 2 {
		t.Errorf("constant fingerprint: %s, %v, runs %d", o, err, runs)
	}
}

// Messages without a usable id are dead-lettered, not run, not lost.
func TestBadIDsDeadLettered(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var causes []error
	deadLetter := func(_ context.Context, _ consumerx.Message, c error) error { causes = append(causes, c); return nil }
	h := func(context.Context, consumerx.Message) error { t.Error("handler ran"); return nil }
	p := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: deadLetter})
	for _, msg := range []consumerx.Message{{ID: ""}, {ID: strings.Repeat("x", guard.MaxIDLen+1)}, {ID: "a\nb"}} {
		if o, err := p.Process(context.Background(), msg, h); o != consumerx.DeadLettered || err == nil {
			t.Errorf("id %q: %s, %v", msg.ID, o, err)
		}
	}
	keyed := newProcessor(t, g, "billing", consumerx.Options{DeadLetter: deadLetter,
		Key: func(consumerx.Message) (string, error) { return "", errors.New("no order_id header") }})
	if o, err := keyed.Process(context.Background(), order, h); o != consumerx.DeadLettered || !errors.Is(err, consumerx.ErrNoKey) ||
		!strings.Contains(err.Error(), "no order_id header") {
		t.Errorf("key function error: %s, %v", o, err)
	}
	if len(causes) != 4 || !errors.Is(causes[0], consumerx.ErrNoKey) || !errors.Is(causes[1], guard.ErrInvalidKey) ||
		!errors.Is(causes[2], guard.ErrInvalidKey) {
		t.Errorf("causes = %v", causes)
	}
	// Delivered again (the first acknowledgement was lost), each is
	// acknowledged as dead-lettered, but only the one without even a
	// broker id is handed to DeadLetter again: nothing names it.
	for _, d := range []struct {
		p   *consumerx.Processor
		msg consumerx.Message
	}{{p, consumerx.Message{ID: ""}}, {p, consumerx.Message{ID: strings.Repeat("x", guard.MaxIDLen+1)}},
		{p, consumerx.Message{ID: "a\nb"}}, {keyed, order}} {
		if o, err := d.p.Process(context.Background(), d.msg, h); o != consumerx.DeadLettered || err == nil {
			t.Errorf("id %q again: %s, %v", d.msg.ID, o, err)
		}
	}
	if len(causes) != 5 || !errors.Is(causes[4], consumerx.ErrNoKey) {
		t.Errorf("after redelivery, causes = %v; want one more, for the message without an id", causes)
	}
}

func TestProcessResultReplaysStoredResult(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	fn := func(context.Context, consumerx.Message) ([]byte, error) { return []byte("receipt-7"), nil }
	for i, want := range []consumerx.Outcome{consumerx.Processed, consumerx.Duplicate} {
		o, res, err := p.ProcessResult(context.Background(), order, fn)
		if o != want || string(res) != "receipt-7" || err != nil {
			t.Errorf("delivery %d: %s %q %v", i+1, o, res, err)
		}
	}
}

// A consumer that died mid-run holds the message until its lease runs out;
// then the next delivery takes it over as attempt 2 (time controlled with
// miniredis).
func TestDeadHolderTakenOverAfterLease(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{Lease: 10 * time.Second})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	ctx := context.Background()
	key, _ := p.Key(order)
	if _, err := g.Claim(ctx, key, defaultFingerprint(order)); err != nil { // the consumer that dies
		t.Fatal(err)
	}
	var lease guard.Lease
	h := func(ctx context.Context, _ consumerx.Message) error { lease, _ = consumerx.LeaseFrom(ctx); return nil }
	if o, err := p.Process(ctx, order, h); o != consumerx.InProgress || o.Ack() {
		t.Fatalf("while the lease lives: %s, %v", o, err)
	}
	mr.FastForward(11 * time.Second)
	if o, err := p.Process(ctx, order, h); o != consumerx.Processed || err != nil {
		t.Fatalf("after the lease: %s, %v", o, err)
	}
	if lease.Attempt != 2 || !lease.Recovered {
		t.Errorf("lease = %+v, want attempt 2, recovered", lease)
	}
}

// defaultFingerprint is the fingerprint Options.Fingerprint defaults to.
func defaultFingerprint(msg consumerx.Message) string {
	sum := sha256.Sum256(msg.Payload)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func TestNewProcessorRejectsBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	for _, group := range []string{"", "bad\x00group", strings.Repeat("g", guard.MaxScopeLen)} {
		if _, err := consumerx.NewProcessor(g, group, consumerx.Options{}); err == nil {
			t.Errorf("group %q accepted", group)
		}
	}
	if _, err := consumerx.NewProcessor(nil, "g", consumerx.Options{}); err == nil {
		t.Error("nil guard accepted")
	}
	// Wrap returns what NewProcessor does: a group from configuration
	// must not crash the program.
	nop := func(context.Context, consumerx.Message) error { return nil }
	for _, group := range []string{"", "bad\x00group"} {
		if w, err := consumerx.Wrap(g, group, nop, consumerx.Options{}); err == nil || w != nil {
			t.Errorf("Wrap: group %q accepted", group)
		}
	}
	if _, err := consumerx.Wrap(nil, "g", nop, consumerx.Options{}); err == nil {
		t.Error("Wrap: nil guard accepted")
	}
	if w, err := consumerx.Wrap(g, "g", nil, consumerx.Options{}); err == nil || w != nil {
		t.Error("Wrap: nil handler accepted")
	}
}
