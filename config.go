package allot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ErrConfig is wrapped by every error of ParseConfig, LoadConfigFile (except
// failures to read the file) and Domain.Validate.
var ErrConfig = errors.New("allot: invalid config")

// DefaultSyncInterval is a limit's sync_interval when the file gives none.
const DefaultSyncInterval = 250 * time.Millisecond

// Bounds of limit configuration.
const (
	maxNameLen      = 64
	maxMultiplier   = 1_000_000
	maxConcurrency  = 1_000_000
	minSyncInterval = 10 * time.Millisecond
	maxSyncInterval = time.Minute
	minSyncPeriods  = 4 // a shared limit's period spans at least this many sync intervals
	maxStaleAfter   = time.Hour
)

// Bounds of a configuration's size (docs/security.md, Bounds). Real files
// stay far below them; they make a hostile file fail fast, before work
// that grows with depth × size. A match counts the entries it inherits.
const (
	maxDepth        = 16     // levels of nested limits (or Envoy descriptors), the top one included
	maxLimits       = 10_000 // limits of a domain, nested ones included
	maxMatchEntries = 32     // entries of one match
	maxKeyLen       = 256    // bytes of a match key
	maxValueLen     = 1024   // bytes of a match value
	maxConfigBytes  = 16 << 20
	// maxFlowNesting bounds [ and { nesting, which YAML's decoder takes
	// time to read that grows with depth × size; four per level of limits
	// (a list, a limit, a match) leave room.
	maxFlowNesting = 4 * maxDepth
)

// ConfigError is one problem of a configuration: the file, the line (0 if
// unknown), the field path (limits[0].limits[1].burst; empty for problems
// of a whole document) and what was expected.
type ConfigError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error formats e as "FILE:LINE: FIELD: MSG", leaving out the parts that
// are unknown.
func (e *ConfigError) Error() string {
	var parts []string
	switch {
	case e.Line > 0 && e.File != "":
		parts = append(parts, e.File+":"+strconv.Itoa(e.Line))
	case e.Line > 0:
		parts = append(parts, "line "+strconv.Itoa(e.Line))
	case e.File != "":
		parts = append(parts, e.File)
	}
	if e.Field != "" {
		parts = append(parts, e.Field)
	}
	return strings.Join(append(parts, e.Msg), ": ")
}

// Unwrap returns ErrConfig.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// ConfigErrors is every problem found in a configuration, sorted by line.
// errors.Is(err, ErrConfig) and errors.As(err, new(*ConfigError)) see
// through it.
type ConfigErrors []*ConfigError

// Error returns the errors one a line.
func (es ConfigErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the errors.
func (es ConfigErrors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// Config is a parsed, validated set of domains. It is read-only after
// loading and then safe for concurrent use.
type Config struct {
	Source  string    // file name it was loaded from ("" if built in code)
	Domains []*Domain // in file order
}

// Domain is one key space's limits, plans and overrides. A loaded Domain
// is read-only and safe for concurrent use. A Domain built in code must
// pass Validate, which also indexes it for Effective, before it is used;
// after that it must not be changed.
type Domain struct {
	Name        string
	Regions     []string // declared regions; floors may only name these
	Plans       map[string]Plan
	Assignments []PlanAssignment // which requests are on which plan
	// Limits holds every limit, nested ones included, in file order with
	// each parent before its children.
	Limits    []*Limit
	Overrides []Override
	// EnvoyPaths makes matching follow Envoy's rate limit service, for
	// domains read from its configuration files: a limit applies to a
	// descriptor whose entries are exactly its match, in order, and each
	// descriptor gets only its most specific limit.
	EnvoyPaths bool
	// AllowRefunds (allow_refunds: true) admits, from callers with the
	// refund role only, Envoy's negative hits (is_negative_hits) and
	// per-request limit overrides: both give a key more than its limit
	// would. Off by default: the enforcer refuses them with
	// PERMISSION_DENIED (docs/security.md, "Roles").
	AllowRefunds bool

	idx *index // set by Validate; used by Effective
}

// Domain returns the domain called name, or nil.
func (c *Config) Domain(name string) *Domain {
	for _, d := range c.Domains {
		if d.Name == name {
			return d
		}
	}
	return nil
}

// Limit returns the limit called name, or nil. It scans d.Limits.
func (d *Domain) Limit(name string) *Limit {
	for _, l := range d.Limits {
		if l.Name == name {
			return l
		}
	}
	return nil
}

// Validate checks d as the loader does, without line numbers, and returns
// ConfigErrors if anything is wrong. It applies no defaults. On success it
// indexes d for Effective. It writes d, so it must not run concurrently
// with other methods of d.
func (d *Domain) Validate() error {
	var errs ConfigErrors
	d.check(nil, func(field, msg string) {
		errs = append(errs, &ConfigError{Field: field, Msg: msg})
	})
	if len(errs) > 0 {
		return errs
	}
	d.index()
	return nil
}

// LoadConfigFile reads and parses the configuration file at path.
func LoadConfigFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("allot: load config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig parses data, one YAML document per domain, applies defaults
// and validates the result. name is the file name used in errors. On
// failure it returns ConfigErrors holding every problem found.
func ParseConfig(name string, data []byte) (*Config, error) {
	p := &loader{file: name}
	if len(data) > maxConfigBytes {
		p.errorf(0, "", "%d bytes, want at most %d (16 MiB)", len(data), maxConfigBytes)
		return nil, p.errs
	}
	if line, ok := flowNesting(data, maxFlowNesting); !ok {
		p.errorf(line, "", "[ and { nested more than %d levels deep, want at most %d levels of limits or descriptors", maxFlowNesting, maxDepth)
		return nil, p.errs
	}
	cfg := &Config{Source: name}
	first := map[string]int{} // domain name → line
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if err == io.EOF {
			break
		}
		if err != nil {
			p.yamlError(err)
			break
		}
		read := p.domain
		if isEnvoyDocument(&doc) {
			read = p.envoyDomain // written for Envoy's rate limit service
		}
		d := read(&doc)
		if d == nil {
			continue
		}
		if line, dup := first[d.Name]; dup && d.Name != "" {
			p.errorf(p.lines["domain"], "domain", "duplicate domain %q, first defined at line %d", d.Name, line)
		} else {
			first[d.Name] = p.lines["domain"]
		}
		cfg.Domains = append(cfg.Domains, d)
	}
	if len(p.errs) == 0 && len(cfg.Domains) == 0 {
		p.errorf(0, "", "empty file, want one YAML document per domain")
	}
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b *ConfigError) int { return a.Line - b.Line })
		return nil, p.errs
	}
	return cfg, nil
}

