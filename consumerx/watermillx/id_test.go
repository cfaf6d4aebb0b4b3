package watermillx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A publisher's message UUID may be longer than guard.MaxIDLen, or hold a
// control character: such a message still runs once, and is a duplicate
// when it comes back; it is not dead-lettered as a bad id. (It was: the
// message never ran.) Two long UUIDs that differ only past the first 255
// bytes are two messages.
func TestUnusableUUIDMessagesRunOnce(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead int
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t),
		DeadLetter: func(context.Context, consumerx.Message, error) error { dead++; return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ran[msg.UUID]++
		return nil, nil
	})
	long := strings.Repeat("tenant-7/order/", 20) // 300 bytes
	uuids := []string{long + "a", long + "b", "order\t9"}
	for range 2 { // a delivery and a redelivery of each
		for _, id := range uuids {
			if _, err := h(message.NewMessage(id, []byte("charge"))); err != nil {
				t.Errorf("%q: %v", id, err)
			}
		}
	}
	if dead != 0 || len(ran) != len(uuids) {
		t.Errorf("ran %d messages, dead-lettered %d; want %d, none", len(ran), dead, len(uuids))
	}
	for id, n := range ran {
		if n != 1 {
			t.Errorf("%.20q… ran %d times, want 1", id, n)
		}
	}
}

// recorder is a message.Publisher that keeps what it is given.
type recorder struct{ got []*message.Message }

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.got = append(r.got, msgs...)
	return nil
}
func (r *recorder) Close() error { return nil }

// A message with a UUID the guard cannot store, dead-lettered, is
// published to the dead-letter topic with its own UUID, not the digest
// it is deduplicated by.
func TestUnusableUUIDDeadLetteredWithItsUUID(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead recorder
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 1,
		DeadLetter: PublishDeadLetter(&dead, "orders.dead")}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("card declined") })
	uuid := strings.Repeat("tenant-7/order/", 20)
	if _, err := h(message.NewMessage(uuid, []byte("charge"))); err != nil {
		t.Fatalf("dead-lettered message nacked: %v", err)
	}
	if len(dead.got) != 1 || dead.got[0].UUID != uuid {
		t.Fatalf("dead letters %v; want one with the message's UUID", dead.got)
	}
}
