package sim

import (
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot"
)

// metrics collects one system's figures as the run goes.
type metrics struct {
	sc     *Scenario
	keys   *keySpace
	nr     int           // regions
	l      float64       // the limit's amount per window, per key
	period time.Duration // of a window
	ideal  bool          // the ideal pass: counts only

	byRegion []Counts // after the warm-up
	arrivals []int64  // by region, the whole run: requests, not cost
	// Admitted per key and window, kept for the current window of each
	// key: cnt[id×(nr+1)] is the window that cnt[id×(nr+1)+1 …] counts,
	// by region (−1: none), in one cache line for up to 7 regions; a
	// key's window is checked against L when the key's next admission is
	// in a later window, and at the end.
	cnt            []float64
	overWindows    int
	overMax        float64
	worst          keyWindow
	regOverWindows []int
	regOverMax     []float64
	// L per window, where a config event changed it: a window's L is
	// the least in force at any instant of it (lims, in order), but at
	// least what the key had admitted in it when L was lowered (floor).
	lims  []limChange
	floor map[keyWindow]float64

	// A token bucket or GCRA limit is also bounded by B + r·T over every
	// interval T of true time, per key (bound.go).
	bound *boundCheck

	hotWindows  map[int64][]float64 // the watched key's admitted, by region
	times       []time.Duration     // of share samples
	shares      [][]float64         // by sample, by region
	messages    []int               // by region, sent, lost or not
	storeCalls  []int64             // by region: Take, Lease, Charge, Acquire, Free
	heartbeats  []int64             // by region
	refused     int                 // by the coordinator or an Applier
	loanAsks    int
	loaned      float64 // cost granted by lenders
	shareSum    float64 // largest Σ over regions of a key's shares in force
	inFlight    int     // LLM calls streaming
	maxInFlight int
}

type keyWindow struct {
	id int
	w  int64
}

