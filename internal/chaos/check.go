package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot"
)

// LimitSpec is what the checker needs to know of one limit.
type LimitSpec struct {
	Domain, Name string
	Mode         allot.Mode
	Unit         allot.Unit
	// Amount is L, what the limit allows per Period over all regions.
	Amount int64
	Period time.Duration
	// Bound is how far above L a shared-mode window may go
	// (allot.SharedBound through a partition: for a delay of two sync
	// intervals; or the exported allot_peer_overshoot_bound if larger).
	Bound float64
}

// Specs returns the LimitSpecs of cfg's limits. The Bound of a
// shared-mode limit is the larger of allot.SharedBound through a
// partition (bursts included: for a delay of two sync intervals, the
// counts in flight at the cut being lost) and the bound the enforcers
// export for the delay they measured
// (allot_peer_overshoot_bound, in requests; pass the largest scraped).
func Specs(cfg *allot.Config, exported map[string]float64) []LimitSpec {
	var out []LimitSpec
	for _, d := range cfg.Domains {
		for _, l := range d.Limits {
			s := LimitSpec{Domain: d.Name, Name: l.Name, Mode: l.Mode, Unit: l.Unit, Amount: l.Rate.Amount, Period: l.Rate.Period}
			if l.Mode == allot.Shared && len(d.Regions) > 1 {
				s.Bound = max(allot.SharedBound(float64(l.Rate.Amount), l.Rate.Period, l.SyncInterval, 2*l.SyncInterval, len(d.Regions)), exported[d.Name+"/"+l.Name])
			}
			out = append(out, s)
		}
	}
	return out
}

// Input is what Check reads.
type Input struct {
	Limits  []LimitSpec
	Records []Record
	// Scrapes are the instances' /metrics at the end of each lifetime,
	// taken after the load client stopped sending to them.
	Scrapes []Scrape
	Events  []Event
}

// Report is what Check found. Violations lists every rule broken; the
// figures summarise the run.
type Report struct {
	Requests     int // records of every kind
	Answered     int
	PastDeadline int // not answered, or answered after their deadline
	Errors       map[string]int
	P50, P99     time.Duration // latency of answered requests
	MaxLatency   time.Duration
	Deadline     time.Duration // the largest deadline in the log

	Split  []WindowStat // one per split-mode limit counted in requests
	Shared []WindowStat // one per shared-mode limit

	Reservations ReservationStat
	Metrics      MetricsStat

	LeaderFailover []time.Duration // per leader killed: until another led
	FallbackExit   []time.Duration // per Redis restarted: until no limit was in fallback
	PartitionHeal  []time.Duration // per partition healed: until peers relinked, out of fallback

	Violations []string
}

// WindowStat is one limit's windows: the admitted hits of each key in
// each fixed window (id floor(unix_ns / period)), over all regions.
type WindowStat struct {
	Limit string
	L     int64
	Bound float64 // shared mode: how far above L a window may go
	// Windows counts (key, window) pairs with admissions; Above those
	// above L (split) or L + Bound (shared); AboveL (shared) those above
	// L at all.
	Windows, Above, AboveL int
	// Worst is the largest total − L over windows (negative: every
	// window stayed below L), at WorstKey in window WorstWindow.
	Worst       int64
	WorstKey    string
	WorstWindow int64
	Admitted    int64
	// Ambiguous counts admissions sent in one window and answered in the
	// next: the server decided in one of them, the log cannot say which.
	// They are left out of the totals (an admission left out can only hide
	// an excess of at most its hits, never make one).
	Ambiguous int
}

// ReservationStat is how the reservations ended.
type ReservationStat struct {
	Admitted, Rejected int
	Settled, Released  int
	// Expired were abandoned by the client and found expired after their
	// TTL; LateEnds were settled or released after they had expired.
	Expired, LateEnds int
	Unended           int // no known end: violations
}

// MetricsStat is the comparison of the instances' counters with the log.
type MetricsStat struct {
	Lifetimes  int // instance lifetimes scraped
	Series     int // (lifetime, limit, result) counters compared
	Mismatches int
}

