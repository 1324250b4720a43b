package coordinator

import "math"

// InitialShares returns the shares, in the order of regions, that regions
// use for a limit before any assignment exists: floor_r + (1 − Σ floors)/N,
// the allocation with equal demand. They sum to at most 1. Like every share
// allot assigns, they are rounded down to float32 precision, so that the
// coordinator accounts for exactly what regions apply.
func InitialShares(floors map[string]float64, regions []string) []float64 {
	spare := 1.0
	for _, r := range regions {
		spare -= floors[r]
	}
	spare = max(spare, 0) / float64(len(regions))
	s := make([]float64, len(regions))
	for i, r := range regions {
		s[i] = float64(down32(floors[r] + spare))
	}
	return s
}

// Vector is one share vector (a limit's default or one hot key) as
// Allocate sees it; every slice is indexed by region.
type Vector struct {
	Floors []float64 // minimum shares; they sum to at most 1
	Demand []float64 // recent demand, ≥ 0, in any unit: only ratios matter
	Live   []bool    // heard from recently; the others are frozen
	Shares []float64 // the shares last assigned
	Held   []float64 // the largest share each region may be applying (≥ Shares)
}

// Allocate writes into dst the shares v should move to:
//
//	share_r = floor_r + (A − Σ floors) × demand_r / Σ demand
//
// over live regions, where A = 1 − Σ held by frozen regions: a region not
// heard from keeps its share, and the live ones divide what remains. With
// no demand at all, every region keeps its share. A share moves by at most
// maxStep, and not at all if the move would be smaller than hysteresis.
// The result may sum to more than 1 (floors, frozen regions, hysteresis):
// Allocate only says where to go; the Coordinator decides how far shares
// may actually move without over-allocating.
func Allocate(dst []float64, v Vector, hysteresis, maxStep float64) {
	avail, floors, demand := 1.0, 0.0, 0.0
	for r := range dst {
		if v.Live[r] {
			floors += v.Floors[r]
			demand += v.Demand[r]
		} else {
			avail -= v.Held[r]
		}
	}
	spare := max(avail-floors, 0)
	for r := range dst {
		cur := v.Shares[r]
		dst[r] = cur
		if !v.Live[r] || demand == 0 {
			continue
		}
		t := v.Floors[r] + spare*v.Demand[r]/demand
		t = min(max(t, cur-maxStep), cur+maxStep)
		if math.Abs(t-cur) >= hysteresis {
			dst[r] = t
		}
	}
}

// down32 rounds x in [0, 1] down to a float32: shares are float32, and
// rounding up could make shares sum above 1.
func down32(x float64) float32 {
	f := float32(x)
	if float64(f) > x {
		f = math.Nextafter32(f, 0)
	}
	return f
}
