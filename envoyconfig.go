package allot

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Configuration files written for Envoy's rate limit service
// (github.com/envoyproxy/ratelimit) are read as they are, so that a user
// can switch without rewriting them. ParseConfig reads a document in that
// format when it has a top-level descriptors key and no limits key:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: {unit: day, requests_per_unit: 5}
//
// Each descriptor with a rate_limit becomes a Limit whose Match is the path
// of (key, value) entries from the top; a missing or empty value is "*"
// (any value), and a value ending in "*" is a prefix, as in Envoy. The
// domain gets EnvoyPaths, so matching follows Envoy: a limit applies to a
// request descriptor with exactly its entries, and the most specific one
// wins.
//
// The conversion:
//   - rate: requests_per_unit per unit_multiplier × unit, the unit in any
//     case. A month is 30 days and a year 365 days; a period is at most
//     366 days (see Rate.Validate), which bounds unit_multiplier.
//   - algorithm: sliding_window. Envoy's service counts fixed windows,
//     which admit up to twice the limit across a window edge; a sliding
//     window weighs the previous window and avoids that double burst.
//     Burst is the rate's amount; other fields take the loader's defaults
//     (split mode, local enforcement, DefaultSyncInterval).
//   - name: rate_limit.name, or one derived from Envoy's statistics key of
//     the path (database_users, message_type_marketing.to_number), made to
//     fit [a-z0-9][a-z0-9_.-]* in 64 characters, with a hash of the path
//     appended when that changes it or when the name is taken.
//   - shadow_mode, unlimited and replaces carry over; detailed_metric is
//     accepted and ignored (allot's metrics never use raw values).
//   - A descriptor without rate_limit gives no limit. When it is more
//     specific than a limit that matches the same requests (an IP listed
//     next to a per-IP limit), it becomes an unlimited limit: Envoy's
//     service gives the requests that end there no limit ("whitelisted").
//
// Differences that a file may hit, each reported with its line:
// requests_per_unit 0 (block everything) cannot be expressed; limit names
// must be unique and follow allot's rule; replaces must name a limit of the
// domain; a nested descriptor may not repeat the key of an enclosing one.
// Envoy's service walks the tree greedily and gives no limit when the most
// specific entry at some level leads nowhere; allot then applies the most
// specific limit that matches the whole descriptor.

var (
	envoyDomainFields     = []string{"domain", "descriptors"}
	envoyDescriptorFields = []string{"key", "value", "rate_limit", "shadow_mode", "detailed_metric", "descriptors"}
	envoyRateLimitFields  = []string{"unit", "requests_per_unit", "unit_multiplier", "name", "unlimited", "replaces"}
	envoyReplacesFields   = []string{"name"}
)

// envoyUnits are the units of Envoy's rate_limit.unit.
var envoyUnits = []struct {
	name string
	d    time.Duration
}{
	{"second", time.Second}, {"minute", time.Minute}, {"hour", time.Hour}, {"day", 24 * time.Hour},
	{"week", 7 * 24 * time.Hour}, {"month", 30 * 24 * time.Hour}, {"year", 365 * 24 * time.Hour},
}

const (
	envoyUnitNames = "second, minute, hour, day, week, month, year"
	maxPeriod      = 366 * 24 * time.Hour
)

// isEnvoyDocument reports whether doc is written for Envoy's rate limit
// service: a mapping with a descriptors key and no limits key.
func isEnvoyDocument(doc *yaml.Node) bool {
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return false
	}
	var descriptors, limits bool
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "descriptors":
			descriptors = true
		case "limits":
			limits = true
		}
	}
	return descriptors && !limits
}

// envoyFile reads one Envoy document.
type envoyFile struct {
	*loader
	limits   []envoyLimit // in file order, each parent before its children
	replaces []envoyRef   // every replaces entry, checked once all names are known
}

type envoyLimit struct {
	*Limit
	path string // field path that Domain.check reports under
	stat string // Envoy's statistics key of the descriptor path
	bare bool   // from a descriptor without rate_limit: kept only if it shadows a limit
}

type envoyRef struct{ name, field string }

