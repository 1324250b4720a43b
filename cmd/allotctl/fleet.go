package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func (c *cli) usage(ctx context.Context, args []string) error {
	fs := c.flags("usage", "--domain D --key tenant=acme")
	domain := fs.String("domain", "", "domain (required)")
	key := fs.String("key", "", "the key: attribute=value[,attribute=value...] (required)")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *domain == "" || *key == "" {
		return errors.New("usage: --domain and --key are required")
	}
	d, err := parseKey(*key)
	if err != nil {
		return err
	}
	var resp *allotv1.UsageResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.Usage(ctx, &allotv1.UsageRequest{Domain: *domain, Descriptor_: d})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(resp)
	}
	if len(resp.GetRegions()) == 0 {
		fmt.Fprintln(c.stdout, "no region is registered in etcd")
		return nil
	}
	row := func(region string, l *allotv1.LimitUsage) []string {
		return []string{l.GetLimit(), l.GetKey(), region, strconv.FormatInt(l.GetUsed(), 10), strconv.FormatInt(l.GetRemaining(), 10),
			allot.Rate{Amount: l.GetAmount(), Period: l.GetWindow().AsDuration()}.String(), fmt.Sprintf("%.3f", l.GetShare()),
			round(l.GetResetAfter().AsDuration()).String(), yesNo(l.GetShadow())}
	}
	var rows [][]string
	for _, g := range resp.GetGlobal() {
		for _, r := range resp.GetRegions() {
			for _, l := range r.GetLimits() {
				if l.GetKey() == g.GetKey() {
					rows = append(rows, row(r.GetRegion(), l))
				}
			}
		}
		rows = append(rows, row("all regions", g))
	}
	if len(resp.GetGlobal()) == 0 {
		fmt.Fprintf(c.stdout, "no limit of %s matches %s\n", *domain, *key)
	} else if err := table(c.stdout, []string{"LIMIT", "KEY", "REGION", "USED", "REMAINING", "LIMIT/WINDOW", "SHARE", "RESET", "SHADOW"}, rows); err != nil {
		return err
	}
	for _, g := range resp.GetGlobal() {
		if ratesDiffer(resp, g.GetKey()) {
			fmt.Fprintf(c.stdout, "the regions enforce different limits on %s: a change has not reached every region yet (all regions shows the lowest)\n", g.GetKey())
		}
	}
	for _, r := range resp.GetRegions() {
		if r.GetError() != "" {
			fmt.Fprintf(c.stdout, "region %s (%s) did not answer: %s\n", r.GetRegion(), r.GetAddr(), r.GetError())
		}
	}
	return nil
}

// ratesDiffer reports whether the regions of resp enforce different
// limits on key.
func ratesDiffer(resp *allotv1.UsageResponse, key string) bool {
	var first *allotv1.LimitUsage
	for _, r := range resp.GetRegions() {
		for _, l := range r.GetLimits() {
			switch {
			case l.GetKey() != key:
			case first == nil:
				first = l
			case l.GetAmount() != first.GetAmount() || l.GetWindow().AsDuration() != first.GetWindow().AsDuration():
				return true
			}
		}
	}
	return false
}

