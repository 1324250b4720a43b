package admin

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot"
)

// Change is one difference between two configurations: an entity added
// (Old empty), removed (New empty), or one of its fields changed. Path
// names the entity ("limits/per-user", "plans/pro", "assign/tenant=acme",
// "overrides/per-user/user=42", "domain") and, for a field, the field
// ("limits/per-user.rate"). A whole domain added or removed has an empty
// Path.
type Change struct {
	Domain, Path, Old, New string
}

// Diff returns the changes that turn old (nil: no configuration) into
// new: domains in new's order, then those removed, each entity's changes
// in file order.
func Diff(old, new *allot.Config) []Change {
	var out []Change
	had := map[string]*allot.Domain{}
	if old != nil {
		for _, d := range old.Domains {
			had[d.Name] = d
		}
	}
	for _, d := range new.Domains {
		o := had[d.Name]
		delete(had, d.Name)
		if o == nil {
			out = append(out, Change{Domain: d.Name, New: "added, " + limitCount(len(d.Limits))})
			continue
		}
		out = append(out, diffDomain(d.Name, entities(o), entities(d))...)
	}
	if old != nil {
		for _, d := range old.Domains {
			if had[d.Name] != nil {
				out = append(out, Change{Domain: d.Name, Old: "removed, had " + limitCount(len(d.Limits))})
			}
		}
	}
	return out
}

func limitCount(n int) string {
	if n == 1 {
		return "1 limit"
	}
	return fmt.Sprintf("%d limits", n)
}

// entity is a named part of a domain and its fields, as text.
type entity struct {
	path   string
	fields [][2]string // name, value
}

func diffDomain(domain string, old, new []entity) []Change {
	var out []Change
	was := map[string]entity{}
	for _, e := range old {
		was[e.path] = e
	}
	for _, e := range new {
		o, ok := was[e.path]
		delete(was, e.path)
		if !ok {
			out = append(out, Change{Domain: domain, Path: e.path, New: summary(e.fields)})
			continue
		}
		before := map[string]string{}
		for _, f := range o.fields {
			before[f[0]] = f[1]
		}
		for _, f := range e.fields {
			if before[f[0]] != f[1] {
				out = append(out, Change{Domain: domain, Path: e.path + "." + f[0], Old: before[f[0]], New: f[1]})
			}
			delete(before, f[0])
		}
		for _, f := range o.fields {
			if v, ok := before[f[0]]; ok && v != "" {
				out = append(out, Change{Domain: domain, Path: e.path + "." + f[0], Old: v})
			}
		}
	}
	for _, e := range old {
		if _, ok := was[e.path]; ok {
			out = append(out, Change{Domain: domain, Path: e.path, Old: summary(e.fields)})
		}
	}
	return out
}

// summary is an entity's fields that are set, "name=value …".
func summary(fields [][2]string) string {
	var parts []string
	for _, f := range fields {
		if f[1] != "" && f[1] != "false" && f[1] != "0" {
			parts = append(parts, f[0]+"="+f[1])
		}
	}
	if len(parts) == 0 {
		return "(defaults)"
	}
	return strings.Join(parts, " ")
}

func entities(d *allot.Domain) []entity {
	es := []entity{{path: "domain", fields: [][2]string{{"regions", strings.Join(d.Regions, ",")}}}}
	for _, name := range slices.Sorted(maps.Keys(d.Plans)) {
		p := d.Plans[name]
		fs := [][2]string{{"multiplier", strconv.FormatFloat(p.Multiplier, 'g', -1, 64)}}
		for _, l := range slices.Sorted(maps.Keys(p.Floors)) {
			fs = append(fs, [2]string{"floors." + l, p.Floors[l].String()})
		}
		es = append(es, entity{"plans/" + name, fs})
	}
	for _, a := range d.Assignments {
		es = append(es, entity{"assign/" + a.Match.String(), [][2]string{{"plan", a.Plan}}})
	}
	for _, l := range d.Limits {
		es = append(es, entity{"limits/" + l.Name, limitFields(l)})
	}
	for _, o := range d.Overrides {
		fs := [][2]string{{"rate", ""}, {"multiplier", ""}, {"expires", ""}}
		if o.Rate != (allot.Rate{}) {
			fs[0][1] = o.Rate.String()
		} else {
			fs[1][1] = strconv.FormatFloat(o.Multiplier, 'g', -1, 64)
		}
		if !o.Expires.IsZero() {
			fs[2][1] = o.Expires.UTC().Format(time.RFC3339)
		}
		es = append(es, entity{"overrides/" + cmp.Or(o.Limit, "*") + "/" + o.Match.String(), fs})
	}
	return es
}

func limitFields(l *allot.Limit) [][2]string {
	var floors []string
	for _, r := range slices.Sorted(maps.Keys(l.Floors)) {
		floors = append(floors, r+":"+strconv.FormatFloat(l.Floors[r], 'g', -1, 64))
	}
	rate := ""
	if l.Rate != (allot.Rate{}) {
		rate = l.Rate.String()
	}
	return [][2]string{
		{"match", l.Match.String()},
		{"unit", l.Unit.String()},
		{"rate", rate},
		{"burst", strconv.FormatInt(l.Burst, 10)},
		{"algorithm", l.Algorithm.String()},
		{"mode", l.Mode.String()},
		{"enforcement", l.Enforcement.String()},
		{"floors", strings.Join(floors, ",")},
		{"on_failure", l.OnFailure.String()},
		{"shadow", strconv.FormatBool(l.Shadow)},
		{"concurrency", strconv.FormatInt(l.Concurrency, 10)},
		{"sync_interval", l.SyncInterval.String()},
		{"stale_after", l.StaleAfter.String()},
		{"unlimited", strconv.FormatBool(l.Unlimited)},
		{"replaces", strings.Join(l.Replaces, ",")},
	}
}