// flowNesting reports whether YAML data nests flow collections ([ and {)
// at most most deep, and if not the line where it goes deeper, so that
// ParseConfig refuses a hostile file before decoding it. It skips comments
// and quoted scalars; a bracket inside a plain scalar counts too, which
// only a file with that many of them in a row could notice.
func flowNesting(data []byte, most int) (line int, ok bool) {
	depth, line := 0, 1
	for i := 0; i < len(data); i++ {
		c := data[i]
		atToken := i == 0 || strings.IndexByte(" \t\n\r[{,:", data[i-1]) >= 0
		switch {
		case c == '\n':
			line++
		case c == '#' && atToken:
			for i+1 < len(data) && data[i+1] != '\n' {
				i++
			}
		case (c == '"' || c == '\'') && atToken:
			for i++; i < len(data) && data[i] != c; i++ {
				switch {
				case data[i] == '\n':
					line++
				case c == '"' && data[i] == '\\':
					i++
				}
			}
		case c == '[' || c == '{':
			if depth++; depth > most {
				return line, false
			}
		case c == ']' || c == '}':
			depth = max(depth-1, 0)
		}
	}
	return 0, true
}

var (
	domainFields   = []string{"domain", "regions", "plans", "assign", "limits", "overrides", "allow_refunds"}
	planFields     = []string{"multiplier", "floors"}
	assignFields   = []string{"match", "plan"}
	overrideFields = []string{"limit", "match", "rate", "multiplier", "expires"}
	limitFields    = []string{"name", "match", "unit", "rate", "burst", "algorithm", "mode", "enforcement",
		"floors", "on_failure", "shadow", "concurrency", "sync_interval", "stale_after", "limits"}
)

// loader turns YAML nodes into domains and collects every problem. Type
// and syntax problems are found while reading; everything else by
// Domain.check, whose reports get their line from the field path.
type loader struct {
	file string
	errs ConfigErrors
	// Per document:
	doc   int            // index in errs of its first error
	lines map[string]int // field path → line where it starts
	paths []string       // field path of each limit, parallel to Domain.Limits
}

