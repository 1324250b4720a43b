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
	// Demand is each region's recent demand (admitted + rejected cost per
	// second), ≥ 0. With Scale 0 only ratios matter.
	Demand []float64
	// Claim is each region's claim on share it does not use now: a decayed
	// peak of its demand, in Demand's unit (nil: Demand). It only shares
	// out what no region uses (see Allocate).
	Claim []float64
	// Known says the region's demand for the vector has been measured
	// (nil: every region's). A live region whose demand is not known keeps
	// its share, as a frozen one keeps what it holds, or Keep, if set and
	// less (what its demand for the whole limit could use).
	Known  []bool
	Keep   []float64
	Live   []bool    // heard from recently; the others are frozen
	Shares []float64 // the shares last assigned
	Held   []float64 // the largest share each region may be applying (≥ Shares)
	// Scale is the limit's rate in Demand's unit per second (the cost a
	// share of 1 admits per second); 0 when not known: shares are then
	// divided by demand alone.
	Scale float64
}

// MinShare is the least share Allocate gives a live region, where floors
// leave room for it: a region whose demand is 0 now still admits its
// first requests before a report and a rebalance give it more, and no
// region alone holds the whole limit, whose windows its clock cuts a few
// milliseconds off the coordinator's (a sliding window saturated at
// exactly L admits up to about rate × that offset more than L in a window
// of the coordinator's clock).
const MinShare = 0.005

// Headroom is the part of its use that Allocate adds to a region's share
// for its demand to grow (and for its arrivals to vary) before the
// coordinator hears of it, where the limit has room for it.
const Headroom = 0.1

// Allocate writes into dst the shares v should move to. Over the live
// regions whose demand is known, with A = 1 − what frozen regions hold −
// what live regions of unknown demand keep (their shares), and use_r =
// demand_r ÷ Scale:
//
//  1. Floors first: every region gets at least floor_r.
//  2. Overload, Σ max(floor_r, use_r) ≥ A: the limit cannot serve every
//     region's use. It is divided as a single global limiter would divide
//     it, by demand: share_r = floor_r + (A − Σ floors) × demand_r /
//     Σ demand.
//  3. Otherwise every region gets what it uses plus Headroom of it,
//     need_r = max(floor_r, use_r × (1 + Headroom)), with the headroom cut
//     in proportion where the need does not fit in A; then the share no
//     region needs goes to the regions' claims, max-min fair (water-
//     filling): share_r = clamp(λ, need_r, claim_r) with Σ share_r = A,
//     where claim_r is the largest of need_r and the region's claim (a
//     decayed peak of its demand, in use units). A region that bursts now
//     and then keeps share for its next burst, and regions whose demand
//     flips between them keep a split that does not chase each flip, out
//     of share that no region needs now; once every claim is met, what is
//     left goes by demand.
//
// So no region is pinned below its use (and headroom) while another holds
// share it does not use and has no claim to, and with no claims above use
// the rule is the proportional split, floor_r + (A − Σ floors) ×
// demand_r / Σ demand, whether the limit is overloaded or not. With Scale 0 (the limit's rate is not
// known) it is that split. With no demand at all every region keeps its
// share.
//
// Hysteresis applies to the vector as a whole: if some share would move
// by hysteresis or more, every share moves to its target (capped to
// maxStep); otherwise none does (the Coordinator lets a small error that
// persists through it, see Coordinator.retarget). The result may sum to
// more than 1 (floors, frozen regions): Allocate only says where to go;
// the Coordinator decides how far shares may actually move without
// over-allocating.
func Allocate(dst []float64, v Vector, hysteresis, maxStep float64) {
	target(dst, v)
	moved := false
	for r := range dst {
		cur := v.Shares[r]
		dst[r] = min(max(dst[r], cur-maxStep), cur+maxStep)
		moved = moved || math.Abs(dst[r]-cur) >= hysteresis
	}
	if !moved {
		copy(dst, v.Shares)
	}
}

// allocScratch bounds the regions target handles without allocating.
const allocScratch = 16

// target writes into dst where v's shares should go, before hysteresis
// and the cap on a step (see Allocate).
func target(dst []float64, v Vector) {
	if avail, ok := split(dst, v); ok {
		lift(dst, v, avail)
	}
}

// in reports whether region r takes part in dividing v: live, and its
// demand known.
func (v *Vector) in(r int) bool { return v.Live[r] && (v.Known == nil || v.Known[r]) }

