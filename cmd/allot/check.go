package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
)

const checkUsage = `usage: allot check [flags]

Plays COUNT requests, INTERVAL apart on a virtual clock, against the in-memory engine, and prints
each decision. It runs locally, in this process, on the built-in example limits or the --config
file, each limit whole (no coordinator, no region's share): it never asks a running allot dev, whose
configuration may differ (allotctl limits history). To try a running allot dev, send it requests
(curl its POST /v1/check, or allot bench).`

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot check", checkUsage, stderr)
	var (
		config   = fs.String("config", "", "limits file (default: the built-in "+examples.LimitsName+")")
		domain   = fs.String("domain", "api", "domain of the requests")
		desc     = fs.String("descriptor", "tenant=globex,user=42", "the requests' descriptor: key=value,...")
		hits     = fs.Int64("hits", 1, "cost of each request")
		count    = fs.Int("count", 8, "number of requests")
		interval = fs.Duration("interval", 0, "virtual time between requests")
	)
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	if *count < 1 || *count > 1_000_000 {
		return fmt.Errorf("check: --count must be between 1 and 1000000, got %d", *count)
	}
	if *interval < 0 {
		return fmt.Errorf("check: --interval must not be negative, got %v", *interval)
	}
	d, err := parseDescriptor(*desc)
	if err != nil {
		return fmt.Errorf("check: --descriptor: %w", err)
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	e := regional.New(cfg, regional.Options{})
	now := time.Now()
	// A check that charges nothing, at the first request's time, names
	// the limits that match (the same for every request: one descriptor).
	var dec allot.Decision
	if err := e.Check(now, *domain, d, 0, &dec); err != nil {
		return err
	}
	limits := checkLimits(cfg.Domain(*domain), d, now, dec.Statuses)
	printCheckHeader(stdout, *config, *domain, *desc, *hits, *count, *interval, limits)

	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	head := "#\tat\tdecision\tretry_after"
	for _, l := range limits {
		head += "\t" + l.column
	}
	if len(limits) == 0 {
		head += "\tlimits"
	}
	fmt.Fprintln(tw, head)
	admitted, rejected := 0, 0
	for i := range *count {
		if ctx.Err() != nil {
			break
		}
		at := time.Duration(i) * *interval
		if err := e.Check(now.Add(at), *domain, d, *hits, &dec); err != nil {
			return err
		}
		verdict, retry := "allow", "-"
		if dec.Allowed {
			admitted++
		} else {
			rejected++
			verdict, retry = "REJECT (429)", retryString(dec.RetryAfter)
		}
		fmt.Fprintf(tw, "%d\t+%v\t%s\t%s\t%s\n", i+1, at, verdict, retry, strings.Join(checkCells(limits, dec.Statuses), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%d requests: %d admitted, %d rejected (429)\n", admitted+rejected, admitted, rejected)
	return err
}

// checkLimit is one limit that matches allot check's requests.
type checkLimit struct {
	name   string
	column string // the table's header: "per-user left/15"
	legend string // what its numbers mean
}

// checkLimits describes the limits of statuses (a decision's) for the
// table's columns and the legend, with desc's effective limits at now.
func checkLimits(dom *allot.Domain, desc allot.Descriptor, now time.Time, statuses []allot.LimitStatus) []checkLimit {
	var out []checkLimit
	for _, st := range statuses {
		rate := allot.Rate{Amount: st.Limit, Period: st.Window}
		c := checkLimit{name: st.Name, column: fmt.Sprintf("%s left/%d", st.Name, st.Limit)}
		var l *allot.Limit
		if dom != nil {
			l = dom.Limit(st.Name)
		}
		switch {
		case l == nil:
			c.legend = fmt.Sprintf("%s: %v: \"left\" is what it still admits after the request", st.Name, rate)
		case l.Unlimited:
			c.legend = fmt.Sprintf("%s: unlimited: it matches and never counts or rejects", st.Name)
		case l.Algorithm == allot.SlidingWindow:
			c.legend = fmt.Sprintf("%s: %v, sliding_window: \"left\" is what the current window of %s still admits after the request, of %d",
				st.Name, rate, period(st.Window), st.Limit)
		default:
			burst := dom.Effective(l, desc, now).Burst
			c.column = fmt.Sprintf("%s left/%d", st.Name, burst)
			what := "the tokens in the bucket after the request"
			if l.Algorithm == allot.GCRA {
				what = "how many more requests may pass at once after the request"
			}
			c.legend = fmt.Sprintf("%s: %v, burst %d, %v: \"left\" is %s, of %d (refilled at %v)",
				st.Name, rate, burst, l.Algorithm, what, burst, rate)
		}
		if st.Shadow {
			c.legend += " (shadow: counted, never rejects)"
		}
		out = append(out, c)
	}
	return out
}

// checkCells are one row's cells for limits: what each has left, with ✗
// for a limit that rejected.
func checkCells(limits []checkLimit, statuses []allot.LimitStatus) []string {
	if len(limits) == 0 {
		return []string{"no limit matches"}
	}
	cells := make([]string, len(limits))
	for i, l := range limits {
		cells[i] = "-"
		for _, st := range statuses {
			if st.Name != l.name {
				continue
			}
			cells[i] = fmt.Sprint(st.Remaining)
			if !st.Allowed {
				cells[i] += " ✗"
			}
			break
		}
	}
	return cells
}

// printCheckHeader says what allot check runs, against which limits,
// and what the table's numbers mean.
func printCheckHeader(w io.Writer, config, domain, desc string, hits int64, count int, interval time.Duration, limits []checkLimit) {
	source := "the built-in example limits (" + examples.LimitsName + ")"
	if config != "" {
		source = "the limits in " + config + " (--config)"
	}
	spacing := fmt.Sprintf("%v apart", interval)
	if interval == 0 {
		spacing = "all at once"
	}
	fmt.Fprintf(w, "allot check: %d requests for %s in domain %s (%d hit each), %s on a virtual clock,\n", count, desc, domain, hits, spacing)
	fmt.Fprintf(w, "against %s, run locally in one in-memory engine\n", source)
	fmt.Fprintf(w, "that holds each limit whole (no coordinator, no region's share). A running allot dev is not asked:\n")
	fmt.Fprintf(w, "its configuration may differ (allotctl limits history); send it requests to try it.\n")
	if len(limits) == 0 {
		fmt.Fprintf(w, "No limit of domain %s matches %s: every request is admitted.\n\n", domain, desc)
		return
	}
	fmt.Fprintf(w, "Limits that match:\n")
	for _, l := range limits {
		fmt.Fprintf(w, "  %s\n", l.legend)
	}
	fmt.Fprintf(w, "Columns: at = virtual time since the first request; retry_after = when the same request would pass;\n")
	fmt.Fprintf(w, "LIMIT left/N = what LIMIT has left after the request, of N (✗: LIMIT rejected the request).\n\n")
}

// period formats d as a rate's period: "1s", "1m", "10s".
func period(d time.Duration) string {
	_, p, _ := strings.Cut(allot.Rate{Amount: 1, Period: d}.String(), "/")
	if p != "" && (p[0] < '0' || p[0] > '9') {
		p = "1" + p
	}
	return p
}

// retryString is d rounded up to a millisecond, the least wait after
// which the request passes.
func retryString(d time.Duration) string {
	if d > time.Millisecond {
		d = (d + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	return d.String()
}
