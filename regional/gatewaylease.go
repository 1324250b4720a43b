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

// GatewayRenew reports whether a gateway holding held tokens, spending at
// rate, should ask for more in this round: they would not last until the
// round after next.
func GatewayRenew(held int64, rate float64, interval time.Duration) bool {
	return rate > 0 && float64(held) < rate*1.5*interval.Seconds()
}