func (p *loader) errorf(line int, field, format string, args ...any) {
	p.errs = append(p.errs, &ConfigError{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// report records a problem of field, at the line of field or of its closest
// parent, unless the document already has an error on field or on a parent
// of it: one mistake gives one error.
func (p *loader) report(field, msg string) {
	for _, e := range p.errs[p.doc:] {
		if within(field, e.Field) {
			return
		}
	}
	f := field
	for _, ok := p.lines[f]; !ok && f != ""; _, ok = p.lines[f] {
		f = f[:max(strings.LastIndexAny(f, ".["), 0)]
	}
	p.errorf(p.lines[f], field, "%s", msg)
}

// within reports whether field is path or inside it: limits[0].rate is
// within limits[0], limits and "" (the document).
func within(field, path string) bool {
	return path == "" || field == path ||
		strings.HasPrefix(field, path) && strings.ContainsRune(".[", rune(field[len(path)]))
}

func (p *loader) has(field string) bool {
	_, ok := p.lines[field]
	return ok
}

func (p *loader) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				line, msg = v, after
			}
		}
	}
	p.errorf(line, "", "malformed YAML: %s", msg)
}

// domain reads one document; it returns nil if the document is not a mapping.
func (p *loader) domain(doc *yaml.Node) *Domain {
	p.doc, p.lines, p.paths = len(p.errs), map[string]int{}, nil
	root := doc.Content[0]
	p.lines[""] = root.Line
	if root.Kind != yaml.MappingNode {
		if isNull(root) {
			p.errorf(root.Line, "", "empty document, want a mapping with a domain")
		} else {
			p.errorf(root.Line, "", "want a mapping with a domain, got %s", describe(root))
		}
		return nil
	}
	d := &Domain{}
	p.fields(root, "", domainFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "domain":
			d.Name, _ = p.str(v, field)
		case "regions":
			p.list(v, field, func(field string, v *yaml.Node) {
				r, _ := p.str(v, field)
				d.Regions = append(d.Regions, r)
			})
		case "plans":
			d.Plans = map[string]Plan{}
			p.fields(v, field, nil, func(name, field string, v *yaml.Node) {
				d.Plans[name] = p.plan(v, field, name)
			})
		case "assign":
			p.list(v, field, func(field string, v *yaml.Node) {
				d.Assignments = append(d.Assignments, p.assignment(v, field))
			})
		case "limits":
			p.list(v, field, func(field string, v *yaml.Node) { p.limit(v, field, nil, d, 1) })
		case "overrides":
			p.list(v, field, func(field string, v *yaml.Node) {
				d.Overrides = append(d.Overrides, p.override(v, field))
			})
		case "allow_refunds":
			d.AllowRefunds = p.bool(v, field)
		}
	})
	d.check(p.paths, p.report)
	if len(p.errs) == p.doc {
		d.index()
	}
	return d
}

func (p *loader) plan(n *yaml.Node, path, name string) Plan {
	pl := Plan{Name: name}
	if p.fields(n, path, planFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "multiplier":
			pl.Multiplier = p.float(v, field)
		case "floors":
			pl.Floors = map[string]Rate{}
			p.fields(v, field, nil, func(limit, field string, v *yaml.Node) { pl.Floors[limit] = p.rate(v, field) })
		}
	}) && !p.has(path+".multiplier") {
		p.report(path+".multiplier", fmt.Sprintf("missing, want a number in (0, %d]", maxMultiplier))
	}
	return pl
}

func (p *loader) assignment(n *yaml.Node, path string) PlanAssignment {
	var a PlanAssignment
	p.fields(n, path, assignFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "match":
			a.Match = p.match(v, field, nil)
		case "plan":
			a.Plan, _ = p.str(v, field)
		}
	})
	return a
}

func (p *loader) override(n *yaml.Node, path string) Override {
	var o Override
	if !p.fields(n, path, overrideFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "limit":
			o.Limit, _ = p.str(v, field)
		case "match":
			o.Match = p.match(v, field, nil)
		case "rate":
			o.Rate = p.rate(v, field)
		case "multiplier":
			o.Multiplier = p.float(v, field)
		case "expires":
			o.Expires = p.time(v, field)
		}
	}) {
		return o
	}
	switch rate, mult := p.has(path+".rate"), p.has(path+".multiplier"); {
	case !rate && !mult:
		p.report(path, "want exactly one of rate and multiplier, got neither")
	case rate && mult:
		p.report(path, "want exactly one of rate and multiplier, got both")
	}
	return o
}

