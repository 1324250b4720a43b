package sim

import (
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot"
)

// metrics collects one system's figures as the run goes.
type metrics struct {
	sc      *Scenario
	regions []string
	l       float64       // the limit's amount per window, per key
	period  time.Duration // of a window
	hot     string        // the watched key's name, for the window table

	byRegion   map[string]*Counts    // after the warm-up
	perKey     map[keyWindow]float64 // global admitted
	hotWindows map[int64][]float64   // the watched key's admitted, by region
	times      []time.Duration       // of share samples
	shares     [][]float64           // by sample, by region
	messages   int                   // sent, lost or not
	refused    int                   // by the coordinator or an Applier
	loanAsks   int
	loaned     float64 // cost granted by lenders
	shareSum   float64 // largest Σ over regions of a key's shares in force
}

type keyWindow struct {
	key string
	w   int64
}

// Counts are requests of one region (or all) after the warm-up, in cost.
type Counts struct {
	Requests float64 `json:"requests"`
	Admitted float64 `json:"admitted"`
	Rejected float64 `json:"rejected"`
	// FalseRejects is max(0, Ideal − Admitted): rejected requests that
	// one global limiter would have admitted, net.
	FalseRejects float64 `json:"false_rejects"`
	// Ideal is what one global limiter seeing every request admitted.
	Ideal float64 `json:"ideal_admitted"`
}

func newMetrics(sc *Scenario, l *allot.Limit, d *allot.Domain, hot string) *metrics {
	m := &metrics{sc: sc, regions: d.Regions, l: float64(l.Rate.Amount), period: l.Rate.Period, hot: hot,
		byRegion: map[string]*Counts{}, perKey: map[keyWindow]float64{}, hotWindows: map[int64][]float64{}}
	for _, r := range d.Regions {
		m.byRegion[r] = &Counts{}
	}
	return m
}

func (m *metrics) request(now time.Time, region, key string, cost float64, allowed, ideal bool) {
	w := now.Sub(T0).Nanoseconds() / m.period.Nanoseconds()
	if allowed {
		m.perKey[keyWindow{key, w}] += cost
		if key == m.hot {
			hw := m.hotWindows[w]
			if hw == nil {
				hw = make([]float64, len(m.regions))
				m.hotWindows[w] = hw
			}
			hw[slices.Index(m.regions, region)] += cost
		}
	}
	if now.Sub(T0) < m.sc.Warmup {
		return
	}
	c := m.byRegion[region]
	c.Requests += cost
	if allowed {
		c.Admitted += cost
	} else {
		c.Rejected += cost
	}
	if ideal {
		c.Ideal += cost
	}
}

func (m *metrics) sample(now time.Time, shares []float64) {
	m.times = append(m.times, now.Sub(T0))
	m.shares = append(m.shares, shares)
}

// Figures are one system's results of a scenario.
type Figures struct {
	System string `json:"system"`
	Counts
	ByRegion map[string]Counts `json:"by_region"`
	// FalseRejectPct: requests rejected that one global limiter would
	// have admitted, net, in % of requests: Σ over regions of
	// max(0, ideal admitted − admitted).
	FalseRejectPct float64 `json:"false_reject_pct"`
	// UtilizationPct: admitted, in % of what one global limiter admitted.
	UtilizationPct float64 `json:"utilization_pct"`
	// OvershootWindows counts (key, window) pairs whose global admitted
	// exceeds L; OvershootMaxPct is the worst excess, in % of L.
	OvershootWindows int     `json:"overshoot_windows"`
	OvershootMaxPct  float64 `json:"overshoot_max_pct"`
	// MaxShareSum is the largest sum over regions of the shares in force
	// for one key, checked at every share change (0 without a coordinator).
	MaxShareSum float64 `json:"max_share_sum"`
	// WorstKey and WorstWindowS name the first (key, window) of the
	// largest overshoot.
	WorstKey     string  `json:"worst_key,omitempty"`
	WorstWindowS float64 `json:"worst_window_s,omitempty"`
	worst        keyWindow
	// Convergence after each demand shift: seconds until every region's
	// share of the watched key is within 0.05 of ideal and stays so
	// (-1: never). Empty for the naive system, whose shares never move.
	Shifts       []Shift `json:"shifts,omitempty"`
	MessagesPerS float64 `json:"messages_per_s"`
	LoanAsks     int     `json:"loan_asks"`
	Loaned       float64 `json:"loaned"` // cost granted by lenders
	RefusedMsgs  int     `json:"refused_messages"`
	// For plots: the watched key's admitted by window and region, and
	// every region's share of it at each sample instant.
	HotWindows [][]float64     `json:"-"`
	ShareTimes []time.Duration `json:"-"`
	Shares     [][]float64     `json:"-"`
}

