package allot

import (
	"math"
	"time"
)

// SharedBurst is the part of a shared-mode key's amount that a region
// may admit at any pace beyond what its peers have seen (SharedBudget).
const SharedBurst = 0.05

// SharedBudget is the most a region admits of a shared-mode key in one
// window beyond what its peers have seen, for a key of amount per period:
//
//	max(rate × 2 × sync_interval, SharedBurst × amount)  (rate = amount / period)
//
// A count is taken as seen once it was collected a sync interval (the
// longest one-way delay this assumes) before every peer was last heard.
// Traffic at the limit's rate stays within the first term (a hot key is
// collected every tick, and peers are heard every heartbeat, half a sync
// interval); the second lets a region spend a long window unevenly (about
// SharedBurst × amount every 2–2.5 sync intervals). A burst beyond the budget
// waits until its counts are seen. A single request that costs more is
// admitted only when nothing is unseen, so the budget in force is
// max(SharedBudget, its cost). The regional engine enforces it;
// SharedBound states what it implies.
func SharedBudget(amount float64, period, syncInterval time.Duration) float64 {
	if period <= 0 || syncInterval <= 0 {
		return 0
	}
	return max(amount*float64(2*syncInterval)/float64(period), SharedBurst*amount)
}

// SharedBound is the most a shared-mode key of amount per period admits
// above amount, over all regions, in any window aligned on the period:
//
//	(regions − 1) × SharedBudget × max(1, ⌈delay / sync_interval⌉)
//
// where delay is the one-way delay between regions: each region's
// admissions that a peer has not seen are at most its budget, times
// ⌈delay / sync_interval⌉ when the delay exceeds the sync interval. It
// holds for bursts in every region at once as for steady traffic. A
// partition that cuts links both ways may lose the counts in flight when
// it starts, one more budget per region: SharedBound with a delay of two
// sync intervals (the staleness fallback only splits what is left of the
// window). It assumes no clock skew between regions and no lost deltas
// otherwise (a loss counts once the resync it triggers arrives). In a
// region of n instances each instance keeps its own budget: n times the
// bound. With a request costing more than SharedBudget, that cost
// replaces it. The regional engine also counts what each peer admitted
// since its count was last heard, at the peer's pace: that only lowers
// what a region admits, so the bound stands, and in steady state the
// total stays near amount (the lag's admissions are no longer on top).
func SharedBound(amount float64, period, syncInterval, delay time.Duration, regions int) float64 {
	if regions < 2 {
		return 0
	}
	lag := 1.0
	if syncInterval > 0 && delay > syncInterval {
		lag = math.Ceil(float64(delay) / float64(syncInterval))
	}
	return float64(regions-1) * SharedBudget(amount, period, syncInterval) * lag
}
