package sim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
)

// Result is a scenario's figures for every system, and its assertions.
type Result struct {
	Scenario string    `json:"scenario"`
	Seed     uint64    `json:"seed"`
	Limit    string    `json:"limit"`
	L        float64   `json:"limit_per_window"`
	WindowS  float64   `json:"window_s"`
	PeriodS  float64   `json:"rebalance_period_s"`
	Regions  []string  `json:"regions"`
	Watch    string    `json:"watch"`
	Systems  []Figures `json:"systems"`
	Checks   []Check   `json:"assertions"`
}

// Check is the outcome of one assertion.
type Check struct {
	Assert
	Got float64 `json:"got"`
	OK  bool    `json:"ok"`
}

// Failed returns the assertions that failed, other than known failures,
// and the known failures that passed.
func (r *Result) Failed() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.OK == (c.Known != "") {
			out = append(out, c)
		}
	}
	return out
}

// Run simulates every system of Systems on the scenario, with the same
// arrivals, and checks the assertions. The systems, and the ideal pass
// that they are measured against, run concurrently, each on its own
// goroutine and virtual clock. The same scenario (and seed) gives the
// same Result.
func Run(sc *Scenario, cfg *allot.Config) (*Result, error) {
	d := cfg.Domains[0]
	l := d.Limit(sc.Limit)
	period := cmp.Or(sc.Period, coordinator.DefaultPeriod)
	res := &Result{Scenario: sc.Name, Seed: sc.Seed, Limit: l.Name, L: float64(l.Rate.Amount),
		WindowS: l.Rate.Period.Seconds(), PeriodS: period.Seconds(), Regions: d.Regions, Watch: sc.Watch}
	keys := newKeySpace(sc, l)
	names := append([]string{ideal}, systems(sc, l)...)
	ms := make([]*metrics, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, sys := range names {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("sim: %s (%s): %v", sc.Name, sys, p)
				}
			}()
			m, err := run(sc, cfg, sys, keys)
			if err != nil {
				err = fmt.Errorf("sim: %s (%s): %w", sc.Name, sys, err)
			}
			ms[i], errs[i] = m, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, sys := range names[1:] {
		res.Systems = append(res.Systems, ms[i+1].figures(sys, d, l, period, ms[0].byRegion))
	}
	for _, a := range sc.Asserts {
		res.Checks = append(res.Checks, res.check(a))
	}
	return res, nil
}

// System returns the figures of a system, or nil.
func (r *Result) System(name string) *Figures {
	for i := range r.Systems {
		if r.Systems[i].System == name {
			return &r.Systems[i]
		}
	}
	return nil
}

func (r *Result) check(a Assert) Check {
	f := r.System(a.System)
	s := f.Summary
	if a.Region != "" {
		s = f.ByRegion[a.Region]
	}
	c := Check{Assert: a}
	switch a.Check {
	case "overshoot_max_pct":
		c.Got = s.OvershootMaxPct
		c.OK = c.Got <= a.Value
	case "overshoot_min_pct":
		c.Got = s.OvershootMaxPct
		c.OK = c.Got >= a.Value
	case "never_above_limit":
		c.Got = float64(s.OvershootWindows)
		c.OK = s.OvershootWindows == 0
		if f.Bound != nil { // a bucket: B + r·T over every interval (global: Parse refuses a region)
			c.Got = float64(f.Bound.Above)
			c.OK = f.Bound.Above == 0
		}
	case "shares_sum_max":
		c.Got = f.MaxShareSum
		c.OK = c.Got <= a.Value
	case "false_rejects_max_pct":
		c.Got = s.FalseRejectPct
		c.OK = c.Got <= a.Value
	case "utilization_min_pct":
		c.Got = s.UtilizationPct
		c.OK = c.Got >= a.Value
	case "utilization_max_pct":
		c.Got = s.UtilizationPct
		c.OK = c.Got <= a.Value
	case "store_calls_max_per_request":
		c.Got = s.StoreCallsPerRequest
		c.OK = c.Got <= a.Value
	case "converge_within_periods":
		n, ri := 0, slices.Index(r.Regions, a.Region)
		c.OK = true
		for _, sh := range f.Shifts {
			if sh.At == 0 {
				continue // the start is not a shift
			}
			n++
			v := sh.Periods
			if ri >= 0 {
				if v = sh.ByRegion[ri]; v >= 0 {
					v /= r.PeriodS
				}
			}
			if v < 0 {
				c.Got, c.OK = -1, false
				break
			}
			c.Got = max(c.Got, v)
			c.OK = c.OK && v <= a.Value
		}
		c.OK = c.OK && n > 0
	}
	return c
}