// Shift is a change of offered demand and how shares followed it.
type Shift struct {
	At           float64   `json:"at_s"`
	Ideal        []float64 `json:"ideal"`
	ConvergenceS float64   `json:"convergence_s"`
	Periods      float64   `json:"convergence_periods"`
}

func (m *metrics) figures(sys string, d *allot.Domain, l *allot.Limit, period time.Duration) Figures {
	f := Figures{System: sys, ByRegion: map[string]Counts{}, RefusedMsgs: m.refused, LoanAsks: m.loanAsks, Loaned: m.loaned, MaxShareSum: m.shareSum,
		MessagesPerS: float64(m.messages) / m.sc.Duration.Seconds(), ShareTimes: m.times, Shares: m.shares}
	for _, r := range m.regions {
		c := *m.byRegion[r]
		c.FalseRejects = max(0, c.Ideal-c.Admitted)
		f.ByRegion[r] = c
		f.Requests += c.Requests
		f.Admitted += c.Admitted
		f.Rejected += c.Rejected
		f.FalseRejects += c.FalseRejects
		f.Ideal += c.Ideal
	}
	f.FalseRejectPct = pct(f.FalseRejects, f.Requests)
	f.UtilizationPct = pct(f.Admitted, f.Ideal)
	for kw, n := range m.perKey {
		if n <= m.l {
			continue
		}
		f.OvershootWindows++
		p := pct(n-m.l, m.l)
		if p > f.OvershootMaxPct || p == f.OvershootMaxPct && (kw.w < f.worst.w || kw.w == f.worst.w && kw.key < f.worst.key) {
			f.OvershootMaxPct, f.worst = p, kw // the first worst, so that any map order gives one answer
		}
	}
	if f.OvershootWindows > 0 {
		f.WorstKey, f.WorstWindowS = f.worst.key, (time.Duration(f.worst.w) * m.period).Seconds()
	}
	windows := int(m.sc.Duration / m.period)
	for w := range int64(windows) {
		hw := m.hotWindows[w]
		if hw == nil {
			hw = make([]float64, len(m.regions))
		}
		f.HotWindows = append(f.HotWindows, hw)
	}
	if sys == Allot {
		f.Shifts = m.shifts(d, l, period)
	}
	return f
}

// shifts finds the instants offered demand changes and how long shares
// took to settle within 0.05 of the ideal split of the new demand.
func (m *metrics) shifts(d *allot.Domain, l *allot.Limit, period time.Duration) []Shift {
	var at []time.Duration
	for _, t := range m.sc.Traffic {
		at = append(at, t.From, t.Until)
	}
	slices.Sort(at)
	at = slices.Compact(at)
	at = slices.DeleteFunc(at, func(t time.Duration) bool { return t <= 0 || t >= m.sc.Duration })
	var out []Shift
	for i, t := range at {
		next := m.sc.Duration
		if i+1 < len(at) {
			next = at[i+1]
		}
		s := Shift{At: t.Seconds(), Ideal: m.idealAt(t, d, l), ConvergenceS: -1, Periods: -1}
		settled := time.Duration(-1)
		for j, st := range m.times {
			if st < t || st >= next {
				continue
			}
			ok := true
			for r, v := range m.shares[j] {
				ok = ok && math.Abs(v-s.Ideal[r]) <= 0.05
			}
			switch {
			case !ok:
				settled = -1
			case settled < 0:
				settled = st
			}
		}
		if settled >= 0 {
			s.ConvergenceS = (settled - t).Seconds()
			s.Periods = s.ConvergenceS / period.Seconds()
		}
		out = append(out, s)
	}
	return out
}

// idealAt is floor_r + (1 − Σ floors) × rate_r / Σ rate for the traffic
// offered just after t (floors alone if there is none).
func (m *metrics) idealAt(t time.Duration, d *allot.Domain, l *allot.Limit) []float64 {
	rates := make([]float64, len(d.Regions))
	sum, floors := 0.0, 0.0
	for _, tr := range m.sc.Traffic {
		if tr.From <= t && t < tr.Until {
			rates[slices.Index(d.Regions, tr.Region)] += tr.Rate * float64(tr.Cost)
			sum += tr.Rate * float64(tr.Cost)
		}
	}
	for _, f := range l.Floors {
		floors += f
	}
	out := make([]float64, len(d.Regions))
	for i, r := range d.Regions {
		out[i] = l.Floors[r]
		if sum > 0 {
			out[i] += (1 - floors) * rates[i] / sum
		}
	}
	return out
}

func pct(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * a / b
}
