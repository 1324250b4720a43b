package allot

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Dynamic is what operators change on a running fleet besides the limits
// file: overrides, which expire, and plan assignments, by domain name.
// A fleet keeps them in etcd (see coordinator/etcdstore).
type Dynamic struct {
	Overrides   map[string][]Override
	Assignments map[string][]PlanAssignment
}

// WithDynamic returns a copy of c in which each domain's overrides and
// plan assignments are the file's followed by dyn's, so that at equal
// specificity dyn's win (Effective takes the later one). c is not changed
// and its unchanged domains are shared.
//
// An entry that does not fit (an unknown domain, limit or plan, a bad
// match, rate or multiplier) is left out and reported in the returned
// error, a ConfigErrors whose Field names the domain and the entry. The
// returned Config is valid and indexed in every case.
func (c *Config) WithDynamic(dyn Dynamic) (*Config, error) {
	var errs ConfigErrors
	for _, name := range sortedKeys(dyn.Overrides, dyn.Assignments) {
		if c.Domain(name) != nil {
			continue
		}
		for _, o := range dyn.Overrides[name] {
			errs = append(errs, &ConfigError{Field: name + ": " + describeOverride(o), Msg: "unknown domain"})
		}
		for _, a := range dyn.Assignments[name] {
			errs = append(errs, &ConfigError{Field: name + ": " + describeAssignment(a), Msg: "unknown domain"})
		}
	}
	out := &Config{Source: c.Source, Domains: slices.Clone(c.Domains)}
	for i, d := range c.Domains {
		os, as := dyn.Overrides[d.Name], dyn.Assignments[d.Name]
		for len(os)+len(as) > 0 {
			nd := *d
			nd.Overrides = slices.Concat(d.Overrides, os)
			nd.Assignments = slices.Concat(d.Assignments, as)
			err := nd.Validate()
			if err == nil {
				out.Domains[i] = &nd
				break
			}
			var ces ConfigErrors
			errors.As(err, &ces)
			badO, badA := map[int]bool{}, map[int]bool{}
			for _, e := range ces {
				if j, rest, ok := entryOf(e.Field, "overrides", len(d.Overrides)); ok && j < len(os) {
					badO[j] = true
					errs = append(errs, &ConfigError{Field: d.Name + ": " + describeOverride(os[j]), Msg: rest + e.Msg})
				} else if j, rest, ok := entryOf(e.Field, "assign", len(d.Assignments)); ok && j < len(as) {
					badA[j] = true
					errs = append(errs, &ConfigError{Field: d.Name + ": " + describeAssignment(as[j]), Msg: rest + e.Msg})
				}
			}
			if len(badO)+len(badA) == 0 { // not an entry's fault: keep the file's domain
				errs = append(errs, ces...)
				break
			}
			os = dropIndexes(os, badO)
			as = dropIndexes(as, badA)
		}
	}
	if len(errs) > 0 {
		return out, errs
	}
	return out, nil
}

// entryOf parses a field path such as overrides[7].limit: the index of
// the entry of list, less base (the file's entries), and the rest of the
// path as "limit: ". ok is false for other fields and for the file's own
// entries.
func entryOf(field, list string, base int) (j int, rest string, ok bool) {
	s, ok := strings.CutPrefix(field, list+"[")
	if !ok {
		return 0, "", false
	}
	n, after, ok := strings.Cut(s, "]")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || i < base {
		return 0, "", false
	}
	if after = strings.TrimPrefix(after, "."); after != "" {
		after += ": "
	}
	return i - base, after, true
}

func dropIndexes[T any](s []T, drop map[int]bool) []T {
	var out []T
	for i, v := range s {
		if !drop[i] {
			out = append(out, v)
		}
	}
	return out
}

func sortedKeys[A, B any](a map[string]A, b map[string]B) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

func describeOverride(o Override) string {
	s := "override " + o.Match.String()
	if o.Limit != "" {
		s += " on " + o.Limit
	}
	return s
}

func describeAssignment(a PlanAssignment) string {
	return fmt.Sprintf("plan assignment %s → %s", a.Match, a.Plan)
}