// JSON writes the summary.
func (r *Result) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Markdown writes the report.
func (r *Result) Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\nseed %d, limit %s: L = %g per %gs window per key, rebalance period %gs\n\n",
		r.Scenario, r.Seed, r.Limit, r.L, r.WindowS, r.PeriodS)
	b.WriteString("| system | requests | admitted | rejected | false rejects | false rejects % | utilisation % | windows above L | max overshoot % | convergence (s) | messages/s | store calls/request |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.Systems {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.2f | %d | %.2f | %s | %.1f | %.4f |\n", f.System, f.Requests,
			f.Admitted, f.Rejected, f.FalseRejects, f.FalseRejectPct, f.UtilizationPct, f.OvershootWindows, f.OvershootMaxPct,
			Seconds(f.ConvergenceS), f.MessagesPerS, f.StoreCallsPerRequest)
	}
	for _, f := range r.Systems {
		if f.MaxShareSum > 0 {
			fmt.Fprintf(&b, "\n%s: largest sum of the shares in force of one key, at any share change: %.6f\n", f.System, f.MaxShareSum)
		}
		if bd := f.Bound; bd != nil {
			fmt.Fprintf(&b, "\n%s: B + r·T (B = %g, r = %g/s) over every interval, per key: %d admissions end an interval above it, largest excess %.2f (%.2f %% of B)",
				f.System, bd.Burst, bd.RatePerS, bd.Above, bd.ExcessMax, bd.ExcessMaxPct)
			if bd.Key != "" {
				fmt.Fprintf(&b, ", first in key %s over [%gs, %gs]", bd.Key, bd.FromS, bd.ToS)
			}
			b.WriteString("\n")
		}
		if f.OvershootWindows > 0 {
			fmt.Fprintf(&b, "\n%s: largest overshoot first in key %s, window at %gs\n", f.System, f.WorstKey, f.WorstWindowS)
		}
		if f.LoanAsks > 0 {
			fmt.Fprintf(&b, "\n%s: %d loan asks, %.0f lent\n", f.System, f.LoanAsks, f.Loaned)
		}
		if f.StoreHeartbeats > 0 {
			fmt.Fprintf(&b, "\n%s: %d regional store calls on the request path and for leases, %d heartbeats\n", f.System, f.StoreCalls, f.StoreHeartbeats)
		}
		if f.MaxInFlight > 0 {
			fmt.Fprintf(&b, "\n%s: at most %d LLM calls streaming at once\n", f.System, f.MaxInFlight)
		}
	}
	b.WriteString("\nBy region:\n\n| system | region | requests | admitted | false rejects % | utilisation % | windows above L | overshoot % (its part) | convergence (s) | messages/s | store calls/request |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.Systems {
		for _, reg := range r.Regions {
			c := f.ByRegion[reg]
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.3f | %.2f | %d | %.2f | %s | %.1f | %.4f |\n", f.System, reg, c.Requests, c.Admitted,
				c.FalseRejectPct, c.UtilizationPct, c.OvershootWindows, c.OvershootMaxPct, Seconds(c.ConvergenceS), c.MessagesPerS, c.StoreCallsPerRequest)
		}
	}
	if f := r.System(Allot); len(f.Shifts) > 0 {
		b.WriteString("\nStart and demand shifts (allot): shares of the watched key within 0.05 of ideal after\n\n| at (s) | ideal shares | convergence (s) | periods | by region (s) |\n|---:|---|---:|---:|---|\n")
		for _, s := range f.Shifts {
			by := make([]string, len(s.ByRegion))
			for i, v := range s.ByRegion {
				by[i] = never(v)
			}
			fmt.Fprintf(&b, "| %g | %s | %s | %s | %s |\n", s.At, floats(s.Ideal), never(s.ConvergenceS), never(s.Periods), strings.Join(by, " / "))
		}
	}
	if f := r.System(Allot); len(f.Shares) > 0 {
		b.WriteString("\nShares of the watched key in force (allot), every second:\n\n| t (s) | " + strings.Join(r.Regions, " | ") + " | sum |\n|---:|" + strings.Repeat("---:|", len(r.Regions)+1) + "\n")
		for i, t := range f.ShareTimes {
			if t%time.Second != 0 {
				continue
			}
			sum := 0.0
			for _, v := range f.Shares[i] {
				sum += v
			}
			fmt.Fprintf(&b, "| %g | %s | %.3f |\n", t.Seconds(), strings.ReplaceAll(floats(f.Shares[i]), " / ", " | "), sum)
		}
	}
	fmt.Fprintf(&b, "\nGlobal admitted per window of the watched key (%s) vs L:\n\n| window (s) |", r.Watch)
	for _, f := range r.Systems {
		fmt.Fprintf(&b, " %s by region | %s total |", f.System, f.System)
	}
	b.WriteString("\n|---:|" + strings.Repeat("---|---:|", len(r.Systems)) + "\n")
	for w := range r.Systems[0].HotWindows {
		fmt.Fprintf(&b, "| %g |", float64(w)*r.WindowS)
		for _, f := range r.Systems {
			sum := 0.0
			for _, n := range f.HotWindows[w] {
				sum += n
			}
			mark := ""
			if sum > r.L {
				mark = " **> L**"
			}
			fmt.Fprintf(&b, " %s | %.0f%s |", floats(f.HotWindows[w]), sum, mark)
		}
		b.WriteString("\n")
	}
	if len(r.Checks) > 0 {
		b.WriteString("\nAssertions:\n\n")
		for _, c := range r.Checks {
			ok := "ok"
			if !c.OK {
				ok = "FAILED"
			}
			fmt.Fprintf(&b, "* %s: %s", ok, c.System)
			if c.Region != "" {
				fmt.Fprintf(&b, " (%s)", c.Region)
			}
			fmt.Fprintf(&b, " %s %g: got %.3f", c.Assert.Check, c.Value, c.Got)
			if c.Known != "" {
				fmt.Fprintf(&b, " (known failure: %s)", c.Known)
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Seconds formats a convergence time: "n/a" for none, "never" for -1.
func Seconds(x *float64) string {
	if x == nil {
		return "n/a"
	}
	return never(*x)
}

func floats(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.3g", x)
	}
	return strings.Join(s, " / ")
}

func never(x float64) string {
	if x < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f", x)
}
