package sim

import (
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// Gateways is allot with the region's instances as gateways that decide
// from leases held from one regional enforcer, as the Go SDK (client/)
// does: the same sizing (regional.GatewayWant, GatewayGrant,
// GatewayRenew) and the same two-grant hold (regional.LeaseHold), grants returned
// 1.5 rounds before their TTL, requests no lease covers sent to the
// enforcer's check, and a rejection remembered for at least a quarter
// round. Calls between gateway and enforcer take no time here.
const Gateways = "gateways"

// gatewayTTL is the enforcer's lease TTL (server.DefaultLeaseTTL).
const gatewayTTL = time.Second

// gateway is one gateway process: its keys.
type gateway struct {
	keys map[int]*gwKey
}

// gwKey is one key at one gateway (client/bucket.go's bucket).
type gwKey struct {
	desc        allot.Descriptor
	hold        regional.LeaseHold // the SDK's own two-grant hold
	spent       int64
	asked       int64
	maxHits     int64
	rate        float64
	lastSync    time.Time
	lastUse     time.Time
	needLease   bool
	deniedUntil time.Time
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

// gatewayDecide decides n requests of cost on key id at gateway g, now.
func (w *world) gatewayDecide(r *region, g *gateway, id int, desc allot.Descriptor, cost int64, n int) int {
	k := g.keys[id]
	if k == nil {
		k = &gwKey{desc: slices.Clone(desc), lastSync: w.now}
		g.keys[id] = k
	}
	k.lastUse = w.now
	k.maxHits = max(k.maxHits, cost)
	a := 0
	for a < n && k.hold.Take(cost) {
		k.spent += cost
		a++
	}
	if a == n || w.now.Before(k.deniedUntil) {
		return a
	}
	// The lease does not cover the rest: each goes to the enforcer until
	// one is rejected, and the next round takes a lease.
	in := r.inst[0]
	k.needLease = true
	for a < n {
		w.m.storeCalls[r.idx]++
		k.asked += cost
		ok, err := w.check(r, in, k.desc, cost)
		if err != nil {
			panic(err)
		}
		if !ok {
			if ra := w.dec.RetryAfter; ra > 0 {
				k.deniedUntil = w.now.Add(min(max(ra, w.sc.GatewaySync/4), w.sc.GatewaySync))
			}
			break
		}
		a++
	}
	return a
}

// gatewayRound is one gateway's lease round (client/sync.go's plan):
// returns, then new grants, in one call to the enforcer when there is
// anything to send.
func (w *world) gatewayRound(r *region, g *gateway) {
	now := w.clock(r)
	iv := w.sc.GatewaySync
	edge := w.now.Add(iv + iv/2)
	sent := false
	ids := make([]int, 0, len(g.keys))
	for id := range g.keys {
		ids = append(ids, id)
	}
	slices.Sort(ids) // a deterministic order
	for _, id := range ids {
		k := g.keys[id]
		k.rate = regional.GatewayRate(k.rate, k.spent+k.asked, w.now.Sub(k.lastSync))
		k.lastSync = w.now
		k.asked, k.spent = 0, 0
		forget := w.now.Sub(k.lastUse) > 20*iv
		for _, gr := range k.hold.Ending(edge, forget, nil) {
			w.gatewayReturn(r, k, gr)
			sent = true
		}
		if forget {
			delete(g.keys, id)
			continue
		}
		want := regional.GatewayWant(k.rate, iv, k.maxHits)
		k.maxHits = 0
		if !k.needLease && !regional.GatewayRenew(k.hold.Held(), k.rate, iv) {
			continue
		}
		if gr, ok := k.hold.MakeRoom(); ok {
			w.gatewayReturn(r, k, gr)
		}
		k.needLease = false
		sent = true
		if w.now.Before(k.deniedUntil) {
			continue
		}
		// The enforcer: what the most restrictive limit has left, then a
		// grant charged like a check of that many hits.
		in := r.inst[0]
		if _, err := w.check(r, in, k.desc, 0); err != nil {
			panic(err)
		}
		left := int64(-1)
		for _, st := range w.dec.Statuses {
			if !st.Shadow && (left < 0 || st.Remaining < left) {
				left = st.Remaining
			}
		}
		n := regional.GatewayGrant(want, left)
		if n <= 0 {
			continue
		}
		ok, err := w.check(r, in, k.desc, n)
		if err != nil {
			panic(err)
		}
		if !ok {
			continue
		}
		k.hold.Add(regional.LeaseGrant{Tokens: n, GrantedAt: now.UnixNano(), Expires: w.now.Add(gatewayTTL)})
	}
	if sent {
		w.m.storeCalls[r.idx]++
	}
}

// gatewayReturn gives a grant's unused tokens back to the enforcer: only
// within the window the grant was charged in for a sliding window, as
// regional/server does.
func (w *world) gatewayReturn(r *region, k *gwKey, gr regional.LeaseGrant) {
	now := w.clock(r)
	p := int64(w.lim.Rate.Period)
	if w.lim.Algorithm != allot.SlidingWindow || now.UnixNano()/p == gr.GrantedAt/p {
		if err := r.inst[0].e.Refund(now, w.dom.Name, k.desc, gr.Tokens); err != nil {
			panic(err)
		}
	}
}
