package allot

import (
	"math"
	"time"
)

// SharedBudget is the most a region admits of a shared-mode key in one
// window beyond what its peers have seen, for a key of amount per period
// shared by regions regions:
//
//	max(rate × 2 × sync_interval, amount / regions)
//
// The first term is what traffic at the limit's rate needs (a count is
// sent within a sync interval and arrives within as long again); the
// second lets every region take its equal part of a window at once. A
// count collected one sync interval before every peer was last heard is
// taken as seen. A single request that costs more is admitted only when
// nothing is unseen, so the budget in force is max(SharedBudget, its
// cost). The regional engine enforces it; SharedBound states what it
// implies.
func SharedBudget(amount float64, period, syncInterval time.Duration, regions int) float64 {
	if period <= 0 || syncInterval <= 0 || regions < 1 {
		return 0
	}
	return max(amount*float64(2*syncInterval)/float64(period), amount/float64(regions))
}

// SharedBound is the most a shared-mode key of amount per period admits
// above amount, over all regions, in any window aligned on the period:
//
//	(regions − 1) × SharedBudget × max(1, ⌈delay / sync_interval⌉)
//
// where delay is the one-way delay between regions. It holds for bursts
// (every region starting at once) as for steady traffic, and through a
// partition that cuts links both ways: each region's admissions that a
// peer has not seen are at most its budget (× ⌈delay / sync_interval⌉
// when the delay exceeds the sync interval), and the staleness fallback
// only splits what is left of the window. In a region of n instances
// each instance keeps its own budget: the bound is n times as large.
// With a request costing more than SharedBudget, that cost replaces it.
func SharedBound(amount float64, period, syncInterval, delay time.Duration, regions int) float64 {
	if regions < 2 {
		return 0
	}
	lag := 1.0
	if syncInterval > 0 && delay > syncInterval {
		lag = math.Ceil(float64(delay) / float64(syncInterval))
	}
	return float64(regions-1) * SharedBudget(amount, period, syncInterval, regions) * lag
}
