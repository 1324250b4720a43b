package sim

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"go.yaml.in/yaml/v3"
)

// ErrScenario is returned by Load and Parse for a scenario file that
// cannot be run; the message names the file and the field.
var ErrScenario = errors.New("sim: bad scenario")

// Scenario is one simulation: a domain's configuration, its regions and
// links to the coordinator, traffic, faults and assertions. Zero
// durations take the defaults documented on each field.
type Scenario struct {
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Seed        uint64        `yaml:"seed"`
	Duration    time.Duration `yaml:"duration"`
	// Warmup is excluded from false rejects and utilisation (not from
	// overshoot, which must be 0 throughout).
	Warmup time.Duration `yaml:"warmup"`
	// Config is the allot configuration (one domain), inline.
	Config string `yaml:"config"`
	// Limit names the limit measured (default: the domain's first).
	Limit string `yaml:"limit"`
	// Watch is the key whose shares and admitted per window the report
	// tabulates and plots (default "k0", the hottest).
	Watch string `yaml:"watch"`
	// ReportEvery is how often a region reports demand (default 1 s).
	ReportEvery time.Duration `yaml:"report_every"`
	// Tick is how often the coordinator's Tick runs (default 250 ms).
	Tick time.Duration `yaml:"tick"`
	// Period and HalfLife configure the coordinator (defaults: its own).
	Period   time.Duration `yaml:"period"`
	HalfLife time.Duration `yaml:"half_life"`
	// Link is the default link of every region to the coordinator;
	// PeerLink, between every two regions (default: Link).
	Link     Link `yaml:"link"`
	PeerLink Link `yaml:"peer_link"`
	// SyncTick is how often a region sends shared-mode deltas, heartbeats
	// and loan asks to its peers (default 25 ms).
	SyncTick time.Duration `yaml:"sync_tick"`
	// Peers makes regions sync with their peers in split mode too, so
	// that they borrow (always on in shared mode). LendTimeout is how long
	// a borrower waits for a grant (default 1 s).
	Peers       bool          `yaml:"peers"`
	LendTimeout time.Duration `yaml:"lend_timeout"`
	Regions     []Region      `yaml:"regions"`
	Traffic     []Traffic     `yaml:"traffic"`
	Faults      []Fault       `yaml:"faults"`
	Asserts     []Assert      `yaml:"assert"`
}

// Region is one region of the domain (every region of the config must be
// listed).
type Region struct {
	Name string `yaml:"name"`
	// Instances only shape the naive baseline (one engine per instance,
	// each enforcing global ÷ instances): allot's region is simulated as
	// one engine, as with leased or exact enforcement.
	Instances int   `yaml:"instances"`
	Link      *Link `yaml:"link"` // default: Scenario.Link
}

// Link is a region's path to the coordinator, the same both ways: a
// message takes RTT/2 plus a uniform jitter in [0, Jitter) (so messages
// reorder), is lost with probability Loss and doubled with probability Dup.
type Link struct {
	RTT    time.Duration `yaml:"rtt"`
	Jitter time.Duration `yaml:"jitter"`
	Loss   float64       `yaml:"loss"`
	Dup    float64       `yaml:"dup"`
}

// Traffic is a Poisson stream of requests at Rate per second into Region
// from From until Until (default: the end). Keys > 1 draws each request's
// key from a Zipf distribution of exponent Zipf (default 1.1) over Keys
// keys; the key is the value of descriptor entry Entry (default "user"):
// "k0" (the hottest), "k1", ….
type Traffic struct {
	Region string  `yaml:"region"`
	Rate   float64 `yaml:"rate"`
	// Reach is how many of the region's instances the traffic reaches,
	// chosen uniformly per request (default all); it matters only to the
	// naive baseline, whose instances enforce global ÷ instances each.
	Reach int           `yaml:"reach"`
	From  time.Duration `yaml:"from"`
	Until time.Duration `yaml:"until"`
	Keys  int           `yaml:"keys"`
	Zipf  float64       `yaml:"zipf"`
	Entry string        `yaml:"entry"`
	Cost  int64         `yaml:"cost"`
}

// Fault is "partition" (Region cut from the coordinator and its peers,
// both ways, messages in flight included, from At for For) or "failover" (the
// coordinator stops at At; For later a new one starts from the persisted
// snapshot with a higher term).
type Fault struct {
	Kind   string        `yaml:"kind"`
	Region string        `yaml:"region"`
	At     time.Duration `yaml:"at"`
	For    time.Duration `yaml:"for"`
}

