package sim

import (
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// Gateways is allot with the region's instances as gateways that decide
// from leases held from one regional enforcer: each key of a gateway is
// the Go SDK's own lease loop (regional.GatewayKey, which client/'s
// bucket runs), driven as client/ drives it. The simulator adds only the
// world: the calls (which take no time here), their count, and the
// enforcer's side of them (below). Not modelled: the SDK's early round
// after a Check (at most every quarter interval), its empty round every
// half TTL (the enforcer's count of gateways), a call's split into
// batches of 1000 items, and check_each or unlimited answers (the
// enforcer grants every key a lease).
const Gateways = "gateways"

// gatewayTTL is the enforcer's lease TTL (server.DefaultLeaseTTL).
const gatewayTTL = time.Second

// gateway is one gateway process: its keys.
type gateway struct {
	keys map[int]*gwKey
}

// gwKey is one key at one gateway (client/bucket.go's bucket).
type gwKey struct {
	desc allot.Descriptor
	k    regional.GatewayKey
}

// buildGateways gives every region of the gateways system its gateways
// and their lease rounds, staggered over a round.
func (w *world) buildGateways() {
	for _, r := range w.region {
		n := w.sc.region(r.name).Instances
		r.gw = make([]*gateway, n)
		for j := range r.gw {
			g := &gateway{keys: map[int]*gwKey{}}
			r.gw[j] = g
			phase := w.sc.GatewaySync * time.Duration(j+1) / time.Duration(n+1)
			w.every(T0.Add(phase), w.sc.GatewaySync, func() { w.gatewayRound(r, g) })
		}
	}
}

// gatewayDecide decides n requests of cost on key id at gateway g, now,
// one by one as client.Allow does: from the grants, else as
// GatewayKey.Decide says, sending to the enforcer's Check those it asks.
func (w *world) gatewayDecide(r *region, g *gateway, id int, desc allot.Descriptor, cost int64, n int) int {
	k := g.keys[id]
	if k == nil {
		k = &gwKey{desc: slices.Clone(desc), k: regional.NewGatewayKey(w.now)}
		g.keys[id] = k
	}
	a := 0
	for range n {
		if k.k.Take(cost) {
			a++
			continue
		}
		switch v, _ := k.k.Decide(w.now, cost); v {
		case regional.GatewaySpent, regional.GatewayPass:
			a++
		case regional.GatewayAsk:
			w.m.storeCalls[r.idx]++
			ok, err := w.check(r, r.inst[0], k.desc, cost)
			if err != nil {
				panic(err)
			}
			k.k.Checked(w.now, cost, ok, w.dec.RetryAfter, w.sc.GatewaySync)
			if ok {
				a++
			}
		}
	}
	return a
}

// gatewayRound is one gateway's lease round (client/sync.go's
// syncOnce): every key's plan, in one call to the enforcer when any has
// something to send, the enforcer serving each key's returns and then
// its ask.
func (w *world) gatewayRound(r *region, g *gateway) {
	iv := w.sc.GatewaySync
	sent := false
	ids := make([]int, 0, len(g.keys))
	for id := range g.keys {
		ids = append(ids, id)
	}
	slices.Sort(ids) // a deterministic order
	for _, id := range ids {
		k := g.keys[id]
		p := k.k.Plan(w.now, iv, false)
		for _, gr := range p.Return {
			w.gatewayReturn(r, k, gr)
		}
		if len(p.Return) > 0 || p.Used > 0 || p.Ask {
			sent = true
		}
		if p.Forget {
			delete(g.keys, id)
			continue
		}
		if p.Ask {
			k.k.Answer(w.now, w.now, w.gatewayGrant(r, k, p.Want), iv)
		}
	}
	if sent {
		w.m.storeCalls[r.idx]++
	}
}

// gatewayGrant is the enforcer's answer to an ask for want tokens of k
// (regional/server's leases.grant): sized by what the most restrictive
// limit has left (regional.GatewayGrant), charged like a check of that
// many hits, with a retry_after when less than asked was granted.
func (w *world) gatewayGrant(r *region, k *gwKey, want int64) regional.GatewayAnswer {
	now := w.clockOf(r, r.inst[0])
	a := regional.GatewayAnswer{Mode: regional.GatewayLeased, GrantedAt: now.UnixNano(), TTL: gatewayTTL}
	in := r.inst[0]
	if _, err := w.check(r, in, k.desc, 0); err != nil {
		panic(err)
	}
	if n := regional.GatewayGrant(want, regional.GatewayLeft(&w.dec)); n > 0 {
		ok, err := w.check(r, in, k.desc, n)
		if err != nil {
			panic(err)
		}
		if ok {
			a.Granted = n
		}
	}
	if a.Granted < want {
		a.RetryAfter = regional.GatewayRetryAfter(&w.dec)
	}
	return a
}

// gatewayReturn gives a grant's unused tokens back to the enforcer: only
// within the window the grant was charged in for a sliding window, as
// regional/server does.
func (w *world) gatewayReturn(r *region, k *gwKey, gr regional.LeaseGrant) {
	now := w.clockOf(r, r.inst[0])
	p := int64(w.lim.Rate.Period)
	if w.lim.Algorithm != allot.SlidingWindow || now.UnixNano()/p == gr.GrantedAt/p {
		if err := r.inst[0].e.Refund(now, w.dom.Name, k.desc, gr.Tokens); err != nil {
			panic(err)
		}
	}
}