// envoyDomain reads doc, written for Envoy's rate limit service, as
// domain reads allot's format.
func (p *loader) envoyDomain(doc *yaml.Node) *Domain {
	p.doc, p.lines, p.paths = len(p.errs), map[string]int{}, nil
	root := doc.Content[0]
	p.lines[""] = root.Line
	d := &Domain{EnvoyPaths: true}
	f := &envoyFile{loader: p}
	p.fields(root, "", envoyDomainFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "domain":
			d.Name, _ = p.str(v, field)
		case "descriptors":
			f.descriptors(v, field, nil, "", 1)
		}
	})
	taken := map[string]bool{}
	for _, l := range f.limits {
		if l.Name != "" {
			taken[l.Name] = true
		}
	}
	for _, l := range f.limits {
		if l.bare && !f.shadows(l.Match) {
			continue
		}
		if l.Name == "" {
			l.Name = envoyName(l.stat, l.Match, taken)
			taken[l.Name] = true
		}
		d.Limits, p.paths = append(d.Limits, l.Limit), append(p.paths, l.path)
	}
	if len(p.errs) == p.doc { // else a name may be unknown for a limit dropped for its own error
		for _, r := range f.replaces {
			if d.Limit(r.name) == nil {
				p.report(r.field, fmt.Sprintf("unknown limit %q", r.name))
			}
		}
	}
	d.check(p.paths, p.report)
	if len(p.errs) == p.doc {
		d.index()
	}
	return d
}

// descriptors reads a descriptor list whose entries extend parent's, at
// level depth (1 at the top). It reads no descriptor beyond maxLimits and
// no level beyond maxDepth.
func (f *envoyFile) descriptors(n *yaml.Node, path string, parent Match, stat string, depth int) {
	seen := map[Entry]int{} // entry → line of the first descriptor with it
	f.list(n, path, func(field string, v *yaml.Node) {
		if len(f.limits) >= maxLimits {
			f.report("descriptors", fmt.Sprintf("more than %d descriptors, want at most %d in a domain", maxLimits, maxLimits))
			return
		}
		var (
			key, value    string
			rl, children  *yaml.Node
			shadow, keyed bool
		)
		if !f.fields(v, field, envoyDescriptorFields, func(k, field string, v *yaml.Node) {
			switch k {
			case "key":
				key, keyed = f.str(v, field)
			case "value":
				value, _ = f.str(v, field)
			case "rate_limit":
				rl = v
			case "shadow_mode":
				shadow = f.bool(v, field)
			case "detailed_metric":
				f.bool(v, field)
			case "descriptors":
				children = v
			}
		}) {
			return
		}
		e := Entry{Key: key, Value: cmp.Or(value, Wildcard)}
		switch line, dup := seen[e]; {
		case key == "" && keyed:
			f.report(field+".key", "empty key")
		case key == "":
			f.report(field+".key", "missing, want the descriptor's key such as remote_address")
		case slices.ContainsFunc(parent, func(p Entry) bool { return p.Key == key }):
			f.report(field+".key", fmt.Sprintf("repeats key %q of an enclosing descriptor, which allot does not support", key))
		case dup:
			f.report(field, fmt.Sprintf("same key and value as the descriptor at line %d", line))
		default:
			seen[e] = v.Line
			m := append(slices.Clip(parent), e)
			s := strings.TrimPrefix(stat+"."+key, ".")
			if value != "" {
				s += "_" + value
			}
			if rl != nil {
				f.rateLimit(rl, field+".rate_limit", m, shadow, s)
			} else {
				f.add(envoyLimit{Limit: &Limit{Match: m, Unlimited: true}, path: field, stat: s, bare: true})
			}
			switch {
			case children == nil || isNull(children) || children.Kind == yaml.SequenceNode && len(children.Content) == 0:
			case depth >= maxDepth:
				f.report(field+".descriptors", fmt.Sprintf("nested more than %d levels deep, want at most %d levels of descriptors", maxDepth, maxDepth))
			default:
				f.descriptors(children, field+".descriptors", m, s, depth+1)
			}
		}
	})
}

