package regional

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/allot-dev/allot"
)

// Leases. An instance takes a leased key's tokens from the store in
// batches and spends them in memory. A lease's size follows this key's
// demand at this instance (what its requests ask, admitted or not): what
// they ask in the lease's life, a LeaseTTL (1% of the region's burst B
// for the key at first), at most B ÷ (2 × instances), so that the
// instances together hold at most half the bucket and none can starve
// the others. A lease below half its size is topped up to its size by
// the request that notices, after its own decision, so that requests
// seldom wait for the store. Unused tokens go back when the lease expires
// (Tick) or at shutdown (Close); sliding window leases expire with their
// window.
//
// When the store holds less than a lease asks, the lease takes what is
// there (a partial lease) and asks again once half a lease has come back,
// rejecting meanwhile once spent (nextAsk). A sliding window under
// saturation loses what is left in its store and in its leases when it
// ends (that window admitted less, and the next can admit no more than
// its amount), so its leases live no longer than their window, are sized
// to what their key asks in the time left (in halves in the last stretch),
// take what the window will gain in the next half of its period
// (LeaseOp.Ahead, at most a LeaseTTL), and the last ask of a window comes
// within half that of its end: its leases drain the window.
//
// Bound: every token spent was taken from the store's bucket, which admits
// at most B + rate × T over any interval T; tokens held at the interval's
// start may be spent on top. So a leased key admits at most
// B + rate × T + B/2 over any interval T, and B + rate × T from its first
// use. A leased sliding window (B its amount) admits at most its amount
// in each of its windows, as the store's window counts every lease taken
// in it, and looking ahead passes the window's weighted estimate by at
// most what it gains in half a period, B/2: B + rate × T + B/2 again. A
// crashed instance's leases are lost, which only under-admits.

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
	bucket  Bucket        // as of the last store call, for give-backs
	tokens  float64       // held, not spent
	expires int64         // unix ns from which tokens must go back, not be spent
	window  int64         // sliding_window: the window the tokens came from
	ends    int64         // sliding_window: unix ns at which the window of the last store call ends
	denied  int64         // unix ns until which the store is known to be short
	avail   float64       // the store's tokens after the last grant
	size    float64       // the size of the last lease taken
	since   int64         // last store call (unix ns); asked counts from it
	asked   float64       // what this key's requests cost since, admitted or not
	rate    float64       // demand rate estimate (asked), tokens per second
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
	for asked := false; ; {
		l := sh.get(w.key)
		if !asked { // the key's demand, admitted or not, sizes its leases
			l.asked, asked = l.asked+w.cost, true
		}
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
	size := f.leaseSize(l, p, t)
	op.Min = max(need-l.tokens, 0)
	op.Want = max(op.Min, size-l.tokens)
	if left := l.windowLeft(p, t); left > 0 {
		op.Ahead = time.Duration(min(left, f.ahead(p)))
	}
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
	if res[0].Granted < op.Want {
		l.denied = t + f.nextAsk(l, p, size, res[0], t)
	}
	return nil
}

// nextAsk is how long after a grant short of what it asked (the store
// held less) the lease asks the store again; till then it is spent, then
// rejects: the store is short. It asks when half a lease has come back
// into the store, not at every request (at most one store call per half
// lease), and not later than a lease TTL (a share raised since, from 0
// say, may fill it sooner) nor, for a sliding window, than its window's
// end: once within half the look-ahead of the end at the latest, so that
// one ask reaches it (refill). Near that end its leases are smaller
// (leaseSize), so its last asks come at about half the time left, down to
// the time the window gains 0.5% of its amount in.
func (f *Enforcer) nextAsk(l *lease, p params, size float64, r LeaseResult, t int64) int64 {
	chunk := max(size/2, 1)
	if p.alg == allot.SlidingWindow {
		chunk = max(chunk, p.amount/200)
	}
	wait := p.wait(chunk - r.Available)
	if r.Granted == 0 {
		wait = max(wait, int64(r.RetryAfter))
	}
	wait = min(max(wait, 1), int64(f.opts.LeaseTTL))
	if left := l.windowLeft(p, t); left > 0 {
		if h := f.ahead(p) / 2; left > h {
			left -= h
		}
		wait = min(wait, left)
	}
	return wait
}

// ahead is how far a sliding window's lease looks ahead: half the
// window, at most a LeaseTTL (its life). What the window gains in half
// its period is at most half its amount: a leased sliding window stays
// within burst + rate × T + burst/2 over any interval T, as a leased
// bucket does.
func (f *Enforcer) ahead(p params) int64 {
	return min(p.period/2, int64(f.opts.LeaseTTL))
}

// windowLeft is, for a sliding window, how long the window of instant t
// has left, as the store's last answer gives it on this instance's clock;
// 0 when not known.
func (l *lease) windowLeft(p params, t int64) int64 {
	if p.alg != allot.SlidingWindow || l.ends <= 0 || p.period <= 0 {
		return 0
	}
	left := l.ends - t
	if left <= 0 { // a later window
		left = p.period - (-left)%p.period
	}
	return left
}

func (l *lease) take(cost float64) outcome {
	l.tokens -= cost
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
		// Averaged over about a quarter of a lease's life, weighing each
		// interval by its length: store calls close together say little.
		dt := float64(t - l.since)
		rate := l.asked * 1e9 / dt
		if l.rate > 0 {
			w := 1 - math.Exp(-dt/float64(ttl/4))
			rate = w*rate + (1-w)*l.rate
		}
		l.rate = rate
	}
	l.since, l.asked, l.avail = t, 0, r.Available
	if r.WindowLeft > 0 {
		l.ends = t + int64(r.WindowLeft)
	}
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

// leaseSize is how many tokens l's next lease holds: what its key asks
// of this instance in the lease's life, 1% of the burst while that is not
// known yet, at most burst ÷ (2 × instances). A lease lives a LeaseTTL, a
// sliding window's no longer than its window: what its leases hold when
// the window ends is lost, so a lease late in a window is smaller.
func (f *Enforcer) leaseSize(l *lease, p params, t int64) float64 {
	most := max(1, math.Floor(p.burst/float64(2*f.Instances())))
	want := math.Ceil(p.burst / 100)
	if l.rate > 0 {
		life := int64(f.opts.LeaseTTL)
		left := l.windowLeft(p, t)
		if left > 0 && left <= f.ahead(p) {
			// The window's last leases, in halves of what is left, so
			// that little is left at its end: none when the key asks
			// less than one in that time (its requests take what they
			// need).
			return min(most, math.Round(l.rate*float64(left/2)/1e9))
		}
		if left > 0 {
			life = min(life, left)
		}
		want = math.Ceil(l.rate * float64(life) / 1e9)
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
		l.asked -= cost
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
			case l.tokens <= 0 && t >= l.expires && t >= l.denied && t-l.since >= int64(f.opts.LeaseTTL):
				// Idle for a lease TTL: a lease that a busy key renews at
				// every window keeps its rate.
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
