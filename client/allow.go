package client

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// maxDescriptors bounds the descriptors of one request (the enforcer's
// bound).
const maxDescriptors = 64

// Allow decides a request of cost hits (0 asks without charging). With a
// lease in hand it answers in memory; otherwise it asks the enforcer
// (batched with concurrent calls) and has the sync loop take a lease for
// the next requests of the same shape. When no enforcer answers, the
// matching limits' on_failure policies decide. A malformed request is
// rejected with Err wrapping ErrBadRequest and charges nothing.
func (c *Client) Allow(ctx context.Context, domain string, descriptors []allot.Descriptor, hits int64) Decision {
	if err := validate(domain, descriptors, hits); err != nil {
		return Decision{Err: err}
	}
	if c.closed.Load() {
		return Decision{Err: ErrClosed}
	}
	b := c.keys.get(domain, descriptors)
	if b != nil {
		b.mu.Lock()
		if b.gw.Take(hits) {
			d := b.allowed()
			b.mu.Unlock()
			c.stats.local.Add(1)
			return d
		}
		b.mu.Unlock()
	} else {
		b = c.keys.add(domain, descriptors)
	}
	return c.slow(ctx, b, hits)
}

func validate(domain string, descriptors []allot.Descriptor, hits int64) error {
	switch {
	case domain == "":
		return fmt.Errorf("%w: empty domain", ErrBadRequest)
	case len(descriptors) == 0:
		return fmt.Errorf("%w: no descriptors", ErrBadRequest)
	case len(descriptors) > maxDescriptors:
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrBadRequest, len(descriptors), maxDescriptors)
	case hits < 0 || hits > allot.MaxAmount:
		return fmt.Errorf("%w: hits %d is outside [0, %d]", ErrBadRequest, hits, int64(allot.MaxAmount))
	}
	for i, d := range descriptors {
		if len(d) == 0 {
			return fmt.Errorf("%w: descriptor %d is empty", ErrBadRequest, i)
		}
	}
	return nil
}

// slow decides a request the lease cannot cover: a key without a lease
// yet, an exhausted lease, a key whose limits must be checked each time,
// or a key the enforcer recently said has nothing left.
func (c *Client) slow(ctx context.Context, b *bucket, hits int64) Decision {
	b.mu.Lock()
	if hits > 0 && b.tokens() < hits {
		// Tokens on their way between this gateway and the enforcer: wait
		// for them rather than ask a Check that may not find them.
		c.awaitRound(ctx, b)
	}
	now := time.Now()
	switch v, wait := b.gw.Decide(now, hits); v {
	case regional.GatewaySpent: // a grant arrived meanwhile
		d := b.allowed()
		b.mu.Unlock()
		c.stats.local.Add(1)
		return d
	case regional.GatewayPass:
		d := b.info
		d.Allowed = true
		b.mu.Unlock()
		c.stats.local.Add(1)
		return d
	case regional.GatewayDenied:
		if b.left >= hits {
			break // the enforcer's latest answer has them: a denial would break its promise
		}
		d := b.info
		d.Allowed = false
		d.RetryAfter = wait
		d.Remaining = b.promise()
		b.mu.Unlock()
		c.stats.local.Add(1)
		return d
	}
	seq := b.seq
	b.mu.Unlock()

	ans, err := c.checks.do(ctx, &allotv1.CheckItem{Domain: b.domain, Descriptors: b.wire, Hits: &hits})
	if err == nil {
		c.stats.remote.Add(1)
		err = ans.err
	}
	if err != nil {
		if unreachable(err) || isUnavailable(err) || ctx.Err() != nil {
			return c.fallback(b, hits, err)
		}
		// The enforcer refused the request itself (bad input, unknown
		// domain): a shape never answered for is forgotten.
		b.mu.Lock()
		if b.gw.Mode() == regional.GatewayNew {
			b.mu.Unlock()
			c.keys.remove(b)
		} else {
			b.mu.Unlock()
		}
		return Decision{Err: fmt.Errorf("%w: %w", ErrBadRequest, err)}
	}
	d := fromResult(ans.res)
	d.Source = SourceEnforcer
	b.mu.Lock()
	// A rejection refuses requests of this shape here for a while
	// (GatewayKey.Checked); the sync loop asks for a lease.
	lease := b.gw.Checked(now, hits, d.Allowed, d.RetryAfter, c.cfg.SyncInterval)
	if b.gw.Mode() == regional.GatewayLeased {
		// What the enforcer has left is now this answer's; what this
		// gateway may count on adds what its grants hold.
		b.answered(d.Remaining, seq)
		d.Remaining = b.promise()
		if !d.Allowed && hits > 0 {
			// A grant asked while the Check was out may have taken what
			// the Check did not find: it is this gateway's once it lands.
			c.awaitRound(ctx, b)
			if b.gw.Take(hits) {
				d = b.allowed()
			}
		}
	}
	b.mu.Unlock()
	if lease {
		c.wake()
	}
	return d
}

