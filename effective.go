package allot

import (
	"math"
	"strings"
	"time"
)

// Effective returns l's limit for the key that desc selects at now: l's
// rate and burst, multiplied by the plan of the most specific plan
// assignment that matches desc, then changed by the most specific override
// in force at now that matches desc and applies to l (to every limit, or to
// l by name). Ties in specificity go to the later one in the file. An
// absolute override rate replaces the rate and scales the burst by the
// ratio of the amounts; a multiplier multiplies both. Amounts are clamped
// to [1, MaxAmount], and the rate's to MaxRate (see MaxAmountIn).
//
// Effective does not allocate and is safe for concurrent use. It panics if
// d was neither loaded nor validated (see Domain.Validate).
func (d *Domain) Effective(l *Limit, desc Descriptor, now time.Time) Effective {
	x := d.idx
	if x == nil {
		panic("allot: Domain.Effective on a domain that was not validated")
	}
	e := Effective{Rate: l.Rate, Burst: l.Burst}
	if len(d.Assignments) == 0 && len(d.Overrides) == 0 {
		return e
	}
	if i := x.assign.best(desc, nil); i >= 0 {
		m := x.multiplier[i]
		e.Rate.Amount, e.Burst = scaleRate(e.Rate, m), scale(e.Burst, m)
	}
	i := x.overrides.best(desc, func(i int) bool {
		o := &d.Overrides[i]
		return (o.Limit == "" || o.Limit == l.Name) && o.Active(now)
	})
	if i < 0 {
		return e
	}
	if o := &d.Overrides[i]; o.Rate.Amount > 0 {
		e.Burst = scale(e.Burst, float64(o.Rate.Amount)/float64(e.Rate.Amount))
		e.Rate = o.Rate
	} else {
		e.Rate.Amount, e.Burst = scaleRate(e.Rate, o.Multiplier), scale(e.Burst, o.Multiplier)
	}
	return e
}

// scale returns round(v × f) clamped to [1, MaxAmount].
func scale(v int64, f float64) int64 { return scaleTo(v, f, MaxAmount) }

// scaleRate returns r's amount multiplied by f as scale does, clamped to
// [1, MaxAmountIn(r.Period)] so that the result is at most MaxRate.
func scaleRate(r Rate, f float64) int64 { return scaleTo(r.Amount, f, max(MaxAmountIn(r.Period), 1)) }

// scaleTo returns round(v × f) clamped to [1, most].
func scaleTo(v int64, f float64, most int64) int64 {
	x := math.Round(float64(v) * f)
	switch {
	case !(x >= 1): // NaN too
		return 1
	case x > float64(most):
		return most
	}
	return int64(x)
}

// index lets Effective find the plan assignments and overrides that match
// a descriptor without scanning them all.
type index struct {
	assign     matchIndex
	multiplier []float64 // of each assignment's plan
	overrides  matchIndex
}

func (d *Domain) index() {
	x := &index{multiplier: make([]float64, len(d.Assignments))}
	am := make([]Match, len(d.Assignments))
	for i, a := range d.Assignments {
		am[i], x.multiplier[i] = a.Match, d.Plans[a.Plan].Multiplier
	}
	om := make([]Match, len(d.Overrides))
	for i, o := range d.Overrides {
		om[i] = o.Match
	}
	x.assign, x.overrides = newMatchIndex(am), newMatchIndex(om)
	d.idx = x
}

// matchIndex finds the most specific of a list of matches that accepts a
// descriptor. A match with exact-valued entries is filed under the one that
// the fewest matches have: every descriptor it accepts holds that entry.
// The others (wildcards and prefixes only, or empty) are always tried.
type matchIndex struct {
	match   []Match
	spec    []int // Specificity of each match
	byEntry map[Entry][]int
	wild    []int
}

func newMatchIndex(ms []Match) matchIndex {
	x := matchIndex{match: ms, spec: make([]int, len(ms)), byEntry: map[Entry][]int{}}
	count := map[Entry]int{}
	for _, m := range ms {
		for _, e := range m {
			if !strings.HasSuffix(e.Value, "*") {
				count[e]++
			}
		}
	}
	for i, m := range ms {
		x.spec[i] = m.Specificity()
		rarest := -1
		for j, e := range m {
			if !strings.HasSuffix(e.Value, "*") && (rarest < 0 || count[e] < count[m[rarest]]) {
				rarest = j
			}
		}
		if rarest >= 0 {
			x.byEntry[m[rarest]] = append(x.byEntry[m[rarest]], i)
		} else {
			x.wild = append(x.wild, i)
		}
	}
	return x
}

// best returns the index of the most specific match that accepts d and
// that accept (if not nil) accepts, the last one on ties, or -1.
func (x *matchIndex) best(d Descriptor, accept func(int) bool) int {
	best := -1
	if len(x.byEntry) > 0 {
		for _, e := range d {
			for _, i := range x.byEntry[e] {
				best = x.better(best, i, d, accept)
			}
		}
	}
	for _, i := range x.wild {
		best = x.better(best, i, d, accept)
	}
	return best
}

func (x *matchIndex) better(best, i int, d Descriptor, accept func(int) bool) int {
	if best >= 0 && (x.spec[i] < x.spec[best] || x.spec[i] == x.spec[best] && i < best) {
		return best
	}
	if !x.match[i].Matches(d) || accept != nil && !accept(i) {
		return best
	}
	return i
}
