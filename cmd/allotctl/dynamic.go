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

	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func (c *cli) overrideSet(ctx context.Context, args []string) error {
	fs := c.flags("override set", "--domain D --key user=42 (--limit 5000/1m | --multiplier 5) --ttl 2h [--on LIMIT]")
	domain := fs.String("domain", "", "domain (required)")
	key := fs.String("key", "", "the key: attribute=value[,attribute=value...] (required)")
	rate := fs.String("limit", "", "the key's rate instead of the limit's, AMOUNT/PERIOD")
	mult := fs.Float64("multiplier", 0, "multiply the key's rate and burst by this")
	ttl := fs.Duration("ttl", 0, "how long the override lasts; it then expires by itself (required)")
	on := fs.String("on", "", "the limit it changes (default: every limit the key matches)")
	reason := fs.String("reason", "", "why, for the list")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *domain == "" || *key == "" || *ttl == 0 {
		return errors.New("override set: --domain, --key and --ttl are required")
	}
	m, err := parseKey(*key)
	if err != nil {
		return err
	}
	req := &allotv1.SetOverrideRequest{Ttl: durationpb.New(*ttl), Override: &allotv1.Override{
		Domain: *domain, Limit: *on, Match: m, Rate: *rate, Multiplier: *mult, Reason: *reason, Author: c.author}}
	var o *allotv1.Override
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		o, err = a.SetOverride(ctx, req)
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(o)
	}
	fmt.Fprintf(c.stdout, "override set: %s %s %s until %s\n", o.GetDomain(), overrideTarget(o), overrideChange(o),
		o.GetExpires().AsTime().UTC().Format(time.RFC3339))
	return nil
}

func overrideTarget(o *allotv1.Override) string {
	if o.GetLimit() == "" {
		return keyText(o.GetMatch()) + " (every limit)"
	}
	return keyText(o.GetMatch()) + " on " + o.GetLimit()
}

func overrideChange(o *allotv1.Override) string {
	if o.GetRate() != "" {
		return "rate " + o.GetRate()
	}
	return "×" + strconv.FormatFloat(o.GetMultiplier(), 'g', -1, 64)
}

func (c *cli) overrideList(ctx context.Context, args []string) error {
	fs := c.flags("override list", "[--domain D]")
	domain := fs.String("domain", "", "domain (default: all)")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	var resp *allotv1.ListOverridesResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.ListOverrides(ctx, &allotv1.ListOverridesRequest{Domain: *domain})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(resp)
	}
	now := time.Now()
	var rows [][]string
	for _, o := range resp.GetOverrides() {
		expires, source := "never", "etcd"
		if o.GetExpires() != nil {
			t := o.GetExpires().AsTime()
			expires = fmt.Sprintf("%s (in %v)", t.UTC().Format(time.RFC3339), round(t.Sub(now)))
		}
		if o.GetFromFile() {
			source = "file"
		}
		rows = append(rows, []string{o.GetDomain(), orDash(o.GetLimit()), keyText(o.GetMatch()), overrideChange(o), expires, source,
			orDash(o.GetAuthor()), orDash(o.GetReason())})
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, "no overrides")
		return nil
	}
	return table(c.stdout, []string{"DOMAIN", "LIMIT", "KEY", "CHANGE", "EXPIRES", "SOURCE", "AUTHOR", "REASON"}, rows)
}

func (c *cli) overrideDelete(ctx context.Context, args []string) error {
	fs := c.flags("override delete", "--domain D --key user=42 [--on LIMIT]")
	domain := fs.String("domain", "", "domain (required)")
	key := fs.String("key", "", "the key (required)")
	on := fs.String("on", "", "the limit it changes, as set")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *domain == "" || *key == "" {
		return errors.New("override delete: --domain and --key are required")
	}
	m, err := parseKey(*key)
	if err != nil {
		return err
	}
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) error {
		_, err := a.DeleteOverride(ctx, &allotv1.DeleteOverrideRequest{Domain: *domain, Limit: *on, Match: m})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(&allotv1.DeleteOverrideResponse{})
	}
	fmt.Fprintf(c.stdout, "override deleted: %s %s\n", *domain, *key)
	return nil
}

func (c *cli) planAssign(ctx context.Context, args []string) error {
	fs := c.flags("plan assign", "--domain D KEY PLAN  (KEY such as tenant=acme)")
	domain := fs.String("domain", "", "domain (required)")
	pos, err := c.parse(fs, args, 2, 2)
	if err != nil {
		return err
	}
	if *domain == "" {
		return errors.New("plan assign: --domain is required")
	}
	m, err := parseKey(pos[0])
	if err != nil {
		return err
	}
	var a *allotv1.PlanAssignment
	if err := c.call(ctx, func(ctx context.Context, cl allotv1.AdminClient) (err error) {
		a, err = cl.AssignPlan(ctx, &allotv1.AssignPlanRequest{Assignment: &allotv1.PlanAssignment{Domain: *domain, Match: m, Plan: pos[1], Author: c.author}})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(a)
	}
	fmt.Fprintf(c.stdout, "plan assigned: %s %s → %s\n", a.GetDomain(), keyText(a.GetMatch()), a.GetPlan())
	return nil
}

func (c *cli) planUnassign(ctx context.Context, args []string) error {
	fs := c.flags("plan unassign", "--domain D KEY")
	domain := fs.String("domain", "", "domain (required)")
	pos, err := c.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *domain == "" {
		return errors.New("plan unassign: --domain is required")
	}
	m, err := parseKey(pos[0])
	if err != nil {
		return err
	}
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) error {
		_, err := a.UnassignPlan(ctx, &allotv1.UnassignPlanRequest{Domain: *domain, Match: m})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(&allotv1.UnassignPlanResponse{})
	}
	fmt.Fprintf(c.stdout, "plan assignment deleted: %s %s\n", *domain, pos[0])
	return nil
}

func (c *cli) planList(ctx context.Context, args []string) error {
	fs := c.flags("plan list", "[--domain D]")
	domain := fs.String("domain", "", "domain (default: all)")
	if _, err := c.parse(fs, args, 0, 0); err != nil {
		return err
	}
	var resp *allotv1.ListPlansResponse
	if err := c.call(ctx, func(ctx context.Context, a allotv1.AdminClient) (err error) {
		resp, err = a.ListPlans(ctx, &allotv1.ListPlansRequest{Domain: *domain})
		return err
	}); err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(resp)
	}
	var rows [][]string
	for _, p := range resp.GetPlans() {
		var floors []string
		for _, l := range slices.Sorted(maps.Keys(p.GetFloors())) {
			floors = append(floors, l+" ≥ "+p.GetFloors()[l])
		}
		rows = append(rows, []string{p.GetDomain(), p.GetName(), "×" + strconv.FormatFloat(p.GetMultiplier(), 'g', -1, 64), orDash(strings.Join(floors, ", "))})
	}
	if err := table(c.stdout, []string{"DOMAIN", "PLAN", "MULTIPLIER", "FLOORS"}, rows); err != nil {
		return err
	}
	rows = nil
	for _, a := range resp.GetAssignments() {
		source := "etcd"
		if a.GetFromFile() {
			source = "file"
		}
		rows = append(rows, []string{a.GetDomain(), keyText(a.GetMatch()), a.GetPlan(), source, orDash(a.GetAuthor())})
	}
	fmt.Fprintln(c.stdout)
	return table(c.stdout, []string{"DOMAIN", "KEY", "PLAN", "SOURCE", "AUTHOR"}, rows)
}