// Assert is one check of a system's figures ("allot" by default):
//
//	never_above_limit        split mode: no window's global admitted above L
//	overshoot_max_pct        no window's global admitted above L by more than Value %
//	false_rejects_max_pct    false rejects ≤ Value % of requests
//	utilization_min_pct      admitted ≥ Value % of what one global limiter admits
//	utilization_max_pct      admitted ≤ Value % of it (to pin down a baseline's weakness)
//	shares_sum_max           Σ over regions of the shares in force of a key ≤ Value
//	                         at every share change (1 + rounding: 1.000001)
//	converge_within_periods  after every demand shift, shares within 5% of
//	                         ideal within Value rebalance periods
//
// Known, if set, says why the assertion is known to fail (a bug found by
// the simulator and not fixed yet): it is reported, and TestScenarios
// fails only if it starts to pass, so that the marker is removed.
type Assert struct {
	Check  string  `yaml:"check" json:"check"`
	Value  float64 `yaml:"value" json:"value"`
	System string  `yaml:"system" json:"system"`
	Known  string  `yaml:"known" json:"known,omitempty"`
}

var checks = []string{"never_above_limit", "overshoot_max_pct", "false_rejects_max_pct", "utilization_min_pct", "utilization_max_pct", "converge_within_periods", "shares_sum_max"}

// Load reads and validates a scenario file.
func Load(path string) (*Scenario, *allot.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	return Parse(path, data)
}

// Parse validates a scenario, applies its defaults and parses its allot
// configuration; name is used in errors.
func Parse(name string, data []byte) (*Scenario, *allot.Config, error) {
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrScenario, name, err)
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s: %s", ErrScenario, name, field, fmt.Sprintf(format, args...))
	}
	cfg, err := allot.ParseConfig(name+": config", []byte(s.Config))
	if err != nil {
		return nil, nil, err
	}
	if len(cfg.Domains) != 1 {
		return nil, nil, bad("config", "want one domain, got %d", len(cfg.Domains))
	}
	d := cfg.Domains[0]
	if s.Limit == "" && len(d.Limits) > 0 {
		s.Limit = d.Limits[0].Name
	}
	l := d.Limit(s.Limit)
	switch {
	case l == nil:
		return nil, nil, bad("limit", "no limit %q in the config", s.Limit)
	case s.Duration <= 0:
		return nil, nil, bad("duration", "want a positive duration")
	}
	s.ReportEvery = cmp.Or(s.ReportEvery, time.Second)
	s.Watch = cmp.Or(s.Watch, "k0")
	s.Tick = cmp.Or(s.Tick, 250*time.Millisecond)
	s.SyncTick = cmp.Or(s.SyncTick, 25*time.Millisecond)
	s.LendTimeout = cmp.Or(s.LendTimeout, time.Second)
	s.PeerLink = cmp.Or(s.PeerLink, s.Link)
	if len(s.Regions) != len(d.Regions) {
		return nil, nil, bad("regions", "want the config's regions %v", d.Regions)
	}
	for i := range s.Regions {
		r := &s.Regions[i]
		if !slices.Contains(d.Regions, r.Name) {
			return nil, nil, bad("regions", "%q is not a region of the config %v", r.Name, d.Regions)
		}
		r.Instances = max(r.Instances, 1)
		if r.Link == nil {
			r.Link = &s.Link
		}
	}
	for i := range s.Traffic {
		t := &s.Traffic[i]
		switch {
		case !slices.Contains(d.Regions, t.Region):
			return nil, nil, bad(fmt.Sprintf("traffic[%d].region", i), "unknown region %q", t.Region)
		case t.Rate <= 0:
			return nil, nil, bad(fmt.Sprintf("traffic[%d].rate", i), "want a positive rate per second")
		}
		if t.Until <= 0 || t.Until > s.Duration {
			t.Until = s.Duration
		}
		t.Keys, t.Cost = max(t.Keys, 1), max(t.Cost, 1)
		if t.Zipf <= 1 {
			t.Zipf = 1.1
		}
		if t.Entry == "" {
			t.Entry = "user"
		}
	}
	for i, f := range s.Faults {
		switch {
		case f.Kind != "partition" && f.Kind != "failover":
			return nil, nil, bad(fmt.Sprintf("faults[%d].kind", i), "want partition or failover, got %q", f.Kind)
		case f.Kind == "partition" && !slices.Contains(d.Regions, f.Region):
			return nil, nil, bad(fmt.Sprintf("faults[%d].region", i), "unknown region %q", f.Region)
		case f.For <= 0:
			return nil, nil, bad(fmt.Sprintf("faults[%d].for", i), "want a positive duration")
		}
	}
	for i := range s.Asserts {
		a := &s.Asserts[i]
		if !slices.Contains(checks, a.Check) {
			return nil, nil, bad(fmt.Sprintf("assert[%d].check", i), "want one of %v, got %q", checks, a.Check)
		}
		if a.System == "" {
			a.System = Allot
		}
		if !slices.Contains(systems(l), a.System) {
			return nil, nil, bad(fmt.Sprintf("assert[%d].system", i), "want one of %v", systems(l))
		}
	}
	return &s, cfg, nil
}
