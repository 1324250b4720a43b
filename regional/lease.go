package regional

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// Leases. An instance takes a leased key's tokens from the store in
// batches and spends them in memory. A lease's size follows this
// instance's spend rate: what it spends in one LeaseTTL (1% of the
// region's burst B for the key at first), at most B ÷ (2 × instances), so
// that the instances together hold at most half the bucket and none can
// starve the others. A lease below half its size is topped up to its size
// by the request that notices, after its own decision, so that requests
// seldom wait for the store. Unused tokens go back when the lease expires
// (Tick) or at shutdown (Close); sliding window leases expire with their
// window.
//
// Bound: every token spent was taken from the store's bucket, which admits
// at most B + rate × T over any interval T; tokens held at the interval's
// start may be spent on top. So a leased key admits at most
// B + rate × T + B/2 over any interval T, and B + rate × T from its first
// use. A crashed instance's leases are lost, which only under-admits.

// leaseShard holds the leases of keys of one shard.
type leaseShard struct {
	mu sync.Mutex
	m  map[uint64]*lease
	_  [64]byte // keep neighbouring shards' locks off one cache line
}

// lease is what this instance holds of one leased key. Its shard's mu
// guards it.
type lease struct {
	stats   *limitStats
	bucket  Bucket  // as of the last store call, for give-backs
	tokens  float64 // held, not spent
	expires int64   // unix ns from which tokens must go back, not be spent
	window  int64   // sliding_window: the window the tokens came from
	denied  int64   // unix ns until which the store is known to be short
	avail   float64 // the store's tokens after the last grant
	size    float64 // the size of the last lease taken
	since   int64   // last grant (unix ns); spent counts from it
	spent   float64
	rate    float64       // spend rate estimate, tokens per second
	refill  chan struct{} // non-nil while a store call runs for the lease; closed after
}

func (sh *leaseShard) get(key uint64) *lease {
	l := sh.m[key]
	if l == nil {
		if sh.m == nil {
			sh.m = make(map[uint64]*lease)
		}
		l = &lease{}
		sh.m[key] = l
	}
	return l
}

// spend takes work i's cost from its lease. When the lease runs below
// half its size, the request that notices tops it up (its own decision is
// made: a failure there is not its); when it is short or expired, the
// request takes a new one. One store call runs per lease at a time; a
// request that needs its result waits for it, within its deadline.
func (d *decision) spend(i int) (outcome, error) {
	w, t := &d.ws[i], d.t
	sh := &d.r.f.leases[shardOf(w.key)]
	sh.mu.Lock()
	for {
		l := sh.get(w.key)
		switch {
		case t < l.expires && w.cost <= l.tokens:
			o := l.take(w.cost)
			if l.tokens < l.size/2 && l.refill == nil && t >= l.denied {
				d.refill(i, sh, l, 0)
			}
			sh.mu.Unlock()
			return o, nil
		case t < l.denied:
			o := outcome{retryAfter: l.denied - t, remaining: l.tokens + l.avail}
			sh.mu.Unlock()
			return o, nil
		case l.refill != nil:
			ch := l.refill
			sh.mu.Unlock()
			select {
			case <-ch:
			case <-d.deadline().Done():
				return outcome{}, d.deadline().Err()
			}
			sh.mu.Lock()
			continue
		}
		if err := d.refill(i, sh, l, w.cost); err != nil {
			sh.mu.Unlock()
			return outcome{}, err
		}
		// Now the lease holds the cost, or the store is known short.
	}
}