func (c *cli) status(ctx context.Context, args []string) error {
	fs := c.flags("status", "")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	var resp *allotv1.StatusResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.Status(ctx, &allotv1.StatusRequest{})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(resp)
	}
	w := c.stdout
	if v := resp.GetConfig(); v.GetVersion() > 0 && v.GetTime() != nil {
		fmt.Fprintf(w, "configuration: version %d, applied %s by %s: %s\n", v.GetVersion(), ago(v.GetTime().AsTime(), time.Now()), orDash(v.GetAuthor()), v.GetSummary())
	} else if v.GetVersion() > 0 {
		fmt.Fprintf(w, "configuration: version %d\n", v.GetVersion())
	} else {
		fmt.Fprintln(w, "configuration: none stored in etcd")
	}
	if e := resp.GetConfigError(); e != "" {
		fmt.Fprintln(w, "WARNING:", e)
	}
	inForce := sharesInForce(resp.GetRegions())
	for _, d := range resp.GetDomains() {
		leader, assigned := "no leader", "no assignment persisted yet"
		if d.GetLeader() != "" {
			leader = "leader " + d.GetLeader()
		}
		if d.GetTerm() > 0 {
			assigned = fmt.Sprintf("assignments term %d version %d", d.GetTerm(), d.GetVersion())
		}
		fmt.Fprintf(w, "\ndomain %s: %s, %s\n", d.GetName(), leader, assigned)
		var rows [][]string
		for _, l := range d.GetLimits() {
			sh := l.GetShares()
			if m := inForce[[2]string{d.GetName(), l.GetName()}]; len(m) > 0 {
				sh = m
			}
			rows = append(rows, []string{l.GetName(), l.GetRate(), l.GetMode(), l.GetEnforcement(), yesNo(l.GetShadow()),
				strconv.FormatInt(l.GetHotKeys(), 10), shares(sh)})
		}
		if err := table(w, []string{"LIMIT", "RATE", "MODE", "ENFORCEMENT", "SHADOW", "HOT KEYS", "SHARES IN FORCE"}, rows); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(resp.GetRegions()) == 0 {
		fmt.Fprintln(w, "no region is registered in etcd")
		return nil
	}
	var rows [][]string
	for _, r := range resp.GetRegions() {
		if r.GetError() != "" {
			rows = append(rows, []string{r.GetRegion(), r.GetAddr(), "-", "-", "-", "-", "no answer: " + r.GetError()})
			continue
		}
		config := "file"
		if r.GetConfigVersion() > 0 {
			config = "v" + strconv.FormatInt(r.GetConfigVersion(), 10)
		}
		var assign, fallback []string
		for _, d := range r.GetDomains() {
			if d.GetTerm() > 0 {
				assign = append(assign, fmt.Sprintf("%s t%d v%d", d.GetName(), d.GetTerm(), d.GetVersion()))
			}
			for _, l := range d.GetLimits() {
				if l.GetFallback() {
					fallback = append(fallback, d.GetName()+"/"+l.GetName())
				}
			}
		}
		lag := "n/a" // no shared-mode limit: regions do not sync counters
		if len(r.GetPeers()) > 0 {
			var ps []string
			for _, p := range r.GetPeers() {
				if p.GetLag() == nil {
					ps = append(ps, p.GetRegion()+" never heard")
					continue
				}
				ps = append(ps, fmt.Sprintf("%s %v", p.GetRegion(), round(p.GetLag().AsDuration())))
			}
			lag = strings.Join(ps, ", ")
		}
		state := "ok"
		if r.GetConfigError() != "" {
			state = "config refused: " + r.GetConfigError()
		}
		rows = append(rows, []string{r.GetRegion(), r.GetAddr(), config, orDash(strings.Join(assign, ", ")),
			orDash(strings.Join(fallback, ", ")), lag, state})
	}
	return table(w, []string{"REGION", "ADDR", "CONFIG", "ASSIGNMENTS", "FALLBACK", "SYNC LAG", "STATE"}, rows)
}

// sharesInForce is each limit's default share in each region that
// answered: (domain, limit) → region → share.
func sharesInForce(regions []*allotv1.RegionStatus) map[[2]string]map[string]float64 {
	out := map[[2]string]map[string]float64{}
	for _, r := range regions {
		for _, d := range r.GetDomains() {
			for _, l := range d.GetLimits() {
				id := [2]string{d.GetName(), l.GetName()}
				if out[id] == nil {
					out[id] = map[string]float64{}
				}
				out[id][r.GetRegion()] = l.GetShare()
			}
		}
	}
	return out
}

// shares formats a limit's shares per region.
func shares(m map[string]float64) string {
	if len(m) == 0 {
		return "whole limit in each region"
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.3f", r, m[r]))
	}
	return strings.Join(parts, ", ")
}
