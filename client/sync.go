package client

import (
	"context"
	"errors"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// idleAfter is how many sync intervals a bucket may go unused before it
// is forgotten (its unused tokens are returned first).
const idleAfter = 20

// reprobe is how often buckets that take no leases (check-each,
// unlimited) ask again, so that a configuration change reaches them.
const reprobe = 5 * time.Second

// run is the sync loop: one batched Lease call per interval, and sooner
// when a request found no lease (at most every quarter interval).
func (c *Client) run() {
	defer close(c.done)
	tick := time.NewTicker(c.cfg.SyncInterval)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		case <-c.kick:
			if wait := c.cfg.SyncInterval/4 - time.Since(last); wait > 0 {
				select {
				case <-c.stop:
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
		c.probe()
		c.forgetReservations(last)
		if err := c.syncOnce(false); err != nil {
			c.log.Debug("sync failed", "err", err)
		}
	}
}

// wake asks the sync loop for an early round.
func (c *Client) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// leaseSlot says which bucket and grant a Lease item was made for.
type leaseSlot struct {
	b      *bucket
	asking bool // the item asks for a new grant
}

// syncOnce sends one round: reports, returns and new grants for every
// bucket that needs any. leaving returns everything and asks for nothing.
func (c *Client) syncOnce(leaving bool) error {
	now := time.Now()
	ttl := time.Duration(c.leaseTTL.Load())
	if ttl <= 0 {
		ttl = time.Second
	}
	interval := c.cfg.SyncInterval
	var items []*allotv1.LeaseItem
	var slots []leaseSlot
	for _, b := range c.keys.all() {
		b.mu.Lock()
		its, asking, forget := c.plan(b, now, ttl, interval, leaving)
		b.mu.Unlock()
		for i, it := range its {
			items = append(items, it)
			slots = append(slots, leaseSlot{b: b, asking: asking && i == len(its)-1})
		}
		if forget {
			c.keys.remove(b)
		}
	}
	// A round with nothing in it is still sent every half TTL: the
	// enforcer counts the gateways it heard within a TTL, and fallback
	// capacity divides by that.
	if len(items) == 0 && !leaving && now.Sub(c.lastSent) < ttl/2 {
		return nil
	}
	c.lastSent = now
	var errs []error
	for start := 0; ; start += maxBatch {
		end := min(start+maxBatch, len(items))
		if err := c.lease(now, items[start:end], slots[start:end], leaving); err != nil {
			errs = append(errs, err)
		}
		if end == len(items) {
			break
		}
	}
	return errors.Join(errs...)
}

// plan decides what b sends this round; the caller holds b.mu. It moves
// the tokens it returns out of the bucket: they are gone even if the call
// fails (a lost return strands tokens, it never adds any).
func (c *Client) plan(b *bucket, now time.Time, ttl, interval time.Duration, leaving bool) (items []*allotv1.LeaseItem, asking, forget bool) {
	b.rate = regional.GatewayRate(b.rate, b.spent+b.asked, now.Sub(b.lastSync))
	b.lastSync = now
	b.asked = 0
	used := b.spent
	b.spent = 0
	item := func() *allotv1.LeaseItem {
		return &allotv1.LeaseItem{Domain: b.domain, Descriptors: b.wire}
	}
	idle := now.Sub(b.lastUse) > idleAfter*interval
	forget = leaving || idle

	// Grants that end before the next round (or now, when leaving or
	// idle) go back.
	edge := now.Add(interval + interval/2) // grants ending before it go back now
	for _, g := range b.hold.Ending(edge, forget, nil) {
		it := item()
		it.Returned, it.ReturnedGrantedAtUnixNano = g.Tokens, g.GrantedAt
		items = append(items, it)
	}
	if used > 0 {
		if len(items) > 0 {
			items[0].Used = used
		} else {
			it := item()
			it.Used = used
			items = append(items, it)
		}
	}
	if forget {
		return items, false, true
	}

	switch b.state {
	case stateCheckEach, stateUnlimited:
		if now.Sub(b.probed) > reprobe {
			items = append(items, item())
			return items, true, false
		}
		return items, false, false
	}
	// Ask for two intervals of this gateway's rate whenever what it holds
	// would not last until the round after next, or a request found
	// nothing (regional.GatewayWant, GatewayRenew).
	need := regional.GatewayWant(b.rate, interval, b.maxHits)
	b.maxHits = 0
	if b.needLease || regional.GatewayRenew(b.hold.Held(), b.rate, interval) {
		if g, ok := b.hold.MakeRoom(); ok {
			// Room for one more grant only: the older goes back now.
			it := item()
			it.Returned, it.ReturnedGrantedAtUnixNano = g.Tokens, g.GrantedAt
			items = append(items, it)
		}
		if now.Before(b.deniedUntil) && !b.needLease {
			return items, false, false
		}
		it := item()
		it.Want = need
		items = append(items, it)
		return items, true, false
	}
	return items, false, false
}

// lease sends one Lease call and applies its grants.
func (c *Client) lease(sent time.Time, items []*allotv1.LeaseItem, slots []leaseSlot, leaving bool) error {
	req := &allotv1.LeaseRequest{GatewayId: c.cfg.GatewayID, Items: items, Leaving: leaving}
	var resp *allotv1.LeaseResponse
	_, err := c.call(context.Background(), func(ctx context.Context, ep *endpoint) error {
		c.stats.leaseRPCs.Add(1)
		var err error
		resp, err = ep.rl.Lease(ctx, req)
		return err
	})
	if err != nil && !isUnavailable(err) && len(items) > 1 {
		// The enforcer refused the call for one item (a domain that is no
		// longer configured, say): send each on its own.
		var errs []error
		for i := range items {
			errs = append(errs, c.lease(sent, items[i:i+1], slots[i:i+1], leaving))
		}
		return errors.Join(errs...)
	}
	if err != nil {
		for _, s := range slots {
			if s.asking {
				s.b.mu.Lock()
				s.b.needLease = false
				s.b.mu.Unlock()
			}
			if !isUnavailable(err) {
				c.keys.remove(s.b)
			}
		}
		return err
	}
	if len(resp.GetGrants()) != len(items) {
		return errors.New("client: enforcer answered a Lease call with the wrong number of grants")
	}
	if n := resp.GetGateways(); n > 0 {
		c.gateways.Store(n)
	}
	ttl := resp.GetTtl().AsDuration()
	if ttl > 0 {
		c.leaseTTL.Store(int64(ttl))
	}
	now := time.Now()
	for i, g := range resp.GetGrants() {
		s := slots[i]
		if !s.asking {
			continue
		}
		s.b.mu.Lock()
		s.b.apply(g, sent, ttl, now, c.cfg.SyncInterval)
		s.b.mu.Unlock()
	}
	return nil
}

// apply takes one grant into b; the caller holds b.mu.
func (b *bucket) apply(g *allotv1.LeaseGrant, sent time.Time, ttl time.Duration, now time.Time, interval time.Duration) {
	b.needLease = false
	b.probed = now
	b.fallback = fallbacks(g.GetFallback(), b.fallback)
	d := fromResult(&allotv1.CheckResult{Allowed: true, Limits: g.GetLimits()})
	d.Source = SourceLease
	b.info = d
	switch {
	case g.GetCheckEach():
		b.state = stateCheckEach
		return
	case d.Limit == "":
		b.state = stateUnlimited
		return
	}
	b.state = stateLeased
	b.left = d.Remaining
	if n := g.GetGranted(); n > 0 {
		b.hold.Add(regional.LeaseGrant{Tokens: n, GrantedAt: g.GetGrantedAtUnixNano(), Expires: sent.Add(ttl)})
	}
	if g.GetGranted() == 0 {
		if ra := g.GetRetryAfter().AsDuration(); ra > 0 {
			b.deniedUntil = now.Add(min(ra, interval))
		}
	}
}