// rateLimit reads a descriptor's rate_limit into a limit matching m.
func (f *envoyFile) rateLimit(n *yaml.Node, path string, m Match, shadow bool, stat string) {
	errs := len(f.errs)
	l := &Limit{Match: m, Shadow: shadow}
	unit, amount, mult := -1, int64(0), int64(1)
	if !f.fields(n, path, envoyRateLimitFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "unit":
			unit = f.unit(v, field)
		case "requests_per_unit":
			amount = f.int(v, field)
		case "unit_multiplier":
			mult = f.int(v, field)
		case "name":
			l.Name, _ = f.str(v, field)
		case "unlimited":
			l.Unlimited = f.bool(v, field)
		case "replaces":
			f.list(v, field, func(field string, v *yaml.Node) {
				var r string
				f.fields(v, field, envoyReplacesFields, func(_, field string, v *yaml.Node) { r, _ = f.str(v, field) })
				switch {
				case r == "":
					f.report(field+".name", "missing, want the name of a limit to replace")
				case r == l.Name:
					f.report(field+".name", "names its own limit")
				default:
					l.Replaces = append(l.Replaces, r)
					f.replaces = append(f.replaces, envoyRef{r, field + ".name"})
				}
			})
		}
	}) {
		return
	}
	switch {
	case l.Unlimited && f.has(path+".unit"):
		f.report(path+".unit", "does not apply with unlimited: true, remove it")
	case l.Unlimited:
	case !f.has(path + ".unit"):
		f.report(path+".unit", "missing, want one of "+envoyUnitNames)
	case unit < 0: // reported
	case !f.has(path + ".requests_per_unit"):
		f.report(path+".requests_per_unit", fmt.Sprintf("missing, want an integer in [1, %d]", math.MaxUint32))
	case amount < 1 || amount > math.MaxUint32:
		f.report(path+".requests_per_unit", fmt.Sprintf(
			"want an integer in [1, %d], got %d (allot has no limit of 0: deny such requests in Envoy instead)", math.MaxUint32, amount))
	default:
		u := envoyUnits[unit]
		if most := int64(maxPeriod / u.d); mult < 1 || mult > most {
			f.report(path+".unit_multiplier", fmt.Sprintf("want an integer in [1, %d] (a period of at most 366 days), got %d", most, mult))
			break
		}
		l.Rate = Rate{Amount: amount, Period: time.Duration(mult) * u.d}
		l.Burst = amount
	}
	if len(f.errs) == errs {
		f.add(envoyLimit{Limit: l, path: path, stat: stat})
	}
}

// unit returns the index of n's unit in envoyUnits (in any case, as Envoy
// reads it), or -1 after reporting the problem.
func (f *envoyFile) unit(n *yaml.Node, field string) int {
	s, ok := f.str(n, field)
	for i, u := range envoyUnits {
		if strings.EqualFold(u.name, s) {
			return i
		}
	}
	if ok {
		f.errorf(n.Line, field, "unknown value %q, want one of %s", s, envoyUnitNames)
	}
	return -1
}

// add appends l with sliding_window and the loader's defaults.
func (f *envoyFile) add(l envoyLimit) {
	l.Algorithm, l.SyncInterval, l.StaleAfter = SlidingWindow, DefaultSyncInterval, 3*DefaultSyncInterval
	f.limits = append(f.limits, l)
}

// shadows reports whether m, a descriptor without rate_limit, is more
// specific than a limit that matches every descriptor m matches: Envoy's
// service gives those descriptors no limit, allot's matching would give
// them that one.
func (f *envoyFile) shadows(m Match) bool {
	return slices.ContainsFunc(f.limits, func(g envoyLimit) bool {
		return !g.Unlimited && covers(g.Match, m) && moreSpecific(m, g.Match)
	})
}

// covers reports whether general matches every descriptor that m matches,
// entry by entry.
func covers(general, m Match) bool {
	if len(general) != len(m) {
		return false
	}
	for i, g := range general {
		if g.Key != m[i].Key {
			return false
		}
		if prefix, ok := strings.CutSuffix(m[i].Value, "*"); ok {
			gp, gok := strings.CutSuffix(g.Value, "*")
			if !gok || !strings.HasPrefix(prefix, gp) {
				return false
			}
		} else if !MatchValue(g.Value, m[i].Value) {
			return false
		}
	}
	return true
}

// moreSpecific reports whether a wins over b, of the same length, for
// Envoy: at the first entry where they differ in kind, an exact value
// beats a prefix, which beats any value.
func moreSpecific(a, b Match) bool {
	rank := func(v string) int {
		switch {
		case v == Wildcard:
			return 0
		case strings.HasSuffix(v, "*"):
			return 1
		}
		return 2
	}
	for i := range a {
		if ra, rb := rank(a[i].Value), rank(b[i].Value); ra != rb {
			return ra > rb
		}
	}
	return false
}

// envoyName makes stat a limit name: lower case, with "-" for the bytes
// that names may not hold, and a hash of m appended when that changed
// stat, when it is too long or when it is taken.
func envoyName(stat string, m Match, taken map[string]bool) string {
	b := []byte(strings.ToLower(stat))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	name := string(b)
	if name == stat && validName(name) && !taken[name] {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(m.String()))
	sum := fmt.Sprintf("%08x", h.Sum32())
	if base := strings.Trim(name[:min(len(name), maxNameLen-len(sum)-1)], "_.-"); base != "" {
		return base + "-" + sum
	}
	return sum
}