// OK reports whether no rule was broken.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// maxExamples bounds the violations listed per rule.
const maxExamples = 10

// Check verifies the decision log against the rules:
//
//   - split mode: in every fixed window, the admitted hits of each key,
//     summed over all regions, are at most L (limits counted in
//     requests; token limits are checked through their reservations);
//   - shared mode: at most L + Bound;
//   - every request was answered within its deadline;
//   - every admitted reservation ended: settled, released, or expired
//     (an abandoned one, probed after its TTL, answers late);
//   - each instance lifetime's counters agree with the log:
//     allot_regional_decisions_total{domain,limit,result} and
//     allot_regional_reservations_total{result} count at least the
//     answered requests the log has for that lifetime, and at most those
//     plus the unanswered ones (the server may have decided a request
//     whose answer came too late);
//   - every recovery the schedule waited for came in time: a new leader,
//     a healed region relinked, a region out of fallback after its Redis
//     returned (events with Failed set).
func Check(in Input) *Report {
	r := &Report{Errors: map[string]int{}}
	specs := map[[2]string]LimitSpec{}
	for _, s := range in.Limits {
		specs[[2]string{s.Domain, s.Name}] = s
	}
	r.checkDeadlines(in.Records)
	r.checkWindows(in.Records, in.Limits, specs)
	r.checkReservations(in.Records)
	r.checkMetrics(in.Records, in.Scrapes, specs)
	for _, e := range in.Events {
		if e.Failed != "" {
			r.violate("recovery: %s %s at %s: %s", e.Name, e.Target, stamp(e.At), e.Failed)
			continue
		}
		switch e.Name {
		case EventLeaderKilled:
			r.LeaderFailover = append(r.LeaderFailover, e.Took)
		case EventFallbackLeft:
			r.FallbackExit = append(r.FallbackExit, e.Took)
		case EventPartitionHeal:
			r.PartitionHeal = append(r.PartitionHeal, e.Took)
		}
	}
	return r
}

