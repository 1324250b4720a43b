package regional

import (
	"math"
	"time"
)

// The sizing of gateway leases (the Lease RPC served by regional/server,
// spent by the Go SDK in client/). They live in the core so that the
// simulator drives the same policy as the enforcer and the SDK.

// GatewayGrant sizes a grant: what the gateway asked for, at most half of
// what the most restrictive limit has left (so that one gateway never
// drains a key other gateways use), at least 1 while anything is left.
// left < 0 means no limit applies: the whole ask is granted.
func GatewayGrant(want, left int64) int64 {
	if left < 0 {
		return want
	}
	return min(want, max(min(left, 1), left/2))
}

// GatewayWant is what a gateway asks for: two sync intervals of its own
// rate of hits per second, and at least its largest request. A lease thus
// follows the key's traffic at that gateway, not a fixed fraction of the
// limit: a key that only 10 of 200 gateways see is not capped at 10/200.
func GatewayWant(rate float64, interval time.Duration, maxHits int64) int64 {
	return max(int64(math.Ceil(rate*2*interval.Seconds())), maxHits, 1)
}

// GatewayRate is a gateway's rate of a key after a round: hits asked
// over the dt since the previous round, averaged with the previous rate
// over about two rounds; a rising rate is followed at once, so that a
// burst does not run on Check calls. A dt ≤ 0 keeps the previous rate.
func GatewayRate(prev float64, hits int64, dt time.Duration) float64 {
	if dt <= 0 {
		return prev
	}
	inst := float64(hits) / dt.Seconds()
	return max(inst, 0.5*prev+0.5*inst)
}

// GatewayRenew reports whether a gateway holding held tokens, spending at
// rate, should ask for more in this round: they would not last until the
// round after next.
func GatewayRenew(held int64, rate float64, interval time.Duration) bool {
	return rate > 0 && float64(held) < rate*1.5*interval.Seconds()
}

// LeaseGrant is one grant a gateway holds: Tokens charged by the enforcer
// at GrantedAt (its clock, unix ns; echoed when they are returned), to be
// spent before Expires (the gateway's clock).
type LeaseGrant struct {
	Tokens    int64
	GrantedAt int64
	Expires   time.Time
}

// LeaseHold is what a gateway holds for one key: at most two grants,
// spent older first, so that the next grant can be asked for while the
// current one still covers the requests that arrive meanwhile. The zero
// value holds nothing. Not safe for concurrent use; the caller
// serialises.
type LeaseHold struct {
	Old, Cur LeaseGrant
}

// Take spends n from the grants, older first, if they hold that much.
func (h *LeaseHold) Take(n int64) bool {
	if h.Old.Tokens+h.Cur.Tokens < n {
		return false
	}
	from := min(n, h.Old.Tokens)
	h.Old.Tokens -= from
	h.Cur.Tokens -= n - from
	return true
}

// Held is what the grants hold.
func (h *LeaseHold) Held() int64 { return h.Old.Tokens + h.Cur.Tokens }

// Ending removes the grants with tokens that expire before edge (every
// one, with all) and appends them to dst, to be returned.
func (h *LeaseHold) Ending(edge time.Time, all bool, dst []LeaseGrant) []LeaseGrant {
	for _, g := range [...]*LeaseGrant{&h.Old, &h.Cur} {
		if g.Tokens > 0 && (all || !edge.Before(g.Expires)) {
			dst = append(dst, *g)
			*g = LeaseGrant{}
		}
	}
	h.shift()
	return dst
}

// MakeRoom removes the older grant when both hold tokens, so that a new
// one fits, and reports it (to be returned).
func (h *LeaseHold) MakeRoom() (LeaseGrant, bool) {
	if h.Old.Tokens == 0 || h.Cur.Tokens == 0 {
		return LeaseGrant{}, false
	}
	g := h.Old
	h.Old, h.Cur = h.Cur, LeaseGrant{}
	return g, true
}

// Add takes a new grant. Were both grants still holding tokens (spent
// slower than asked), the new one is dropped: its tokens stay charged,
// never spent twice.
func (h *LeaseHold) Add(g LeaseGrant) {
	h.shift()
	switch {
	case h.Old.Tokens == 0:
		h.Old = g
	case h.Cur.Tokens == 0:
		h.Cur = g
	}
}

// shift keeps the older grant in Old.
func (h *LeaseHold) shift() {
	if h.Old.Tokens == 0 {
		h.Old, h.Cur = h.Cur, LeaseGrant{}
	}
}
