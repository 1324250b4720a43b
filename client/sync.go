package client

import (
	"context"
	"errors"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

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
	asking bool          // the item asks for a new grant
	seq    uint64        // b.seq when the round was planned
	round  chan struct{} // b.round, to close once answered (on b's first item)
}

// answered ends the rounds of slots' buckets, their grants applied or
// not.
func answered(slots []leaseSlot, applied bool) {
	for _, s := range slots {
		if !applied && s.asking || s.round != nil {
			s.b.mu.Lock()
			if !applied && s.asking {
				s.b.gw.Unanswered()
			}
			if s.round != nil && s.b.round == s.round {
				s.b.round = nil
			}
			s.b.mu.Unlock()
		}
		if s.round != nil {
			close(s.round)
		}
	}
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
		its, asking, forget := b.plan(now, interval, leaving)
		seq := b.seq
		var round chan struct{}
		if asking || len(its) > 0 && its[0].GetReturned() > 0 {
			round = make(chan struct{})
			b.round = round
		}
		b.mu.Unlock()
		for i, it := range its {
			items = append(items, it)
			s := leaseSlot{b: b, asking: asking && i == len(its)-1, seq: seq}
			if i == 0 {
				s.round = round
			}
			slots = append(slots, s)
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

// plan is b's items of this round (regional.GatewayKey.Plan decides
// them); the caller holds b.mu. The tokens it returns are gone from the
// bucket even if the call fails. asking says the last item asks for a
// grant.
func (b *bucket) plan(now time.Time, interval time.Duration, leaving bool) (items []*allotv1.LeaseItem, asking, forget bool) {
	p := b.gw.Plan(now, interval, leaving)
	item := func() *allotv1.LeaseItem {
		return &allotv1.LeaseItem{Domain: b.domain, Descriptors: b.wire}
	}
	for _, g := range p.Return {
		it := item()
		it.Returned, it.ReturnedGrantedAtUnixNano = g.Tokens, g.GrantedAt
		items = append(items, it)
	}
	if p.Used > 0 {
		if len(items) > 0 {
			items[0].Used = p.Used
		} else {
			it := item()
			it.Used = p.Used
			items = append(items, it)
		}
	}
	if p.Ask {
		it := item()
		it.Want = p.Want
		items = append(items, it)
	}
	return items, p.Ask, p.Forget
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
		answered(slots, false)
		for _, s := range slots {
			if !isUnavailable(err) {
				c.keys.remove(s.b)
			}
		}
		return err
	}
	if len(resp.GetGrants()) != len(items) {
		answered(slots, false)
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
		s.b.apply(g, sent, ttl, now, c.cfg.SyncInterval, s.seq)
		s.b.mu.Unlock()
	}
	answered(slots, true)
	return nil
}

// apply takes one grant into b (regional.GatewayKey.Answer); the caller
// holds b.mu.
func (b *bucket) apply(g *allotv1.LeaseGrant, sent time.Time, ttl time.Duration, now time.Time, interval time.Duration, seq uint64) {
	b.fallback = fallbacks(g.GetFallback(), b.fallback)
	d := fromResult(&allotv1.CheckResult{Allowed: true, Limits: g.GetLimits()})
	d.Source = SourceLease
	b.info = d
	a := regional.GatewayAnswer{Mode: regional.GatewayLeased, Granted: g.GetGranted(), GrantedAt: g.GetGrantedAtUnixNano(),
		TTL: ttl, RetryAfter: g.GetRetryAfter().AsDuration()}
	switch {
	case g.GetCheckEach():
		a.Mode = regional.GatewayCheckEach
	case d.Limit == "":
		a.Mode = regional.GatewayUnlimited
	default:
		b.answered(d.Remaining, seq)
	}
	b.gw.Answer(now, sent, a, interval)
}