func (r *Report) checkDeadlines(recs []Record) {
	var lat []time.Duration
	n := 0
	for i := range recs {
		rec := &recs[i]
		r.Requests++
		r.Deadline = max(r.Deadline, time.Duration(rec.Deadline))
		if rec.Answered() {
			r.Answered++
			lat = append(lat, time.Duration(rec.Latency))
		} else {
			r.Errors[rec.Err]++
		}
		// Recompute rather than trust the client's flag alone.
		met := rec.Answered() && rec.DeadlineMet && rec.Latency <= rec.Deadline
		if !met {
			r.PastDeadline++
			if n++; n <= maxExamples {
				what := fmt.Sprintf("answered in %v", time.Duration(rec.Latency))
				if !rec.Answered() {
					what = "no answer: " + rec.Err
				}
				r.violate("deadline: %s %s/%s %s at %s on %s (life %d): %s, deadline %v", rec.Kind, rec.Domain, rec.Limit, rec.Key,
					stamp(rec.At), rec.Instance, rec.Life, what, time.Duration(rec.Deadline))
			}
		}
	}
	if n > maxExamples {
		r.violate("deadline: %d more requests past their deadline", n-maxExamples)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		r.P50, r.P99, r.MaxLatency = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
}

type keyWindow struct {
	key    string
	window int64
}

func (r *Report) checkWindows(recs []Record, limits []LimitSpec, specs map[[2]string]LimitSpec) {
	type acc struct {
		stat   *WindowStat
		spec   LimitSpec
		totals map[keyWindow]int64
	}
	accs := map[[2]string]*acc{}
	for _, s := range limits {
		if s.Period <= 0 || s.Mode == allot.Split && s.Unit != allot.Requests {
			continue
		}
		accs[[2]string{s.Domain, s.Name}] = &acc{stat: &WindowStat{Limit: s.Domain + "/" + s.Name, L: s.Amount, Bound: s.Bound}, spec: s, totals: map[keyWindow]int64{}}
	}
	for i := range recs {
		rec := &recs[i]
		if rec.Kind != KindCheck || !rec.Answered() || !rec.Allowed || rec.Hits <= 0 {
			continue
		}
		a := accs[[2]string{rec.Domain, rec.Limit}]
		if a == nil {
			continue
		}
		a.stat.Admitted += rec.Hits
		p := int64(a.spec.Period)
		w0, w1 := rec.At/p, rec.Done/p
		if w0 != w1 {
			a.stat.Ambiguous++
			continue
		}
		a.totals[keyWindow{rec.Key, w0}] += rec.Hits
	}
	for _, s := range limits {
		a := accs[[2]string{s.Domain, s.Name}]
		if a == nil {
			continue
		}
		st := a.stat
		st.Worst = math.MinInt64
		kws := make([]keyWindow, 0, len(a.totals))
		for kw := range a.totals {
			kws = append(kws, kw)
		}
		slices.SortFunc(kws, func(x, y keyWindow) int {
			return cmp.Or(cmp.Compare(x.window, y.window), strings.Compare(x.key, y.key))
		})
		examples := 0
		for _, kw := range kws {
			total := a.totals[kw]
			st.Windows++
			if over := total - s.Amount; over > st.Worst {
				st.Worst, st.WorstKey, st.WorstWindow = over, kw.key, kw.window
			}
			limit := float64(s.Amount)
			if s.Mode == allot.Shared {
				if total > s.Amount {
					st.AboveL++
				}
				limit += s.Bound
			}
			if float64(total) > limit {
				st.Above++
				if examples++; examples <= maxExamples {
					r.violate("%s mode: %s %s window %d (%s): %d admitted over all regions, above %s", s.Mode, st.Limit, kw.key, kw.window,
						stamp(kw.window*int64(s.Period)), total, boundText(s))
				}
			}
		}
		if examples > maxExamples {
			r.violate("%s mode: %s: %d more windows above %s", s.Mode, st.Limit, examples-maxExamples, boundText(s))
		}
		if st.Windows == 0 {
			st.Worst = 0
		}
		if s.Mode == allot.Shared {
			r.Shared = append(r.Shared, *st)
		} else {
			r.Split = append(r.Split, *st)
		}
	}
}

func boundText(s LimitSpec) string {
	if s.Mode == allot.Shared {
		return fmt.Sprintf("L + bound = %d + %.1f", s.Amount, s.Bound)
	}
	return fmt.Sprintf("L = %d", s.Amount)
}

func (r *Report) checkReservations(recs []Record) {
	type res struct {
		reserve *Record
		ends    []*Record
	}
	byID := map[string]*res{}
	var order []string
	for i := range recs {
		rec := &recs[i]
		switch rec.Kind {
		case KindReserve:
			if !rec.Answered() {
				continue // the deadline rule reports it
			}
			if !rec.Allowed {
				r.Reservations.Rejected++
				continue
			}
			r.Reservations.Admitted++
			if byID[rec.ID] == nil {
				byID[rec.ID] = &res{}
				order = append(order, rec.ID)
			}
			byID[rec.ID].reserve = rec
		case KindSettle, KindRelease, KindProbe:
			if byID[rec.ID] == nil {
				byID[rec.ID] = &res{}
				order = append(order, rec.ID)
			}
			byID[rec.ID].ends = append(byID[rec.ID].ends, rec)
		}
	}
	n := 0
	unended := func(format string, args ...any) {
		r.Reservations.Unended++
		if n++; n <= maxExamples {
			r.violate("reservation: "+format, args...)
		}
	}
	for _, id := range order {
		x := byID[id]
		if x.reserve == nil {
			unended("%s: settled or released but never admitted in the log", id)
			continue
		}
		var end *Record
		for _, e := range x.ends {
			if e.Answered() {
				end = e
				break
			}
		}
		rv := x.reserve
		switch {
		case end == nil && len(x.ends) == 0:
			unended("%s (%s life %d, reserved at %s): never settled, released or probed", id, rv.Instance, rv.Life, stamp(rv.At))
		case end == nil:
			unended("%s (%s life %d): its %s got no answer (%s): its end is unknown", id, rv.Instance, rv.Life, x.ends[0].Kind, x.ends[0].Err)
		case end.Instance != rv.Instance || end.Life != rv.Life:
			unended("%s reserved on %s life %d, ended on %s life %d", id, rv.Instance, rv.Life, end.Instance, end.Life)
		case end.Kind == KindProbe:
			if end.Late || end.State == "expired" {
				r.Reservations.Expired++
			} else {
				unended("%s (%s life %d, reserved at %s): still active when probed after its TTL at %s (state %q)", id, rv.Instance, rv.Life,
					stamp(rv.At), stamp(end.At), end.State)
			}
		case end.Kind == KindSettle && end.State == "settled", end.Kind == KindRelease && end.State == "released":
			if end.Kind == KindSettle {
				r.Reservations.Settled++
			} else {
				r.Reservations.Released++
			}
			if end.Late {
				r.Reservations.LateEnds++
			}
		default:
			unended("%s: %s answered state %q", id, end.Kind, end.State)
		}
	}
	if n > maxExamples {
		r.violate("reservation: %d more reservations without a known end", n-maxExamples)
	}
}

func (r *Report) checkMetrics(recs []Record, scrapes []Scrape, specs map[[2]string]LimitSpec) {
	type life struct {
		instance string
		life     int
	}
	type tally struct{ allowed, rejected, unanswered int }
	checks := map[life]map[[2]string]*tally{}
	reserves := map[life]*tally{}
	for i := range recs {
		rec := &recs[i]
		l := life{rec.Instance, rec.Life}
		var t *tally
		switch rec.Kind {
		case KindCheck:
			if checks[l] == nil {
				checks[l] = map[[2]string]*tally{}
			}
			k := [2]string{rec.Domain, rec.Limit}
			if checks[l][k] == nil {
				checks[l][k] = &tally{}
			}
			t = checks[l][k]
		case KindReserve:
			if reserves[l] == nil {
				reserves[l] = &tally{}
			}
			t = reserves[l]
		default:
			continue
		}
		switch {
		case !rec.Answered():
			t.unanswered++
		case rec.Allowed:
			t.allowed++
		default:
			t.rejected++
		}
	}
	scraped := map[life]bool{}
	n := 0
	mismatch := func(format string, args ...any) {
		r.Metrics.Mismatches++
		if n++; n <= maxExamples {
			r.violate("metrics: "+format, args...)
		}
	}
	compare := func(l life, what string, metric float64, logged, unanswered int) {
		r.Metrics.Series++
		if metric < float64(logged) || metric > float64(logged+unanswered) {
			mismatch("%s life %d: %s = %.0f, the log has %d answered (+%d unanswered)", l.instance, l.life, what, metric, logged, unanswered)
		}
	}
	for _, sc := range scrapes {
		l := life{sc.Instance, sc.Life}
		scraped[l] = true
		r.Metrics.Lifetimes++
		keys := map[[2]string]bool{}
		for k := range checks[l] {
			keys[k] = true
		}
		for k := range specs {
			keys[k] = true
		}
		for k := range keys {
			t := checks[l][k]
			if t == nil {
				t = &tally{}
			}
			for _, res := range []struct {
				result string
				n      int
			}{{"allowed", t.allowed}, {"rejected", t.rejected}} {
				m := Sum(sc.Samples, "allot_regional_decisions_total", map[string]string{"domain": k[0], "limit": k[1], "result": res.result})
				compare(l, fmt.Sprintf("allot_regional_decisions_total{domain=%q,limit=%q,result=%q}", k[0], k[1], res.result), m, res.n, t.unanswered)
			}
		}
		t := reserves[l]
		if t == nil {
			t = &tally{}
		}
		compare(l, `allot_regional_reservations_total{result="admitted"}`,
			Sum(sc.Samples, "allot_regional_reservations_total", map[string]string{"result": "admitted"}), t.allowed, t.unanswered)
		compare(l, `allot_regional_reservations_total{result=~"rejected|concurrency_rejected"}`,
			Sum(sc.Samples, "allot_regional_reservations_total", map[string]string{"result": "rejected"})+
				Sum(sc.Samples, "allot_regional_reservations_total", map[string]string{"result": "concurrency_rejected"}), t.rejected, t.unanswered)
	}
	var missing []string
	for l := range checks {
		if !scraped[l] {
			missing = append(missing, fmt.Sprintf("%s life %d", l.instance, l.life))
		}
	}
	for l := range reserves {
		if !scraped[l] && checks[l] == nil {
			missing = append(missing, fmt.Sprintf("%s life %d", l.instance, l.life))
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		mismatch("%s answered requests but was not scraped at the end of its life", m)
	}
	if n > maxExamples {
		r.violate("metrics: %d more mismatches", n-maxExamples)
	}
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000") }

// Table is the summary, a Markdown table.
func (r *Report) Table() string {
	var b strings.Builder
	row := func(what, value string) { fmt.Fprintf(&b, "| %s | %s |\n", what, value) }
	b.WriteString("| what | result |\n|---|---|\n")
	row("requests served (answered / sent)", fmt.Sprintf("%d / %d", r.Answered, r.Requests))
	row(fmt.Sprintf("answers past deadline (%v)", r.Deadline), fmt.Sprintf("%d (latency p50 %v, p99 %v, max %v)", r.PastDeadline,
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.MaxLatency.Round(time.Microsecond)))
	above, windows := 0, 0
	var parts []string
	for _, s := range r.Split {
		above += s.Above
		windows += s.Windows
		parts = append(parts, fmt.Sprintf("%s %d/%d, fullest %+d vs L %d", s.Limit, s.Above, s.Windows, s.Worst, s.L))
	}
	row("split-mode windows above L (target 0)", fmt.Sprintf("%d of %d (%s)", above, windows, strings.Join(parts, "; ")))
	for _, s := range r.Shared {
		ratio := "-"
		if s.Bound > 0 {
			ratio = fmt.Sprintf("%.0f%%", 100*float64(max(s.Worst, 0))/s.Bound)
		}
		row("shared-mode worst overshoot vs bound: "+s.Limit, fmt.Sprintf("%+d vs bound %.1f (%s of it; L = %d); windows above L %d, above L + bound %d, of %d",
			s.Worst, s.Bound, ratio, s.L, s.AboveL, s.Above, s.Windows))
	}
	rs := r.Reservations
	row("token reservations", fmt.Sprintf("%d admitted (%d rejected): %d settled, %d released, %d expired (%d ended late); %d without a known end",
		rs.Admitted, rs.Rejected, rs.Settled, rs.Released, rs.Expired, rs.LateEnds, rs.Unended))
	row("counters vs log", fmt.Sprintf("%d instance lifetimes, %d counters, %d mismatches", r.Metrics.Lifetimes, r.Metrics.Series, r.Metrics.Mismatches))
	row("time to a new leader", durations(r.LeaderFailover))
	row("time to leave fallback after Redis returns", durations(r.FallbackExit))
	row("time to relink a healed region", durations(r.PartitionHeal))
	if len(r.Errors) > 0 {
		var es []string
		for e, n := range r.Errors {
			es = append(es, fmt.Sprintf("%s %d", e, n))
		}
		slices.Sort(es)
		row("errors", strings.Join(es, ", "))
	}
	return b.String()
}

// durations lists ds, or summarises more than three of them.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	if len(ds) > 3 {
		s := slices.Sorted(slices.Values(ds))
		return fmt.Sprintf("%d times: min %v, median %v, max %v", len(s), s[0].Round(time.Millisecond),
			s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
	}
	var s []string
	for _, d := range ds {
		s = append(s, d.Round(time.Millisecond).String())
	}
	return strings.Join(s, ", ")
}
