package consumerx_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/memstore"
)

// TestInventoryRegistration: a Processor made with Options.Inventory lists
// its group once, however many are made, with the guard's TTL and the key
// it is deduplicated by; one made without lists nothing.
func TestInventoryRegistration(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: 36 * time.Hour})
	inv := inventory.New(inventory.Options{})
	nop := func(context.Context, consumerx.Message) error { return nil }
	for range 3 {
		if _, err := consumerx.Wrap(g, "billing", nop, consumerx.Options{Inventory: inv}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := consumerx.NewProcessor(g, "audit", consumerx.Options{Inventory: inv, MessageType: "audit.event",
		Key: func(m consumerx.Message) (string, error) { return m.Metadata["event_id"], nil }}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumerx.Wrap(g, "unlisted", nop, consumerx.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumerx.NewProcessor(g, "", consumerx.Options{Inventory: inv}); err == nil {
		t.Fatal("empty group accepted")
	}
	got := inv.Entries()
	want := []inventory.Entry{
		{Kind: inventory.KindConsumer, Handler: "audit", Method: "audit.event", Required: inventory.RequireHard,
			KeySource: inventory.KeyComputed, Key: "Options.Key", Scope: inventory.ScopeGlobal, TTL: 36 * time.Hour, Router: "consumerx"},
		{Kind: inventory.KindConsumer, Handler: "billing", Method: "message", Required: inventory.RequireHard,
			KeySource: inventory.KeyMessageID, Key: "message id", Scope: inventory.ScopeGlobal, TTL: 36 * time.Hour, Router: "consumerx"},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
