package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
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
// arrivals, and checks the assertions. The same scenario (and seed) gives
// the same Result.
func Run(sc *Scenario, cfg *allot.Config) (res *Result, err error) {
	d := cfg.Domains[0]
	l := d.Limit(sc.Limit)
	period := cmp.Or(sc.Period, coordinator.DefaultPeriod)
	res = &Result{Scenario: sc.Name, Seed: sc.Seed, Limit: l.Name, L: float64(l.Rate.Amount),
		WindowS: l.Rate.Period.Seconds(), PeriodS: period.Seconds(), Regions: d.Regions, Watch: sc.Watch}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sim: %s: %v", sc.Name, p)
		}
	}()
	for _, sys := range systems(l) {
		m, err := run(sc, cfg, sys)
		if err != nil {
			return nil, fmt.Errorf("sim: %s (%s): %w", sc.Name, sys, err)
		}
		res.Systems = append(res.Systems, m.figures(sys, d, l, period))
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
	c := Check{Assert: a}
	switch a.Check {
	case "overshoot_max_pct":
		c.Got = f.OvershootMaxPct
		c.OK = c.Got <= a.Value
	case "never_above_limit":
		c.Got = float64(f.OvershootWindows)
		c.OK = f.OvershootWindows == 0
	case "shares_sum_max":
		c.Got = f.MaxShareSum
		c.OK = c.Got <= a.Value
	case "false_rejects_max_pct":
		c.Got = f.FalseRejectPct
		c.OK = c.Got <= a.Value
	case "utilization_min_pct":
		c.Got = f.UtilizationPct
		c.OK = c.Got >= a.Value
	case "utilization_max_pct":
		c.Got = f.UtilizationPct
		c.OK = c.Got <= a.Value
	case "converge_within_periods":
		c.OK = len(f.Shifts) > 0
		for _, s := range f.Shifts {
			if s.Periods < 0 {
				c.Got, c.OK = -1, false
				break
			}
			c.Got = max(c.Got, s.Periods)
			c.OK = c.OK && s.Periods <= a.Value
		}
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
	b.WriteString("| system | requests | admitted | rejected | false rejects | false rejects % | utilisation % | windows above L | max overshoot % | messages/s |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.Systems {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.2f | %d | %.2f | %.1f |\n", f.System, f.Requests,
			f.Admitted, f.Rejected, f.FalseRejects, f.FalseRejectPct, f.UtilizationPct, f.OvershootWindows, f.OvershootMaxPct, f.MessagesPerS)
	}
	for _, f := range r.Systems {
		if f.MaxShareSum > 0 {
			fmt.Fprintf(&b, "\n%s: largest sum of the shares in force of one key, at any share change: %.6f\n", f.System, f.MaxShareSum)
		}
		if f.OvershootWindows > 0 {
			fmt.Fprintf(&b, "\n%s: largest overshoot first in key %s, window at %gs\n", f.System, f.WorstKey, f.WorstWindowS)
		}
		if f.LoanAsks > 0 {
			fmt.Fprintf(&b, "\n%s: %d loan asks, %.0f lent\n", f.System, f.LoanAsks, f.Loaned)
		}
	}
	b.WriteString("\nBy region (admitted / requests / false rejects):\n\n| system |")
	for _, reg := range r.Regions {
		fmt.Fprintf(&b, " %s |", reg)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(r.Regions)) + "\n")
	for _, f := range r.Systems {
		fmt.Fprintf(&b, "| %s |", f.System)
		for _, reg := range r.Regions {
			c := f.ByRegion[reg]
			fmt.Fprintf(&b, " %.0f / %.0f / %.0f |", c.Admitted, c.Requests, c.FalseRejects)
		}
		b.WriteString("\n")
	}
	if f := r.System(Allot); len(f.Shifts) > 0 {
		b.WriteString("\nDemand shifts (allot): shares of the watched key within 0.05 of ideal after\n\n| at (s) | ideal shares | convergence (s) | periods |\n|---:|---|---:|---:|\n")
		for _, s := range f.Shifts {
			fmt.Fprintf(&b, "| %g | %s | %s | %s |\n", s.At, floats(s.Ideal), never(s.ConvergenceS), never(s.Periods))
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
			fmt.Fprintf(&b, "* %s: %s %s %g: got %.3f", ok, c.System, c.Assert.Check, c.Value, c.Got)
			if c.Known != "" {
				fmt.Fprintf(&b, " (known failure: %s)", c.Known)
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
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