// limChange is L from window w's instant at on.
type limChange struct {
	at time.Duration
	l  float64
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

func newMetrics(sc *Scenario, l *allot.Limit, d *allot.Domain, keys *keySpace, ideal bool) *metrics {
	nr := len(d.Regions)
	m := &metrics{sc: sc, keys: keys, nr: nr, l: float64(l.Rate.Amount), period: l.Rate.Period, ideal: ideal,
		byRegion: make([]Counts, nr), arrivals: make([]int64, nr), regOverWindows: make([]int, nr),
		regOverMax: make([]float64, nr), hotWindows: map[int64][]float64{}, messages: make([]int, nr),
		storeCalls: make([]int64, nr), heartbeats: make([]int64, nr), worst: keyWindow{id: -1}}
	if !ideal {
		m.cnt = make([]float64, len(keys.values)*(nr+1))
		for i := 0; i < len(m.cnt); i += nr + 1 {
			m.cnt[i] = -1
		}
		if l.Algorithm != allot.SlidingWindow {
			m.bound = newBoundCheck(l, len(keys.values))
		}
	}
	return m
}

// add counts n requests of key id in region r decided now: admitted and
// rejected are their cost.
func (m *metrics) add(now time.Time, r, id, n int, admitted, rejected float64) {
	m.arrivals[r] += int64(n)
	if admitted > 0 && !m.ideal {
		w := int64(now.Sub(T0) / m.period)
		row := m.cnt[id*(m.nr+1):]
		if int64(row[0]) != w {
			m.flush(id)
			row[0] = float64(w)
		}
		row[1+r] += admitted
		if m.bound != nil {
			m.bound.add(now, id, admitted)
		}
		if id == m.keys.hot {
			hw := m.hotWindows[w]
			if hw == nil {
				hw = make([]float64, m.nr)
				m.hotWindows[w] = hw
			}
			hw[r] += admitted
		}
	}
	if now.Sub(T0) < m.sc.Warmup {
		return
	}
	c := &m.byRegion[r]
	c.Requests += admitted + rejected
	c.Admitted += admitted
	c.Rejected += rejected
}

// flush checks key id's window against L and clears it. The excess of a
// window above L is shared among regions in proportion to what each
// admitted in it.
func (m *metrics) flush(id int) {
	w := m.cnt[id*(m.nr+1)]
	if w < 0 {
		return
	}
	row := m.cnt[id*(m.nr+1)+1 : (id+1)*(m.nr+1)]
	total := 0.0
	for _, n := range row {
		total += n
	}
	kw := keyWindow{id, int64(w)}
	l := m.limit(kw)
	if total > l {
		excess := total - l
		m.overWindows++
		p := pct(excess, l)
		if p > m.overMax || p == m.overMax && (kw.w < m.worst.w || kw.w == m.worst.w && kw.id < m.worst.id) {
			m.overMax, m.worst = p, kw // the first worst, so that the order of flushes does not matter
		}
		for r, n := range row {
			if n > 0 {
				m.regOverWindows[r]++
				m.regOverMax[r] = max(m.regOverMax[r], pct(excess*n/total, l))
			}
		}
	}
	clear(row)
	m.cnt[id*(m.nr+1)] = -1
}

// limit is the most key kw.id may admit in window kw.w: the least L in
// force at any instant of the window, or what it had admitted there when
// L was lowered to below that, if more.
func (m *metrics) limit(kw keyWindow) float64 {
	if len(m.lims) == 0 {
		return m.l
	}
	start, end := time.Duration(kw.w)*m.period, time.Duration(kw.w+1)*m.period
	l := m.l
	for _, c := range m.lims {
		switch {
		case c.at <= start:
			l = c.l // in force when the window began
		case c.at < end:
			l = min(l, c.l)
		}
	}
	return max(l, m.floor[kw])
}

// relimit records that L is l from now on (a config event): what each
// key admitted in the current window so far becomes its floor there when
// l is below it.
func (m *metrics) relimit(now time.Time, l float64) {
	if m.ideal {
		return
	}
	at := now.Sub(T0)
	w := int64(at / m.period)
	if m.floor == nil {
		m.floor = map[keyWindow]float64{}
	}
	for id := range len(m.cnt) / (m.nr + 1) {
		row := m.cnt[id*(m.nr+1):]
		if int64(row[0]) != w {
			continue
		}
		total := 0.0
		for _, n := range row[1 : m.nr+1] {
			total += n
		}
		if kw := (keyWindow{id, w}); total > l {
			m.floor[kw] = max(m.floor[kw], total)
		}
	}
	m.lims = append(m.lims, limChange{at: at, l: l})
}

// finish checks the windows still open.
func (m *metrics) finish() {
	for id := range len(m.cnt) / (m.nr + 1) {
		m.flush(id)
	}
}

func (m *metrics) sample(now time.Time, shares []float64) {
	m.times = append(m.times, now.Sub(T0))
	m.shares = append(m.shares, shares)
}

// Summary is the figures of one region, or of all of them.
type Summary struct {
	Counts
	// FalseRejectPct: requests rejected that one global limiter would
	// have admitted, net, in % of requests: Σ over regions of
	// max(0, ideal admitted − admitted).
	FalseRejectPct float64 `json:"false_reject_pct"`
	// UtilizationPct: admitted, in % of what one global limiter admitted.
	UtilizationPct float64 `json:"utilization_pct"`
	// OvershootWindows counts (key, window) pairs whose global admitted
	// exceeds L; OvershootMaxPct is the worst excess, in % of L. For a
	// region: the windows above L in which it admitted, and its part of
	// the worst excess (shared in proportion to what each region admitted).
	OvershootWindows int     `json:"overshoot_windows"`
	OvershootMaxPct  float64 `json:"overshoot_max_pct"`
	// ConvergenceS is the longest time, over the start and every change
	// of offered traffic, until the shares of the watched key are within
	// 0.05 of ideal and stay so (every region's, or the region's); -1:
	// never; null for a system whose shares do not move (naive) or traffic
	// whose rate varies continuously (a shape).
	ConvergenceS *float64 `json:"convergence_s"`
	// MessagesPerS counts coordinator messages both ways on a region's
	// link, and the peer messages it sends.
	MessagesPerS float64 `json:"messages_per_s"`
	// StoreCalls are calls to the regional store (Take, Lease and the
	// reservation calls; heartbeats apart), over the whole run;
	// StoreCallsPerRequest divides them by the requests (not cost).
	StoreCalls           int64   `json:"store_calls"`
	StoreHeartbeats      int64   `json:"store_heartbeats"`
	Arrivals             int64   `json:"arrivals"`
	StoreCallsPerRequest float64 `json:"store_calls_per_request"`
}

// Figures are one system's results of a scenario.
type Figures struct {
	System string `json:"system"`
	Summary
	ByRegion map[string]Summary `json:"by_region"`
	// MaxShareSum is the largest sum over regions of the shares in force
	// for one key, checked at every share change (0 without a coordinator).
	MaxShareSum float64 `json:"max_share_sum"`
	// Bound is, for a token bucket or GCRA limit, how what was admitted
	// compares with B + r·T over every interval T (nil for a sliding
	// window).
	Bound *Bound `json:"bucket_bound,omitempty"`
	// WorstKey and WorstWindowS name the first (key, window) of the
	// largest overshoot.
	WorstKey     string  `json:"worst_key,omitempty"`
	WorstWindowS float64 `json:"worst_window_s,omitempty"`
	// Convergence after the start and each demand shift (see
	// Summary.ConvergenceS).
	Shifts      []Shift `json:"shifts,omitempty"`
	LoanAsks    int     `json:"loan_asks"`
	Loaned      float64 `json:"loaned"` // cost granted by lenders
	RefusedMsgs int     `json:"refused_messages"`
	// MaxInFlight is the most LLM calls streaming at once.
	MaxInFlight int `json:"max_in_flight,omitempty"`
	// For plots: the watched key's admitted by window and region, and
	// every region's share of it at each sample instant.
	HotWindows [][]float64     `json:"-"`
	ShareTimes []time.Duration `json:"-"`
	Shares     [][]float64     `json:"-"`
}

// Bound is a bucket limit's B + r·T check, global: per key, over every
// interval [a, b] of true time, what every instance of every region
// admitted, against B + r·(b − a).
type Bound struct {
	Burst    float64 `json:"burst"`
	RatePerS float64 `json:"rate_per_s"`
	// Above counts the admissions that end an interval above the bound.
	Above int `json:"above"`
	// ExcessMax is the largest excess over B + r·T, in cost, and in % of
	// B; Key, FromS and ToS name its first key and interval.
	ExcessMax    float64 `json:"excess_max"`
	ExcessMaxPct float64 `json:"excess_max_pct_of_burst"`
	Key          string  `json:"key,omitempty"`
	FromS        float64 `json:"from_s,omitempty"`
	ToS          float64 `json:"to_s,omitempty"`
}

// Shift is a change of offered demand (or the start) and how shares
// followed it.
type Shift struct {
	At           float64   `json:"at_s"`
	Ideal        []float64 `json:"ideal"`
	ConvergenceS float64   `json:"convergence_s"`
	Periods      float64   `json:"convergence_periods"`
	// ByRegion is each region's convergence (s), in the domain's order.
	ByRegion []float64 `json:"by_region_s"`
}

func (m *metrics) figures(sys string, d *allot.Domain, l *allot.Limit, period time.Duration, ideal []Counts) Figures {
	secs := m.sc.Duration.Seconds()
	f := Figures{System: sys, ByRegion: map[string]Summary{}, RefusedMsgs: m.refused, LoanAsks: m.loanAsks,
		Loaned: m.loaned, MaxShareSum: m.shareSum, MaxInFlight: m.maxInFlight, ShareTimes: m.times, Shares: m.shares}
	if sys != Naive {
		f.Shifts = m.shifts(d, l, period)
	}
	g := &f.Summary
	for i, name := range d.Regions {
		c := m.byRegion[i]
		c.Ideal = ideal[i].Admitted
		c.FalseRejects = max(0, c.Ideal-c.Admitted)
		s := Summary{Counts: c, FalseRejectPct: pct(c.FalseRejects, c.Requests), UtilizationPct: pct(c.Admitted, c.Ideal),
			OvershootWindows: m.regOverWindows[i], OvershootMaxPct: m.regOverMax[i],
			MessagesPerS: float64(m.messages[i]) / secs, StoreCalls: m.storeCalls[i], StoreHeartbeats: m.heartbeats[i],
			Arrivals: m.arrivals[i], StoreCallsPerRequest: ratio(m.storeCalls[i], m.arrivals[i])}
		if f.Shifts != nil {
			s.ConvergenceS = convergence(f.Shifts, func(sh Shift) float64 { return sh.ByRegion[i] })
		}
		f.ByRegion[name] = s
		g.Requests += c.Requests
		g.Admitted += c.Admitted
		g.Rejected += c.Rejected
		g.FalseRejects += c.FalseRejects
		g.Ideal += c.Ideal
		g.MessagesPerS += s.MessagesPerS
		g.StoreCalls += s.StoreCalls
		g.StoreHeartbeats += s.StoreHeartbeats
		g.Arrivals += s.Arrivals
	}
	g.FalseRejectPct = pct(g.FalseRejects, g.Requests)
	g.UtilizationPct = pct(g.Admitted, g.Ideal)
	g.StoreCallsPerRequest = ratio(g.StoreCalls, g.Arrivals)
	g.OvershootWindows, g.OvershootMaxPct = m.overWindows, m.overMax
	if f.Shifts != nil {
		g.ConvergenceS = convergence(f.Shifts, func(sh Shift) float64 { return sh.ConvergenceS })
	}
	if b := m.bound; b != nil {
		f.Bound = &Bound{Burst: b.burst, RatePerS: b.rate, Above: b.above, ExcessMax: b.worst, ExcessMaxPct: pct(b.worst, b.burst)}
		if b.key >= 0 {
			f.Bound.Key, f.Bound.FromS, f.Bound.ToS = m.keys.name(b.key), b.from.Seconds(), b.to.Seconds()
		}
	}
	if m.overWindows > 0 {
		f.WorstKey, f.WorstWindowS = m.keys.name(m.worst.id), (time.Duration(m.worst.w) * m.period).Seconds()
	}
	windows := int(m.sc.Duration / m.period)
	for w := range int64(windows) {
		hw := m.hotWindows[w]
		if hw == nil {
			hw = make([]float64, m.nr)
		}
		f.HotWindows = append(f.HotWindows, hw)
	}
	return f
}

// convergence is the longest of the shifts' convergence times, -1 if one
// never converged.
func convergence(shifts []Shift, of func(Shift) float64) *float64 {
	worst := 0.0
	for _, s := range shifts {
		v := of(s)
		if v < 0 {
			worst = -1
			break
		}
		worst = max(worst, v)
	}
	return &worst
}

// shifts finds the start and the instants offered demand changes, and
// how long shares took to settle within 0.05 of the ideal split of the
// new demand. It returns nil for traffic of varying rate (a shape).
func (m *metrics) shifts(d *allot.Domain, l *allot.Limit, period time.Duration) []Shift {
	at := []time.Duration{0}
	for _, t := range m.sc.Traffic {
		if t.Shape != "" {
			return nil
		}
		at = append(at, t.From, t.Until)
	}
	slices.Sort(at)
	at = slices.Compact(at)
	at = slices.DeleteFunc(at, func(t time.Duration) bool { return t < 0 || t >= m.sc.Duration })
	out := []Shift{}
	for i, t := range at {
		next := m.sc.Duration
		if i+1 < len(at) {
			next = at[i+1]
		}
		s := Shift{At: t.Seconds(), Ideal: m.idealAt(t, d, l), ConvergenceS: -1, Periods: -1}
		all := time.Duration(-1)
		by := make([]time.Duration, m.nr)
		for r := range by {
			by[r] = -1
		}
		for j, st := range m.times {
			if st < t || st >= next {
				continue
			}
			ok := true
			for r, v := range m.shares[j] {
				in := math.Abs(v-s.Ideal[r]) <= 0.05
				ok = ok && in
				switch {
				case !in:
					by[r] = -1
				case by[r] < 0:
					by[r] = st
				}
			}
			switch {
			case !ok:
				all = -1
			case all < 0:
				all = st
			}
		}
		if all >= 0 {
			s.ConvergenceS = (all - t).Seconds()
			s.Periods = s.ConvergenceS / period.Seconds()
		}
		for _, b := range by {
			v := -1.0
			if b >= 0 {
				v = (b - t).Seconds()
			}
			s.ByRegion = append(s.ByRegion, v)
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
			rate := tr.Rate * float64(tr.Cost)
			if c := tr.LLM; c != nil { // the mean call, its output's cap aside
				rate = tr.Rate * (float64(c.PromptMin+c.PromptMax)/2 + c.OutputMedian*math.Exp(c.OutputSigma*c.OutputSigma/2))
			}
			rates[slices.Index(d.Regions, tr.Region)] += rate
			sum += rate
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

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
