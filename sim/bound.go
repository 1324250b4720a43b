package sim

import (
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// boundCheck checks a token bucket or GCRA limit's bound: over every
// interval [a, b] of true time, what every instance of every region
// admitted of one key is at most B + r·(b − a), B the limit's burst and r
// its rate. With A(t) the key's admitted up to t, the worst interval
// ending at an admission at b starts at the admission a ≤ b that
// minimises A(a⁻) − r·a, so one scan in time order per key keeps that
// minimum and A: O(1) per admission, two floats per key.
//
// Not safe for concurrent use; a system's metrics call it in time order.
type boundCheck struct {
	burst float64
	rate  float64 // per second
	// By key: cum[id] is A, what it admitted so far; low[id] the least
	// A(a⁻) − r·a over its admissions (+Inf before the first), reached
	// at start[id].
	cum, low []float64
	start    []time.Duration

	above int     // admissions that end an interval above the bound
	worst float64 // the largest excess, in cost
	key   int     // the key of the first largest excess, −1 if none
	from  time.Duration
	to    time.Duration // its interval
}

// boundTolerance absorbs the float rounding of A − r·t (cost units).
const boundTolerance = 1e-6

func newBoundCheck(l *allot.Limit, keys int) *boundCheck {
	b := &boundCheck{burst: float64(l.Burst), rate: float64(l.Rate.Amount) / l.Rate.Period.Seconds(),
		cum: make([]float64, keys), low: make([]float64, keys), start: make([]time.Duration, keys), key: -1}
	for i := range b.low {
		b.low[i] = math.Inf(1)
	}
	return b
}

// add counts cost admitted of key id now (true time, non-decreasing).
func (b *boundCheck) add(now time.Time, id int, cost float64) {
	at := now.Sub(T0)
	rt := b.rate * at.Seconds()
	if v := b.cum[id] - rt; v < b.low[id] {
		b.low[id], b.start[id] = v, at
	}
	b.cum[id] += cost
	if excess := b.cum[id] - rt - b.low[id] - b.burst; excess > boundTolerance {
		b.above++
		if excess > b.worst {
			b.worst, b.key, b.from, b.to = excess, id, b.start[id], at
		}
	}
}