// split writes the rule's shares into dst (see Allocate), MinShare apart,
// and returns what the regions that take part divide; ok is false when
// they have no demand at all (every region keeps its share).
func split(dst []float64, v Vector) (avail float64, ok bool) {
	in := v.in
	avail, floors, demand := 1.0, 0.0, 0.0
	for r := range dst {
		dst[r] = v.Shares[r]
		switch {
		case !v.Live[r]:
			avail -= v.Held[r]
		case !in(r):
			if v.Keep != nil {
				dst[r] = min(dst[r], v.Keep[r])
			}
			avail -= dst[r]
		default:
			floors += v.Floors[r]
			demand += v.Demand[r]
		}
	}
	if demand == 0 {
		return avail, false
	}
	proportional := func() {
		spare := max(avail-floors, 0)
		for r := range dst {
			if in(r) {
				dst[r] = v.Floors[r] + spare*v.Demand[r]/demand
			}
		}
	}
	if v.Scale <= 0 {
		proportional()
		return avail, true
	}
	var buf [2 * allocScratch]float64
	var need, claim []float64 // by region: need_r; claim_r, at least need_r
	if len(dst) <= allocScratch {
		need, claim = buf[:len(dst)], buf[allocScratch:allocScratch+len(dst)]
	} else {
		need, claim = make([]float64, len(dst)), make([]float64, len(dst))
	}
	base, sumNeed := 0.0, 0.0
	for r := range dst {
		if !in(r) {
			continue
		}
		use := v.Demand[r] / v.Scale
		base += max(v.Floors[r], use)
		need[r] = max(v.Floors[r], use*(1+Headroom))
		sumNeed += need[r]
	}
	if base >= avail { // overloaded: as one global limiter would
		proportional()
		return avail, true
	}
	if sumNeed >= avail { // the headroom does not fit: cut in proportion
		k := (avail - base) / (sumNeed - base)
		for r := range dst {
			if in(r) {
				b := max(v.Floors[r], v.Demand[r]/v.Scale)
				dst[r] = b + (need[r]-b)*k
			}
		}
		return avail, true
	}
	// Up to the claims, max-min fair: x_r = clamp(λ, need_r, claim_r)
	// with Σ x_r = A; past every claim, by demand.
	sumClaim := 0.0
	for r := range dst {
		if !in(r) {
			continue
		}
		c := v.Demand[r]
		if v.Claim != nil {
			c = max(c, v.Claim[r])
		}
		claim[r] = max(c/v.Scale, need[r])
		sumClaim += claim[r]
	}
	if sumClaim > avail {
		level := waterLevel(need, claim, in, avail)
		for r := range dst {
			if in(r) {
				dst[r] = min(max(level, need[r]), claim[r])
			}
		}
		return avail, true
	}
	for r := range dst {
		if in(r) {
			dst[r] = claim[r] + (avail-sumClaim)*v.Demand[r]/demand
		}
	}
	return avail, true
}

// lift raises every region that takes part to MinShare at least, where
// their floors and MinShare fit in avail, out of what the others have
// above theirs, in proportion.
func lift(dst []float64, v Vector, avail float64) {
	least, short, spare := 0.0, 0.0, 0.0
	for r := range dst {
		if v.in(r) {
			least += max(v.Floors[r], MinShare)
			short += max(MinShare-dst[r], 0)
			spare += max(dst[r]-max(v.Floors[r], MinShare), 0)
		}
	}
	if least > avail || short == 0 || spare <= 0 {
		return
	}
	k := min(short/spare, 1)
	for r := range dst {
		if v.in(r) {
			if dst[r] < MinShare {
				dst[r] = MinShare
			} else if m := max(v.Floors[r], MinShare); dst[r] > m {
				dst[r] -= (dst[r] - m) * k
			}
		}
	}
}

// waterLevel returns the level λ at which Σ clamp(λ, lo_r, hi_r) over the
// regions in = total, for Σ lo ≤ total < Σ hi (lo_r ≤ hi_r).
func waterLevel(lo, hi []float64, in func(int) bool, total float64) float64 {
	a, b := 0.0, 0.0
	for r := range hi {
		if in(r) {
			b = max(b, hi[r])
		}
	}
	for range 60 { // bisection: exact enough for float32 shares
		mid := (a + b) / 2
		s := 0.0
		for r := range hi {
			if in(r) {
				s += min(max(mid, lo[r]), hi[r])
			}
		}
		if s > total {
			b = mid
		} else {
			a = mid
		}
	}
	return a
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