// limit reads the limit at path and its children and appends them to
// d.Limits. parent is the parent limit's match, which prefixes this one's;
// depth is the limit's level, 1 at the top. It reads no limit beyond
// maxLimits and no level beyond maxDepth.
func (p *loader) limit(n *yaml.Node, path string, parent Match, d *Domain, depth int) {
	if len(d.Limits) >= maxLimits {
		p.report("limits", fmt.Sprintf("more than %d limits, want at most %d in a domain", maxLimits, maxLimits))
		return
	}
	l := &Limit{Match: parent, SyncInterval: DefaultSyncInterval}
	d.Limits = append(d.Limits, l)
	p.paths = append(p.paths, path)
	var children *yaml.Node
	if !p.fields(n, path, limitFields, func(key, field string, v *yaml.Node) {
		switch key {
		case "name":
			l.Name, _ = p.str(v, field)
		case "match":
			l.Match = append(slices.Clip(parent), p.match(v, field, parent)...)
		case "unit":
			l.Unit = Unit(p.enum(v, field, unitNames))
		case "rate":
			l.Rate = p.rate(v, field)
		case "burst":
			l.Burst = p.int(v, field)
		case "algorithm":
			l.Algorithm = Algorithm(p.enum(v, field, algorithmNames))
		case "mode":
			l.Mode = Mode(p.enum(v, field, modeNames))
		case "enforcement":
			l.Enforcement = Enforcement(p.enum(v, field, enforceNames))
		case "floors":
			l.Floors = map[string]float64{}
			p.fields(v, field, nil, func(region, field string, v *yaml.Node) { l.Floors[region] = p.float(v, field) })
		case "on_failure":
			l.OnFailure = FailurePolicy(p.enum(v, field, failureNames))
		case "shadow":
			l.Shadow = p.bool(v, field)
		case "concurrency":
			l.Concurrency = p.int(v, field)
		case "sync_interval":
			l.SyncInterval = p.duration(v, field)
		case "stale_after":
			l.StaleAfter = p.duration(v, field)
		case "limits":
			children = v
		}
	}) {
		return
	}
	switch {
	case !p.has(path + ".burst"):
		l.Burst = l.Rate.Amount
	case l.Algorithm == SlidingWindow:
		p.report(path+".burst", "does not apply to sliding_window, remove it")
	}
	if !p.has(path + ".stale_after") {
		l.StaleAfter = 3 * l.SyncInterval
	}
	switch {
	case children == nil || isNull(children) || children.Kind == yaml.SequenceNode && len(children.Content) == 0:
	case depth >= maxDepth:
		p.report(path+".limits", fmt.Sprintf("nested more than %d levels deep, want at most %d levels of limits", maxDepth, maxDepth))
	default:
		p.list(children, path+".limits", func(field string, v *yaml.Node) { p.limit(v, field, l.Match, d, depth+1) })
	}
}

// match reads a match mapping, leaving out (and reporting) bad entries.
func (p *loader) match(n *yaml.Node, path string, parent Match) Match {
	var m Match
	if n.Kind == yaml.MappingNode && len(parent)+len(n.Content)/2 > maxMatchEntries {
		p.errorf(n.Line, path, "%d entries%s, want at most %d", len(parent)+len(n.Content)/2, inheritedNote(parent), maxMatchEntries)
		return nil
	}
	p.fields(n, path, nil, func(key, field string, v *yaml.Node) {
		val, ok := p.str(v, field)
		switch _, inherited := Descriptor(parent).Get(key); {
		case !ok:
		case key == "":
			p.errorf(v.Line, path, "empty key")
		case len(key) > maxKeyLen:
			p.errorf(v.Line, path, "key of %d bytes, want at most %d", len(key), maxKeyLen)
		case val == "":
			p.errorf(v.Line, field, `empty value, want a value, "*" or a prefix ending in "*"`)
		case len(val) > maxValueLen:
			p.errorf(v.Line, field, "value of %d bytes, want at most %d", len(val), maxValueLen)
		case inherited:
			p.errorf(v.Line, field, "repeats key %q of its parent limit", key)
		default:
			m = append(m, Entry{Key: key, Value: val})
		}
	})
	return m
}