// refill takes work i's key's next lease: the tokens an expired lease
// holds go back, and the store tops the lease up to its size, or at least
// to need (0: any grant will do). It is called, and returns, with sh.mu
// held; the store call runs without it.
func (d *decision) refill(i int, sh *leaseShard, l *lease, need float64) error {
	f, w, t, p := d.r.f, &d.ws[i], d.t, d.steps[i].p
	op := LeaseOp{Bucket: d.bucket(i)}
	if t >= l.expires { // expired, or new: what it holds goes back
		op.Return, op.Window = l.tokens, l.window
		l.tokens = 0
	}
	size := f.leaseSize(l, p)
	op.Min = max(need-l.tokens, 0)
	op.Want = max(op.Min, size-l.tokens)
	if op.Want <= 0 && op.Return <= 0 {
		return nil // a top-up that the new size no longer calls for
	}
	l.bucket, l.stats = op.Bucket, f.stats(d.r.domain, w.ls)
	ch := make(chan struct{})
	l.refill = ch
	sh.mu.Unlock()

	var res [1]LeaseResult
	err := f.store.Lease(d.deadline(), d.r.now, []LeaseOp{op}, res[:])

	sh.mu.Lock()
	l.refill = nil
	close(ch)
	if err != nil {
		return err
	}
	l.granted(op, res[0], t, f.opts.LeaseTTL)
	l.size = size
	if res[0].Granted == 0 && op.Want > 0 {
		// Ask again when a whole lease is there, not at every request, and
		// at least every lease TTL: a share raised since (from 0, say, for
		// an instance that held nothing) may fill it sooner.
		l.denied = t + min(max(int64(res[0].RetryAfter), p.wait(size-res[0].Available), 1), int64(f.opts.LeaseTTL))
	}
	return nil
}

func (l *lease) take(cost float64) outcome {
	l.tokens -= cost
	l.spent += cost
	return outcome{allowed: true, remaining: l.tokens + l.avail}
}

// granted records the store's answer to op.
func (l *lease) granted(op LeaseOp, r LeaseResult, t int64, ttl time.Duration) {
	if op.Return > 0 {
		l.stats.returns.Add(1)
		l.stats.expirations.Add(1)
		l.stats.returned.Add(uint64(op.Return))
	}
	if l.since > 0 && t > l.since {
		rate := l.spent * 1e9 / float64(t-l.since)
		if l.rate > 0 {
			rate = (rate + l.rate) / 2
		}
		l.rate = rate
	}
	l.since, l.spent, l.avail = t, 0, r.Available
	if r.Granted > 0 {
		l.stats.grants.Add(1)
		l.stats.granted.Add(uint64(r.Granted))
		if r.WindowLeft > 0 {
			ttl = min(ttl, r.WindowLeft)
		}
		l.tokens += r.Granted
		l.expires, l.window, l.denied = t+int64(ttl), r.Window, 0
	}
}

// leaseSize is how many tokens l's next lease holds: what this instance
// spends in a LeaseTTL, 1% of the burst while that is not known yet, at
// most burst ÷ (2 × instances).
func (f *Enforcer) leaseSize(l *lease, p params) float64 {
	most := max(1, math.Floor(p.burst/float64(2*f.Instances())))
	want := math.Ceil(p.burst / 100)
	if l.rate > 0 {
		want = math.Ceil(l.rate * f.opts.LeaseTTL.Seconds())
	}
	return min(most, max(want, 1))
}

// unspend gives cost back to key's lease: its request was rejected by
// another limit.
func (f *Enforcer) unspend(key uint64, cost float64) {
	sh := &f.leases[shardOf(key)]
	sh.mu.Lock()
	if l := sh.m[key]; l != nil {
		l.tokens += cost
		l.spent -= cost
	}
	sh.mu.Unlock()
}

// returnLeases gives back the unused tokens of expired leases, or of all
// of them, and drops idle leases. A lease's tokens leave it before the
// call, so requests never wait for a give-back; tokens whose give-back
// fails are lost, which under-admits until the bucket refills.
func (f *Enforcer) returnLeases(ctx context.Context, now time.Time, all bool) error {
	t := now.UnixNano()
	var ops []LeaseOp
	var stats []*limitStats
	for i := range f.leases {
		sh := &f.leases[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			switch {
			case l.refill != nil:
			case l.tokens > 0 && (all || t >= l.expires):
				ops = append(ops, LeaseOp{Bucket: l.bucket, Return: l.tokens, Window: l.window})
				stats = append(stats, l.stats)
				l.tokens = 0
			case l.tokens <= 0 && t >= l.expires && t >= l.denied:
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
	const chunk = 256
	var errs error
	for len(ops) > 0 {
		n := min(len(ops), chunk)
		cctx, cancel := context.WithTimeout(ctx, f.background())
		err := f.store.Lease(cctx, now, ops[:n], make([]LeaseResult, n))
		cancel()
		if err == nil {
			for j, st := range stats[:n] {
				st.returns.Add(1)
				st.returned.Add(uint64(ops[j].Return))
				if !all {
					st.expirations.Add(1)
				}
			}
		}
		errs = errors.Join(errs, err)
		ops, stats = ops[n:], stats[n:]
	}
	return errs
}
