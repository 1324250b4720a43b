package regional

import (
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// params are one key's budget in this region at this instant: the key's
// effective limit scaled by the region's share.
//
// Slot fields by algorithm:
//
//	token_bucket:   t = last refill (unix ns), a = tokens (may be < 0 after a forced charge),
//	                b = own burst the tokens were counted under (params.own)
//	gcra:           t = theoretical arrival time (unix ns), b = last update (unix ns, its int64 bits)
//	sliding_window: t = current window start (unix ns), a = current count, b = previous count
type params struct {
	alg    allot.Algorithm
	amount float64 // per period
	burst  float64 // capacity (token bucket, gcra)
	period int64   // ns
	// own is the burst before the share: the limit's own, after plan and
	// override. A token bucket follows a raise of it (tokensAt); the
	// share leaves it alone.
	own float64
	// cap, when above 0, bounds a sliding window's count in its window:
	// a persisted key's mark (persist.go); a check rejected by it alone
	// retries after capRetry ns. Remaining ignores it (it is the
	// allowance's: a key held at its mark is not near its limit).
	cap      float64
	capRetry int64
	// spentAt, when above 0, is when a fallback began (Enforcer, on_failure
	// local): the store may have spent the region's allowance up to then,
	// which the fallback table does not know, so a sliding window admits
	// nothing in the window that holds it, and a token bucket or GCRA key
	// is empty at that instant (a key new to the table, or one last
	// charged in an earlier fallback, less what it still owes the store:
	// what it lacked of full at backAt, when the store was back after
	// that fallback), refilling from there.
	spentAt, backAt int64
}

// fitSlack is how far below a whole amount an allowance may be and
// still admit it: a share, a weight and their product are rounded (shares
// are float32, rounded down), and one whole request a window at an
// instance (20 a window × a share of 0.3 ÷ 6 instances) comes out a few
// 1e-7 short of 1, which would admit nothing. It is far below any cost
// (a whole number), so what n instances admit together exceeds the sum
// of their allowances by less than n × fitSlack: below one request for
// fewer than 100,000 instances, and admissions are whole.
const fitSlack = 1e-5

// maxWait caps reported durations: a key whose rate is 0 (share 0) never
// refills, and reports this instead of infinity.
const maxWait = int64(366 * 24 * time.Hour)

func (p params) scaled(share float64) params {
	p.amount *= share
	p.burst *= share
	return p
}

// refill is what accrues in dt ns. It multiplies before it divides, so
// that whole amounts and periods give exact results.
func (p params) refill(dt int64) float64 { return float64(dt) * p.amount / float64(p.period) }

// wait converts an amount still missing into the time it takes to refill.
func (p params) wait(missing float64) int64 {
	if missing <= 0 {
		return 0
	}
	if p.amount <= 0 {
		return maxWait
	}
	w := math.Ceil(missing * float64(p.period) / p.amount)
	if w >= float64(maxWait) {
		return maxWait
	}
	return int64(w)
}

// outcome is what one key's algorithm says about one charge.
type outcome struct {
	allowed    bool
	remaining  float64 // after the charge when allowed
	resetAfter int64   // ns until the state is full again
	retryAfter int64   // ns until the same cost would pass; 0 when allowed
}

// fresh initialises a new key's state at now: a full bucket.
func fresh(s *slot, now int64, p params) {
	switch p.alg {
	case allot.TokenBucket:
		s.t, s.a, s.b = now, p.burst, p.own
	case allot.GCRA:
		s.t, s.b = now, bitsOf(now)
	case allot.SlidingWindow:
		s.t, s.a, s.b = now-now%p.period, 0, 0
	}
	s.idleAt = now
}

// bitsOf keeps an instant in a float64 field bit for bit: a float64 of
// unix nanoseconds would round it to 256 ns, and a key could then refill
// from an instant that has not come yet.
func bitsOf(t int64) float64 { return math.Float64frombits(uint64(t)) }

// lastUpdate is when the state was last brought up to date.
func lastUpdate(s *slot, alg allot.Algorithm) int64 {
	if alg == allot.GCRA {
		return int64(math.Float64bits(s.b))
	}
	return s.t
}

// tokensAt is how much a token bucket or GCRA state holds at t ≥ lastUpdate.
//
// A raise of the limit's own burst (configuration, plan, override: not
// the share) is there at once, and what was spent stays spent: the
// bucket holds what it would at the old burst plus the difference. That
// is how a sliding window takes a raised amount (its counts are
// absolute) and how GCRA takes a raised burst (its arrival time is), and
// it keeps Sweep's promise: a bucket full at the old burst holds the new
// one, as a swept key made again does. (Applied when the key is next
// touched, it gives what it would have at the raise: a bucket full
// before it is full after.) A lowered burst clamps the tokens.
func tokensAt(s *slot, t int64, p params) float64 {
	switch p.alg {
	case allot.TokenBucket:
		burst := p.burst
		if s.b < p.own { // raised since s was updated
			burst = p.burst * (s.b / p.own) // the old burst at this share
		}
		if s.a >= burst {
			return p.burst
		}
		return math.Min(p.burst, math.Min(burst, s.a+p.refill(t-s.t))+(p.burst-burst))
	case allot.GCRA:
		debt := s.t - t
		if debt <= 0 {
			return p.burst
		}
		return p.burst - p.refill(debt)
	}
	return 0
}

// setTokens makes s hold tok at t under p.
func setTokens(s *slot, t int64, tok float64, p params) {
	switch p.alg {
	case allot.TokenBucket:
		s.t, s.a, s.b = t, tok, p.own
	case allot.GCRA:
		s.t, s.b = t+p.wait(p.burst-tok), bitsOf(t)
	}
}

// take charges cost at now. With force it charges even when the budget is
// short (a settle of real usage: a token bucket goes below zero, a GCRA
// arrival time moves further ahead). It updates s only when it charges;
// otherwise s is brought up to date without a charge.
func take(s *slot, now int64, p params, cost float64, force bool) outcome {
	switch p.alg {
	case allot.TokenBucket, allot.GCRA:
		return takeTokens(s, now, p, cost, force)
	default:
		return takeWindow(s, now, p, cost, force)
	}
}

func takeTokens(s *slot, now int64, p params, cost float64, force bool) outcome {
	if last := lastUpdate(s, p.alg); p.spentAt > 0 && last < p.spentAt { // a fallback's key from before it began
		owed := 0.0
		if last <= p.backAt && p.backAt < p.spentAt { // never repaid (Enforcer's repay)
			owed = math.Max(0, p.burst-tokensAt(s, p.backAt, p))
		}
		setTokens(s, p.spentAt, -owed, p)
	}
	if last := lastUpdate(s, p.alg); now < last {
		now = last // time never runs backwards for one key
	}
	tok := tokensAt(s, now, p)
	o := outcome{allowed: cost <= tok+fitSlack}
	if o.allowed || force {
		tok -= cost
	} else {
		o.retryAfter = p.wait(cost - tok)
		if cost > p.burst {
			o.retryAfter = maxWait // can never pass at this size
		}
	}
	setTokens(s, now, tok, p)
	if p.alg == allot.GCRA {
		// GCRA keeps an instant, rounded up to the nanosecond: what the
		// next check at now sees may be a hair less than tok.
		tok = tokensAt(s, now, p)
	}
	o.remaining = math.Max(0, tok)
	o.resetAfter = p.wait(p.burst - tok)
	s.idleAt = now + o.resetAfter
	return o
}

// roll moves a sliding window state to the window that holds now.
func roll(s *slot, now int64, p params) {
	ws := now - now%p.period
	switch {
	case ws == s.t:
	case ws == s.t+p.period:
		s.t, s.b, s.a = ws, s.a, 0
	case ws > s.t:
		s.t, s.b, s.a = ws, 0, 0
	}
}

// takeWindow estimates the last period's count as prev·(1−x) + cur, where x
// is the elapsed fraction of the current window. Comparisons are multiplied
// out by the period, so whole counts give exact answers.
func takeWindow(s *slot, now int64, p params, cost float64, force bool) outcome {
	roll(s, now, p)
	if now < s.t {
		now = s.t
	}
	period := float64(p.period)
	left := float64(s.t + p.period - now) // ns until the window ends
	// est·P = prev·left + cur·P
	estP := s.b*left + s.a*period
	fits := estP+cost*period <= (p.amount+fitSlack)*period
	capped := p.cap > 0 && s.a+cost > p.cap
	spent := p.spentAt > 0 && s.t <= p.spentAt && p.spentAt < s.t+p.period
	o := outcome{allowed: fits && !capped && !spent}
	if o.allowed || force {
		s.a += cost
		estP += cost * period
	} else if spent {
		o.retryAfter = int64(left)
	} else if fits {
		o.retryAfter = p.capRetry
	} else {
		o.retryAfter = windowRetry(s, p, cost, left)
	}
	o.remaining = math.Max(0, math.Floor(p.amount-estP/period))
	if spent {
		o.remaining = 0
	}
	switch {
	case s.a > 0:
		o.resetAfter = s.t + 2*p.period - now
	case s.b > 0:
		o.resetAfter = s.t + p.period - now
	}
	s.idleAt = now + o.resetAfter
	return o
}

// windowRetry is when est + cost first fits under amount if nothing else is
// charged: later in this window, as the previous window's weight decays, or
// in the next, where this window's count decays in turn.
func windowRetry(s *slot, p params, cost, left float64) int64 {
	period := float64(p.period)
	if room := p.amount - s.a - cost; room >= 0 && s.b > 0 {
		// prev·l/P ≤ room  ⇔  l ≤ room·P/prev: wait until that much is left
		return int64(math.Ceil(left - room*period/s.b))
	}
	if cost > p.amount {
		return maxWait
	}
	if s.a <= 0 {
		return int64(math.Ceil(left))
	}
	// next window: cur·l'/P + cost ≤ amount  ⇔  l' ≤ (amount−cost)·P/cur
	wait := period - (p.amount-cost)*period/s.a
	return int64(math.Ceil(left + math.Max(0, wait)))
}

// refund gives n back to the key, never above a full state.
func refund(s *slot, now int64, p params, n float64) {
	switch p.alg {
	case allot.TokenBucket, allot.GCRA:
		if last := lastUpdate(s, p.alg); now < last {
			now = last
		}
		tok := math.Min(p.burst, tokensAt(s, now, p)+n)
		setTokens(s, now, tok, p)
		s.idleAt = now + p.wait(p.burst-tok)
	case allot.SlidingWindow:
		roll(s, now, p)
		s.a = math.Max(0, s.a-n)
	}
}