// fields calls fn for each entry of mapping n (null counts as empty). Keys
// must be unique and, if allowed is not nil, one of allowed. It reports
// false if n is not a mapping.
func (p *loader) fields(n *yaml.Node, path string, allowed []string, fn func(key, field string, v *yaml.Node)) bool {
	if isNull(n) {
		return true
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, path, "want a mapping, got %s", describe(n))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := text(k)
		field := key
		if path != "" {
			field = path + "." + key
		}
		switch line, dup := seen[key]; {
		case k.Kind != yaml.ScalarNode:
			p.errorf(k.Line, path, "want a string key, got %s", describe(k))
		case allowed != nil && !slices.Contains(allowed, key):
			p.errorf(k.Line, field, "unknown field, want one of %s", strings.Join(allowed, ", "))
		case dup:
			p.errorf(k.Line, field, "duplicate key, first at line %d", line)
		default:
			seen[key] = k.Line
			p.lines[field] = k.Line
			fn(key, field, v)
		}
	}
	return true
}

// list calls fn for each item of list n (null counts as empty).
func (p *loader) list(n *yaml.Node, path string, fn func(field string, v *yaml.Node)) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n.Line, path, "want a list, got %s", describe(n))
		return
	}
	for i, v := range n.Content {
		field := path + "[" + strconv.Itoa(i) + "]"
		p.lines[field] = v.Line
		fn(field, v)
	}
}

func (p *loader) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n.Line, field, "want a string, got %s", describe(n))
		return "", false
	}
	return text(n), true
}

// enum returns the index of n's value in names, or len(names) (which
// Domain.check reports as unknown) after reporting the problem.
func (p *loader) enum(n *yaml.Node, field string, names []string) uint8 {
	s, ok := p.str(n, field)
	if i := slices.Index(names, s); ok && i >= 0 {
		return uint8(i)
	}
	if ok {
		p.errorf(n.Line, field, "unknown value %q, want one of %s", s, strings.Join(names, ", "))
	}
	return uint8(len(names))
}

// scalar decodes n into v if n is a scalar with one of tags, and reports
// "want <what>" otherwise.
func (p *loader) scalar(n *yaml.Node, field, what string, v any, tags ...string) {
	if n.Kind != yaml.ScalarNode || !slices.Contains(tags, n.Tag) || n.Decode(v) != nil {
		p.errorf(n.Line, field, "want %s, got %s", what, describe(n))
	}
}

func (p *loader) int(n *yaml.Node, field string) (v int64) {
	p.scalar(n, field, "an integer", &v, "!!int")
	return v
}

func (p *loader) float(n *yaml.Node, field string) (v float64) {
	p.scalar(n, field, "a number", &v, "!!int", "!!float")
	return v
}

func (p *loader) bool(n *yaml.Node, field string) (v bool) {
	p.scalar(n, field, "true or false", &v, "!!bool")
	return v
}

// duration reads a duration; time.ParseDuration refuses one that overflows
// int64 nanoseconds, and Limit.check bounds each duration field.
func (p *loader) duration(n *yaml.Node, field string) time.Duration {
	if s, ok := p.str(n, field); ok {
		d, err := time.ParseDuration(s)
		if err == nil {
			return d
		}
		p.errorf(n.Line, field, "want a duration such as 250ms, got %q", s)
	}
	return 0
}

func (p *loader) time(n *yaml.Node, field string) time.Time {
	if s, ok := p.str(n, field); ok {
		t, err := time.Parse(time.RFC3339, s)
		if err == nil {
			return t
		}
		p.errorf(n.Line, field, "want an RFC 3339 time such as 2026-12-01T00:00:00Z, got %q", s)
	}
	return time.Time{}
}