// awaitRound waits, when a Lease round is moving b's tokens to or from
// the enforcer (b.round), until it is answered, at most Timeout or ctx;
// the caller holds b.mu, which is released meanwhile.
func (c *Client) awaitRound(ctx context.Context, b *bucket) {
	round := b.round
	if round == nil {
		return
	}
	b.mu.Unlock()
	t := time.NewTimer(c.cfg.Timeout)
	select {
	case <-round:
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	b.mu.Lock()
}

// fromResult describes the most restrictive limit of a Check result, as
// regional/server's headers pick it: the one that rejected with the
// longest wait, else the one with the least remaining (capped at its
// quota).
func fromResult(res *allotv1.CheckResult) Decision {
	d := Decision{Allowed: res.GetAllowed(), RetryAfter: res.GetRetryAfter().AsDuration()}
	var pick *allotv1.LimitStatus
	for _, st := range res.GetLimits() {
		if st.GetShadow() {
			continue
		}
		switch {
		case pick == nil:
			pick = st
		case !d.Allowed && !st.GetAllowed() && st.GetRetryAfter().AsDuration() > pick.GetRetryAfter().AsDuration():
			pick = st
		case d.Allowed && promised(st) < promised(pick):
			pick = st
		}
	}
	if pick != nil {
		d.Limit = pick.GetName()
		d.Amount = pick.GetLimit()
		d.Window = pick.GetWindow().AsDuration()
		d.Quota, d.QuotaWindow, d.Partition = pick.GetQuota(), pick.GetQuotaWindow().AsDuration(), pick.GetPartition()
		if d.Quota <= 0 { // an enforcer older than the quota
			d.Quota, d.QuotaWindow, d.Partition = d.Amount, d.Window, ""
		}
		d.Remaining = pick.GetRemaining()
		if d.Quota > 0 {
			d.Remaining = min(d.Remaining, d.Quota)
		}
	}
	return d
}

// promised is what a status's remaining promises the next requests, as
// the headers show it: at least 0 and at most its quota (its limit from
// an enforcer that sends none; no cap without either).
func promised(st *allotv1.LimitStatus) int64 {
	r, q := max(st.GetRemaining(), 0), st.GetQuota()
	if q <= 0 {
		q = st.GetLimit()
	}
	if q > 0 {
		r = min(r, q)
	}
	return r
}

// keyTable holds the buckets of the request shapes this gateway has seen,
// by a hash of domain and descriptors. Lookups take a shard's read lock.
type keyTable struct {
	seed   maphash.Seed
	shards [64]keyShard
}

type keyShard struct {
	mu sync.RWMutex
	m  map[uint64]*bucket // chained through bucket.next on collision
}

func (t *keyTable) init() {
	t.seed = maphash.MakeSeed()
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]*bucket)
	}
}

func (t *keyTable) hash(domain string, ds []allot.Descriptor) uint64 {
	h := maphash.String(t.seed, domain)
	for _, d := range ds {
		h = mix(h, uint64(len(d)))
		for _, e := range d {
			h = mix(h, maphash.String(t.seed, e.Key))
			h = mix(h, maphash.String(t.seed, e.Value))
		}
	}
	return h
}

func mix(h, v uint64) uint64 {
	h ^= v
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// get returns the bucket of (domain, ds), or nil.
func (t *keyTable) get(domain string, ds []allot.Descriptor) *bucket {
	h := t.hash(domain, ds)
	sh := &t.shards[h%uint64(len(t.shards))]
	sh.mu.RLock()
	b := sh.m[h]
	for b != nil && !b.is(domain, ds) {
		b = b.next
	}
	sh.mu.RUnlock()
	return b
}

// add returns the bucket of (domain, ds), making it if needed.
func (t *keyTable) add(domain string, ds []allot.Descriptor) *bucket {
	h := t.hash(domain, ds)
	sh := &t.shards[h%uint64(len(t.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for b := sh.m[h]; b != nil; b = b.next {
		if b.is(domain, ds) {
			return b
		}
	}
	b := newBucket(domain, ds)
	b.hash = h
	b.next = sh.m[h]
	sh.m[h] = b
	return b
}

// remove drops b from the table.
func (t *keyTable) remove(b *bucket) {
	sh := &t.shards[b.hash%uint64(len(t.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p := sh.m[b.hash]
	if p == b {
		if b.next == nil {
			delete(sh.m, b.hash)
		} else {
			sh.m[b.hash] = b.next
		}
		return
	}
	for ; p != nil; p = p.next {
		if p.next == b {
			p.next = b.next
			return
		}
	}
}

// all returns every bucket.
func (t *keyTable) all() []*bucket {
	var out []*bucket
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for _, b := range sh.m {
			for ; b != nil; b = b.next {
				out = append(out, b)
			}
		}
		sh.mu.RUnlock()
	}
	return out
}

func (t *keyTable) len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for _, b := range sh.m {
			for ; b != nil; b = b.next {
				n++
			}
		}
		sh.mu.RUnlock()
	}
	return n
}
