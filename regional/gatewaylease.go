package regional

import (
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// The sizing of gateway leases (the Lease RPC served by regional/server,
// spent by the Go SDK in client/) and a gateway's per-key loop over them
// (GatewayKey). They live in the core so that the simulator drives the
// same policy as the enforcer and the SDK.

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

// GatewayLeft is what the most restrictive non-shadow limit of dec has
// left, GatewayGrant's left: -1 when no limit applies.
func GatewayLeft(dec *allot.Decision) int64 {
	left := int64(-1)
	for _, st := range dec.Statuses {
		if !st.Shadow && (left < 0 || st.Remaining < left) {
			left = st.Remaining
		}
	}
	return left
}

// GatewayRetryAfter is the retry_after of a grant smaller than asked,
// from the enforcer's last decision for it: the decision's own, or the
// longest time a limit with nothing left takes to refill one token
// (window ÷ amount). regional/server's Lease and the simulator's enforcer
// answer with it.
func GatewayRetryAfter(dec *allot.Decision) time.Duration {
	if dec.RetryAfter > 0 {
		return dec.RetryAfter
	}
	var d time.Duration
	for _, st := range dec.Statuses {
		if !st.Shadow && st.Remaining == 0 && st.Window > 0 {
			d = max(d, st.Window/time.Duration(max(st.Limit, 1)))
		}
	}
	return d
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

// gatewayIdle is how many sync intervals a gateway's key may go unused
// before it is forgotten (everything it holds is returned first).
const gatewayIdle = 20

// gatewayReprobe is how often a key that takes no leases (check-each,
// unlimited) asks the enforcer again, so that a configuration change
// reaches it.
const gatewayReprobe = 5 * time.Second

// GatewayMode is how a gateway decides a key, as the enforcer's last
// Lease answer for it said.
type GatewayMode uint8

const (
	GatewayNew       GatewayMode = iota // no Lease answer yet: requests go to Check
	GatewayLeased                       // decided from leases
	GatewayCheckEach                    // an exact limit matches: every request goes to Check
	GatewayUnlimited                    // no limit matches: every request passes
)

// GatewayVerdict is what GatewayKey.Decide says of a request.
type GatewayVerdict uint8

const (
	GatewaySpent  GatewayVerdict = iota // the grants covered it: allowed
	GatewayPass                         // no limit matches the key: allowed, nothing spent
	GatewayDenied                       // the enforcer said nothing is left: rejected without a call
	GatewayAsk                          // send it to the enforcer's Check, then call Checked
)

// GatewayAnswer is the enforcer's answer to a round's ask for one key (a
// Lease grant, decoded by the edge).
type GatewayAnswer struct {
	Mode       GatewayMode   // GatewayLeased, GatewayCheckEach or GatewayUnlimited
	Granted    int64         // tokens charged for this gateway (GatewayLeased only)
	GrantedAt  int64         // the enforcer's clock at the charge, unix ns
	TTL        time.Duration // how long after the ask was sent the grant may be spent
	RetryAfter time.Duration // when less than asked was granted: when more may be
}

// GatewayPlan is what one key sends in a lease round.
type GatewayPlan struct {
	// Return are the grants to give back, older first: those ending
	// before the round after next (all of them when Forget), and the
	// older grant when a new one needs its room.
	Return []LeaseGrant
	Used   int64 // tokens spent from grants since the last round, to report
	// Ask says to ask for a grant of Want tokens; Want 0 asks only for
	// the enforcer's answer (a key that takes no leases probing again).
	// Its answer goes to Answer, a failed call to Unanswered.
	Ask    bool
	Want   int64
	Forget bool // the key was idle (or the gateway leaves): drop it after the returns
}

// GatewayKey is one key at one gateway: the per-key loop of a gateway
// that decides from leases (client/'s bucket and the simulator's
// gateways run it). Requests spend from its LeaseHold (Take, Decide);
// those it cannot cover go to the enforcer's Check (Checked takes the
// answer in); once per sync interval Plan says what goes back, what was
// used and what to ask for, and Answer takes the enforcer's grant in.
// Time is an argument; the edge does the calls.
//
// The zero value is a key in GatewayNew mode holding nothing, first
// used at the zero time (its first Plan finds it idle unless Decide ran);
// NewGatewayKey starts one at now. Not safe for concurrent use; the
// caller serialises.
type GatewayKey struct {
	hold        LeaseHold
	mode        GatewayMode
	spent       int64     // spent from grants since the last round
	asked       int64     // hits sent to Check since the last round
	maxHits     int64     // the largest request Decide saw since the last round
	rate        float64   // hits per second (GatewayRate)
	lastSync    time.Time // the last round
	lastUse     time.Time // the last Decide, or a round after spending from the grants
	probed      time.Time // the last answer
	needLease   bool      // a request found no lease: ask in the next round
	deniedUntil time.Time // the enforcer said nothing is left until then
}

// NewGatewayKey is a key first used at now.
func NewGatewayKey(now time.Time) GatewayKey {
	return GatewayKey{lastSync: now, lastUse: now}
}

// Mode is how the key is decided.
func (k *GatewayKey) Mode() GatewayMode { return k.mode }

// Held is what the key's grants hold.
func (k *GatewayKey) Held() int64 { return k.hold.Held() }

// Take spends hits from the grants, older first, when the key is leased
// and they hold that much: the fast path, which reads no clock and
// counts as no use (Decide does).
func (k *GatewayKey) Take(hits int64) bool {
	if k.mode != GatewayLeased || !k.hold.Take(hits) {
		return false
	}
	k.spent += hits
	return true
}

// Decide decides a request Take did not cover, at now: spent from a
// grant that arrived meanwhile, passed when no limit matches, denied
// until the instant the enforcer's last answer said (wait is how long
// from now), or to be asked of the enforcer's Check (its hits count
// towards the rate). It records the use.
func (k *GatewayKey) Decide(now time.Time, hits int64) (v GatewayVerdict, wait time.Duration) {
	k.lastUse = now
	k.maxHits = max(k.maxHits, hits)
	switch {
	case k.Take(hits):
		return GatewaySpent, 0
	case k.mode == GatewayUnlimited:
		return GatewayPass, 0
	case k.mode == GatewayLeased && hits > 0 && now.Before(k.deniedUntil):
		return GatewayDenied, k.deniedUntil.Sub(now)
	}
	k.asked += hits
	return GatewayAsk, 0
}

// Checked takes in the enforcer's Check answer to a request Decide sent
// at now, and reports whether the key takes leases (the next round then
// asks for one; the edge may run it early). A rejection refuses
// requests of the key without a call until the enforcer's retryAfter, at
// least a quarter interval (within which the next round asks for
// whatever refilled) and at most an interval (other gateways' returns
// may free tokens sooner).
func (k *GatewayKey) Checked(now time.Time, hits int64, allowed bool, retryAfter, interval time.Duration) (lease bool) {
	lease = k.mode != GatewayCheckEach && k.mode != GatewayUnlimited
	k.needLease = k.needLease || lease
	if !allowed && hits > 0 && retryAfter > 0 {
		k.deniedUntil = now.Add(min(max(retryAfter, interval/4), interval))
	}
	return lease
}

// Plan is the key's part of the lease round at now, one a sync interval
// (leaving: the gateway's last; everything goes back). It takes the
// grants it returns out of the key: they are gone even if the call
// fails (a lost return strands tokens, it never adds any).
//
// The rate is updated from the hits spent and asked since the last
// round (GatewayRate). Grants ending before the round after next (now +
// 1.5 intervals) go back; a key unused for 20 intervals returns
// everything and is forgotten. A leased (or new) key asks for
// GatewayWant when a request found no lease or what it holds would not
// last until the round after next (GatewayRenew), the older grant going
// back first when both hold tokens (LeaseHold.MakeRoom); not while the
// enforcer's last answer denies it, unless a request found no lease. A
// key that takes no leases asks again every 5 s.
func (k *GatewayKey) Plan(now time.Time, interval time.Duration, leaving bool) GatewayPlan {
	k.rate = GatewayRate(k.rate, k.spent+k.asked, now.Sub(k.lastSync))
	k.lastSync = now
	p := GatewayPlan{Used: k.spent}
	if k.spent > 0 {
		k.lastUse = now // a key served from its grants is in use
	}
	k.asked, k.spent = 0, 0
	p.Forget = leaving || now.Sub(k.lastUse) > gatewayIdle*interval
	p.Return = k.hold.Ending(now.Add(interval+interval/2), p.Forget, nil)
	if p.Forget {
		return p
	}
	switch k.mode {
	case GatewayCheckEach, GatewayUnlimited:
		p.Ask = now.Sub(k.probed) > gatewayReprobe
		return p
	}
	want := GatewayWant(k.rate, interval, k.maxHits)
	k.maxHits = 0
	if !k.needLease && !GatewayRenew(k.hold.Held(), k.rate, interval) {
		return p
	}
	if g, ok := k.hold.MakeRoom(); ok {
		p.Return = append(p.Return, g)
	}
	if now.Before(k.deniedUntil) && !k.needLease {
		return p
	}
	p.Ask, p.Want = true, want
	return p
}

// Answer takes in, at now, the enforcer's answer to the ask of the round
// sent at sent: the key's mode, and for a leased key the grant (spent
// until sent + TTL, on this gateway's clock) or, when nothing was
// granted, a refusal of its requests until RetryAfter, at most an
// interval.
func (k *GatewayKey) Answer(now, sent time.Time, a GatewayAnswer, interval time.Duration) {
	k.needLease = false
	k.probed = now
	k.mode = a.Mode
	if a.Mode != GatewayLeased {
		return
	}
	if a.Granted > 0 {
		k.hold.Add(LeaseGrant{Tokens: a.Granted, GrantedAt: a.GrantedAt, Expires: sent.Add(a.TTL)})
	} else if a.RetryAfter > 0 {
		k.deniedUntil = now.Add(min(a.RetryAfter, interval))
	}
}

// Unanswered records that the round's ask got no answer (the call
// failed): the next round asks only if the key still needs it.
func (k *GatewayKey) Unanswered() { k.needLease = false }