// rate returns an invalid Rate that is not the zero (missing) Rate if n is
// not a rate, so that check reports the same field, which report then
// leaves out.
func (p *loader) rate(n *yaml.Node, field string) Rate {
	if s, ok := p.str(n, field); ok {
		r, err := ParseRate(s)
		if err == nil {
			return r
		}
		p.errorf(n.Line, field, "%s", strings.TrimPrefix(err.Error(), "allot: "))
	}
	return Rate{Amount: -1}
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// text is a scalar's text; null is "".
func text(n *yaml.Node) string {
	if isNull(n) {
		return ""
	}
	return n.Value
}

func describe(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.AliasNode:
		return "an alias (YAML aliases are not supported)"
	case isNull(n):
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

// check reports each problem of d with the field path it concerns. paths[i]
// is the path of d.Limits[i]; nil means limits[i].
func (d *Domain) check(paths []string, report func(field, msg string)) {
	if d.Name == "" {
		report("domain", "missing, want a name such as api")
	} else if !validName(d.Name) {
		report("domain", badName(d.Name))
	}
	for i, r := range d.Regions {
		field := "regions[" + strconv.Itoa(i) + "]"
		switch {
		case r == "":
			report(field, "empty region")
		case slices.Contains(d.Regions[:i], r):
			report(field, fmt.Sprintf("duplicate region %q", r))
		}
	}
	plans := slices.Sorted(maps.Keys(d.Plans))
	for _, name := range plans {
		field := "plans." + name
		if !validName(name) {
			report(field, badName(name))
		}
		checkMultiplier(d.Plans[name].Multiplier, field+".multiplier", report)
	}
	for i, a := range d.Assignments {
		field := "assign[" + strconv.Itoa(i) + "]"
		checkMatch(a.Match, field+".match", report)
		if _, ok := d.Plans[a.Plan]; !ok && len(plans) == 0 {
			report(field+".plan", fmt.Sprintf("unknown plan %q, the domain has no plans", a.Plan))
		} else if !ok {
			report(field+".plan", fmt.Sprintf("unknown plan %q, want one of %s", a.Plan, strings.Join(plans, ", ")))
		}
	}
	if len(d.Limits) > maxLimits {
		report("limits", fmt.Sprintf("%d limits, want at most %d in a domain", len(d.Limits), maxLimits))
	}
	names := map[string]string{} // limit name → path
	for i, l := range d.Limits {
		path := "limits[" + strconv.Itoa(i) + "]"
		if paths != nil {
			path = paths[i]
		}
		l.check(path, d.Regions, report)
		if first, dup := names[l.Name]; dup && l.Name != "" {
			report(path+".name", fmt.Sprintf("duplicate limit name %q, first used by %s", l.Name, first))
		} else {
			names[l.Name] = path
		}
	}
	d.checkPlanFloors(report)
	for i, o := range d.Overrides {
		field := "overrides[" + strconv.Itoa(i) + "]"
		if _, ok := names[o.Limit]; o.Limit != "" && !ok {
			report(field+".limit", fmt.Sprintf("unknown limit %q", o.Limit))
		}
		checkMatch(o.Match, field+".match", report)
		switch {
		case o.Rate != (Rate{}) && o.Multiplier != 0:
			report(field, "want exactly one of rate and multiplier, got both")
		case o.Rate != (Rate{}):
			if err := o.Rate.Validate(); err != nil {
				report(field+".rate", err.Error())
			}
		default:
			checkMultiplier(o.Multiplier, field+".multiplier", report)
		}
	}
}

func (l *Limit) check(path string, regions []string, report func(field, msg string)) {
	switch {
	case l.Name == "":
		report(path+".name", "missing, want a name such as per-user")
	case !validName(l.Name):
		report(path+".name", badName(l.Name))
	}
	checkMatch(l.Match, path+".match", report)
	checkEnum(uint8(l.Unit), unitNames, path+".unit", report)
	checkEnum(uint8(l.Algorithm), algorithmNames, path+".algorithm", report)
	checkEnum(uint8(l.Mode), modeNames, path+".mode", report)
	checkEnum(uint8(l.Enforcement), enforceNames, path+".enforcement", report)
	checkEnum(uint8(l.OnFailure), failureNames, path+".on_failure", report)

	syncOK := l.SyncInterval >= minSyncInterval && l.SyncInterval <= maxSyncInterval
	if !syncOK {
		report(path+".sync_interval", fmt.Sprintf("want a duration in [%v, %v], got %v", minSyncInterval, maxSyncInterval, l.SyncInterval))
	} else if l.StaleAfter < l.SyncInterval {
		report(path+".stale_after", fmt.Sprintf("want at least sync_interval (%v), got %v", l.SyncInterval, l.StaleAfter))
	} else if l.StaleAfter > maxStaleAfter {
		report(path+".stale_after", fmt.Sprintf("want a duration in [sync_interval, %v], got %v", maxStaleAfter, l.StaleAfter))
	}

	if l.Unlimited {
		return // no budget to check
	}
	if l.Rate == (Rate{}) {
		report(path+".rate", "missing, want AMOUNT/PERIOD such as 1000/1m")
	} else if err := l.Rate.Validate(); err != nil {
		report(path+".rate", err.Error())
	} else {
		switch {
		case l.Burst < 1 || l.Burst > MaxAmount:
			report(path+".burst", fmt.Sprintf("want an integer in [1, %d], got %d", int64(MaxAmount), l.Burst))
		case l.Algorithm == SlidingWindow && l.Burst != l.Rate.Amount:
			report(path+".burst", "does not apply to sliding_window, want it equal to the rate's amount")
		}
		if least := minSyncPeriods * l.SyncInterval; syncOK && l.Mode == Shared && l.Rate.Period < least {
			report(path+".rate", fmt.Sprintf("period %v is too short for its sync interval %v in shared mode, want at least %d × sync_interval = %v",
				l.Rate.Period, l.SyncInterval, minSyncPeriods, least))
		}
	}

	if len(l.Floors) > 0 && len(regions) == 0 {
		report(path+".floors", "floors need a regions list in the domain")
	} else if len(l.Floors) > 0 {
		sum, ok := 0.0, true
		for _, r := range slices.Sorted(maps.Keys(l.Floors)) {
			f := l.Floors[r]
			switch {
			case !slices.Contains(regions, r):
				report(path+".floors."+r, fmt.Sprintf("unknown region %q, want one of %s", r, strings.Join(regions, ", ")))
				ok = false
			case !(f >= 0 && f <= 1):
				report(path+".floors."+r, fmt.Sprintf("want a number in [0, 1], got %g", f))
				ok = false
			}
			sum += f
		}
		if ok && sum > 1+1e-9 {
			report(path+".floors", fmt.Sprintf("floors sum to %.6g, want at most 1", sum))
		}
	}

	switch {
	case l.Concurrency < 0 || l.Concurrency > maxConcurrency:
		report(path+".concurrency", fmt.Sprintf("want an integer in [0, %d], got %d", maxConcurrency, l.Concurrency))
	case l.Concurrency > 0 && l.Unit == Requests:
		report(path+".concurrency", "applies only to unit: tokens (it caps in-flight reservations)")
	}
}

func checkMatch(m Match, path string, report func(field, msg string)) {
	if len(m) > maxMatchEntries {
		report(path, fmt.Sprintf("%d entries, want at most %d", len(m), maxMatchEntries))
		return
	}
	for i, e := range m {
		switch {
		case e.Key == "":
			report(path, "empty key")
		case len(e.Key) > maxKeyLen:
			report(path, fmt.Sprintf("key of %d bytes, want at most %d", len(e.Key), maxKeyLen))
		case e.Value == "":
			report(path+"."+e.Key, `empty value, want a value, "*" or a prefix ending in "*"`)
		case len(e.Value) > maxValueLen:
			report(path+"."+e.Key, fmt.Sprintf("value of %d bytes, want at most %d", len(e.Value), maxValueLen))
		case slices.ContainsFunc(m[:i], func(prev Entry) bool { return prev.Key == e.Key }):
			report(path+"."+e.Key, "duplicate key")
		}
	}
}

// inheritedNote says how many of a match's entries come from its parents.
func inheritedNote(parent Match) string {
	if len(parent) == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d inherited)", len(parent))
}

func checkEnum(v uint8, names []string, field string, report func(field, msg string)) {
	if int(v) >= len(names) {
		report(field, fmt.Sprintf("unknown value %d, want one of %s", v, strings.Join(names, ", ")))
	}
}

func checkMultiplier(m float64, field string, report func(field, msg string)) {
	if !(m > 0 && m <= maxMultiplier) {
		report(field, fmt.Sprintf("want a number in (0, %d], got %g", maxMultiplier, m))
	}
}

// validName reports whether s matches [a-z0-9][a-z0-9_.-]* and is at most
// maxNameLen bytes long.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := range len(s) {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

func badName(s string) string {
	return fmt.Sprintf("invalid name %q, want [a-z0-9][a-z0-9_.-]* of at most %d characters", s, maxNameLen)
}
