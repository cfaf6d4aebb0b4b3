package consumerx

import "github.com/idemguard/idemguard/inventory"

// register lists the processor's group in Options.Inventory, if set.
func (p *Processor) register() {
	if p.opts.Inventory == nil {
		return
	}
	policy := inventory.Policy{
		Required:  inventory.RequireHard,
		KeySource: inventory.KeyMessageID,
		Key:       "message id",
		Scope:     inventory.ScopeGlobal,
		TTL:       p.g.Options().TTL,
	}
	if p.opts.Key != nil {
		policy.KeySource, policy.Key = inventory.KeyComputed, "Options.Key"
	}
	typ := p.opts.MessageType
	if typ == "" {
		typ = "message"
	}
	p.opts.Inventory.AddConsumer(p.group, typ, policy)
}
