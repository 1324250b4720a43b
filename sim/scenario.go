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
	// ArrivalTick, when set, groups arrivals: the requests that arrive in
	// (t − ArrivalTick, t] are decided at t, and those of one key at one
	// instance in one engine call of their summed cost (a call that
	// rejects is followed by calls of one request's cost until one
	// rejects, so the outcome is that of deciding them one by one at t).
	// 0 decides every request at its own instant.
	ArrivalTick time.Duration `yaml:"arrival_tick"`
	// EnforcerTick is how often a regional.Enforcer's Tick (membership,
	// expired leases) and regional.Reservations' Tick run (default 250 ms).
	EnforcerTick time.Duration `yaml:"enforcer_tick"`
	// GatewayLeases adds the system "gateways": each region runs one
	// enforcer (engine) and its instances are gateways that decide from
	// leases, as the Go SDK does (regional.GatewayWant, GatewayGrant,
	// GatewayRenew), with one lease round per GatewaySync (default
	// 250 ms). Its store_calls count the gateways' calls to the enforcer:
	// lease rounds that carry anything, and checks of requests no lease
	// covered.
	GatewayLeases bool          `yaml:"gateway_leases"`
	GatewaySync   time.Duration `yaml:"gateway_sync"`
	// Short is the scenario's reduced form, which `go test` runs.
	Short   *Short    `yaml:"short"`
	Regions []Region  `yaml:"regions"`
	Traffic []Traffic `yaml:"traffic"`
	Faults  []Fault   `yaml:"faults"`
	Asserts []Assert  `yaml:"assert"`
}

// Short is what `go test` changes in a scenario to keep it fast; zero
// fields change nothing.
type Short struct {
	Duration time.Duration `yaml:"duration"`
	// RateScale multiplies every traffic rate.
	RateScale float64 `yaml:"rate_scale"`
	// Keys and Instances cap every traffic's keys and every region's
	// instances.
	Keys      int `yaml:"keys"`
	Instances int `yaml:"instances"`
}

// Region is one region of the domain (every region of the config must be
// listed).
type Region struct {
	Name string `yaml:"name"`
	// Instances is how many enforcer instances the region runs (default
	// 1), each with an engine and a regional/node.Node of its own: with
	// split-mode local enforcement each enforces the region's share × its
	// weight; with leased or exact enforcement each is a
	// regional.Enforcer sharing the region's store; in shared mode they
	// sum their counts in the region's CountStore.
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
// "k0" (the hottest), "k1", …. Every stream draws from a random source
// of its own, so arrivals are the same in every system.
//
// Shape varies the rate over time (a Poisson process thinned at Rate's
// peak): "diurnal" is Rate × (1 + Amplitude × sin(2π (t − From + Phase) /
// Period)), "burst" is Rate for the first On of every Period and 0 for
// the rest.
type Traffic struct {
	Region string  `yaml:"region"`
	Rate   float64 `yaml:"rate"`
	// Reach is how many of the region's instances the traffic reaches,
	// chosen uniformly per request (default all).
	Reach     int           `yaml:"reach"`
	From      time.Duration `yaml:"from"`
	Until     time.Duration `yaml:"until"`
	Keys      int           `yaml:"keys"`
	Zipf      float64       `yaml:"zipf"`
	Entry     string        `yaml:"entry"`
	Cost      int64         `yaml:"cost"`
	Shape     string        `yaml:"shape"`
	Period    time.Duration `yaml:"period"`
	Amplitude float64       `yaml:"amplitude"`
	Phase     time.Duration `yaml:"phase"`
	On        time.Duration `yaml:"on"`
	// LLM makes every request an LLM call on a limit of unit tokens.
	LLM *LLM `yaml:"llm"`
}

// LLM describes the calls of a traffic stream: prompt tokens uniform in
// [PromptMin, PromptMax], output tokens log-normal with median
// OutputMedian and shape OutputSigma, at most MaxTokens, streamed at
// TokensPerS after Latency. The call's real cost is prompt + output; a
// system learns it only when the call ends (Settle).
type LLM struct {
	PromptMin    int64         `yaml:"prompt_min"`
	PromptMax    int64         `yaml:"prompt_max"`
	OutputMedian float64       `yaml:"output_median"`
	OutputSigma  float64       `yaml:"output_sigma"`
	MaxTokens    int64         `yaml:"max_tokens"`
	TokensPerS   float64       `yaml:"tokens_per_s"`
	Latency      time.Duration `yaml:"latency"`
	Model        string        `yaml:"model"`
}

// Fault is one of:
//
//	partition     Region cut from the coordinator and its peers, both
//	              ways, messages in flight included, from At for For
//	failover      the coordinator stops at At; For later a new one starts
//	              from the persisted snapshot with a higher term
//	store_outage  Region's regional store (a regional.MemoryStore) fails
//	              every call from At for For: each leased or exact limit
//	              follows its on_failure
//	clock_skew    Region's clock reads Skew ahead (behind, if negative)
//	              from At for For (0: to the end): every call into its
//	              engines and enforcers, and its reports, take that time;
//	              the coordinator, the regional store (Redis TIME) and the
//	              figures keep true time
//	config        at At the configuration becomes Config (the whole allot
//	              configuration, inline, as the scenario's), as a reload
//	              does it: every instance of every region it keeps takes
//	              it (regional.Engine.Reconfigure, then its node.Node's
//	              Reconfigure), and the coordinator steps down and, For
//	              later (0: at once), leads again under a new term from
//	              the persisted assignments with the new domain (what
//	              coordinator/service.Server.SetConfig does). A region the
//	              new configuration lacks is removed: its instances stop
//	              (cut from the coordinator and peers, its requests
//	              rejected from then on). The measured limit keeps its
//	              name, algorithm, mode, unit and window; L may change (a
//	              window's L is then the least in force during it, or what
//	              the key had admitted in it when L was lowered, if more);
//	              a token bucket or GCRA keeps its rate and burst
type Fault struct {
	Kind   string        `yaml:"kind"`
	Region string        `yaml:"region"`
	At     time.Duration `yaml:"at"`
	For    time.Duration `yaml:"for"`
	Skew   time.Duration `yaml:"skew"`
	Config string        `yaml:"config"`
	// cfg is Config, parsed and checked.
	cfg *allot.Config
}

// Assert is one check of a system's figures ("allot" by default):
//
//	never_above_limit        split mode: no window's global admitted above L
//	overshoot_max_pct        no window's global admitted above L by more than Value %
//	overshoot_min_pct        some window's global admitted above L by at least
//	                         Value % (to pin down a baseline's weakness)
//	false_rejects_max_pct    false rejects ≤ Value % of requests
//	utilization_min_pct      admitted ≥ Value % of what one global limiter admits
//	utilization_max_pct      admitted ≤ Value % of it (to pin down a baseline's weakness)
//	shares_sum_max           Σ over regions of the shares in force of a key ≤ Value
//	                         at every share change (1 + rounding: 1.000001)
//	converge_within_periods  after every demand shift, shares within 5% of
//	                         ideal within Value rebalance periods
//	store_calls_max_per_request  regional store calls ≤ Value per request
//
// Region, if set, checks that region's figures instead of the global ones
// (overshoot is then the region's part of the excess of windows above L).
//
// Known, if set, says why the assertion is known to fail (a bug found by
// the simulator and not fixed yet): it is reported, and TestScenarios
// fails only if it starts to pass, so that the marker is removed.
type Assert struct {
	Check  string  `yaml:"check" json:"check"`
	Value  float64 `yaml:"value" json:"value"`
	System string  `yaml:"system" json:"system"`
	Region string  `yaml:"region" json:"region,omitempty"`
	Known  string  `yaml:"known" json:"known,omitempty"`
}

var checks = []string{"never_above_limit", "overshoot_max_pct", "overshoot_min_pct", "false_rejects_max_pct", "utilization_min_pct",
	"utilization_max_pct", "converge_within_periods", "shares_sum_max", "store_calls_max_per_request"}

var faultKinds = []string{"partition", "failover", "store_outage", "clock_skew", "config"}

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
	s.EnforcerTick = cmp.Or(s.EnforcerTick, 250*time.Millisecond)
	s.GatewaySync = cmp.Or(s.GatewaySync, 250*time.Millisecond)
	s.PeerLink = cmp.Or(s.PeerLink, s.Link)
	if s.ArrivalTick < 0 {
		return nil, nil, bad("arrival_tick", "want 0 or a positive duration")
	}
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
		field := func(f string) string { return fmt.Sprintf("traffic[%d].%s", i, f) }
		switch {
		case !slices.Contains(d.Regions, t.Region):
			return nil, nil, bad(field("region"), "unknown region %q", t.Region)
		case t.Rate <= 0:
			return nil, nil, bad(field("rate"), "want a positive rate per second")
		case t.Shape != "" && t.Shape != "diurnal" && t.Shape != "burst":
			return nil, nil, bad(field("shape"), "want diurnal or burst, got %q", t.Shape)
		case t.Shape != "" && t.Period <= 0:
			return nil, nil, bad(field("period"), "a %s shape wants a positive period", t.Shape)
		case t.Shape == "diurnal" && (t.Amplitude < 0 || t.Amplitude > 1):
			return nil, nil, bad(field("amplitude"), "want an amplitude in [0, 1]")
		case t.Shape == "burst" && (t.On <= 0 || t.On > t.Period):
			return nil, nil, bad(field("on"), "want a positive duration of at most the period")
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
		if !measures(l, t.Entry) {
			return nil, nil, bad(field("entry"), "limit %s (the one measured) does not match entry %q", l.Name, t.Entry)
		}
		if (t.LLM != nil) != (l.Unit == allot.Tokens) {
			return nil, nil, bad(field("llm"), "want llm calls on a limit of unit tokens, and only there")
		}
		if c := t.LLM; c != nil {
			c.MaxTokens = cmp.Or(c.MaxTokens, 4096)
			c.PromptMax = max(c.PromptMax, c.PromptMin)
			c.OutputSigma = cmp.Or(c.OutputSigma, 0.8)
			c.TokensPerS = cmp.Or(c.TokensPerS, 50)
			if c.PromptMin < 0 || c.OutputMedian < 1 || c.TokensPerS <= 0 || c.Latency < 0 {
				return nil, nil, bad(field("llm"), "want prompt_min ≥ 0, output_median ≥ 1, tokens_per_s > 0, latency ≥ 0")
			}
		}
	}
	for i := range s.Faults {
		f := &s.Faults[i]
		field := func(name string) string { return fmt.Sprintf("faults[%d].%s", i, name) }
		switch {
		case !slices.Contains(faultKinds, f.Kind):
			return nil, nil, bad(field("kind"), "want one of %v, got %q", faultKinds, f.Kind)
		case f.Kind == "config":
			if err := checkConfigEvent(&s, f, cfg, name+": "+field("config")); err != nil {
				return nil, nil, bad(field("config"), "%v", err)
			}
			continue
		case f.Config != "":
			return nil, nil, bad(field("config"), "only a config event has a config")
		case f.Kind != "failover" && !slices.Contains(d.Regions, f.Region):
			return nil, nil, bad(field("region"), "unknown region %q", f.Region)
		case f.For < 0 || f.For == 0 && f.Kind != "clock_skew":
			return nil, nil, bad(field("for"), "want a positive duration")
		case f.Kind == "clock_skew" && f.Skew == 0:
			return nil, nil, bad(field("skew"), "want a non-zero clock skew")
		case f.Kind == "store_outage" && !stored(d):
			return nil, nil, bad(field("kind"), "a store outage needs a limit with enforcement leased or exact")
		}
		if f.Kind == "clock_skew" && f.For == 0 {
			f.For = s.Duration - f.At
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
		if !slices.Contains(systems(&s, l), a.System) {
			return nil, nil, bad(fmt.Sprintf("assert[%d].system", i), "want one of %v", systems(&s, l))
		}
		if a.Region != "" && !slices.Contains(d.Regions, a.Region) {
			return nil, nil, bad(fmt.Sprintf("assert[%d].region", i), "unknown region %q", a.Region)
		}
		if a.Region != "" && a.Check == "never_above_limit" && l.Algorithm != allot.SlidingWindow {
			return nil, nil, bad(fmt.Sprintf("assert[%d].region", i), "never_above_limit of a %s limit checks B + r·T globally: want no region", l.Algorithm)
		}
	}
	return &s, cfg, nil
}

// checkConfigEvent parses config event f's configuration (file names it
// in errors) and checks it against the scenario's, cfg.
func checkConfigEvent(s *Scenario, f *Fault, cfg *allot.Config, file string) error {
	next, err := allot.ParseConfig(file, []byte(f.Config))
	if err != nil {
		return err
	}
	d, nd := cfg.Domains[0], next.Domains
	if len(nd) != 1 || nd[0].Name != d.Name {
		return fmt.Errorf("want one domain, %s", d.Name)
	}
	for _, r := range nd[0].Regions {
		if !slices.Contains(d.Regions, r) {
			return fmt.Errorf("region %q is not one of the scenario's %v: a config event may remove regions, not add them", r, d.Regions)
		}
	}
	l, nl := d.Limit(s.Limit), nd[0].Limit(s.Limit)
	switch {
	case f.For < 0:
		return fmt.Errorf("for: want 0 or a positive duration")
	case s.GatewayLeases:
		return fmt.Errorf("not with gateway_leases")
	case nl == nil:
		return fmt.Errorf("it lacks limit %s, the one measured", s.Limit)
	case nl.Algorithm != l.Algorithm || nl.Mode != l.Mode || nl.Unit != l.Unit || nl.Rate.Period != l.Rate.Period:
		return fmt.Errorf("limit %s changes its algorithm, mode, unit or window", s.Limit)
	case l.Algorithm != allot.SlidingWindow && (nl.Rate != l.Rate || nl.Burst != l.Burst):
		return fmt.Errorf("limit %s (%s) changes its rate or burst: the B + r·T check follows one", s.Limit, l.Algorithm)
	case len(s.Traffic) > 0 && !measures(nl, s.Traffic[0].Entry):
		return fmt.Errorf("limit %s changes its match", s.Limit)
	}
	f.cfg = next
	return nil
}

// measures reports whether limit l counts the requests of traffic whose
// descriptor is one entry named entry.
func measures(l *allot.Limit, entry string) bool {
	return len(l.Match) == 1 && l.Match[0].Key == entry && l.Match[0].Value == allot.Wildcard
}

// stored reports whether a limit of d keeps its state in the regional
// store (enforcement leased or exact).
func stored(d *allot.Domain) bool {
	for _, l := range d.Limits {
		if l.Enforcement != allot.Local && !l.Unlimited {
			return true
		}
	}
	return false
}

// Shorten applies the scenario's Short form, if it has one: `go test`
// runs every scenario this way.
func (s *Scenario) Shorten() {
	sh := s.Short
	if sh == nil {
		return
	}
	if sh.Duration > 0 && sh.Duration < s.Duration {
		s.Duration = sh.Duration
		for i := range s.Traffic {
			s.Traffic[i].Until = min(s.Traffic[i].Until, s.Duration)
		}
	}
	for i := range s.Traffic {
		t := &s.Traffic[i]
		if sh.RateScale > 0 {
			t.Rate *= sh.RateScale
		}
		if sh.Keys > 0 {
			t.Keys = min(t.Keys, sh.Keys)
		}
	}
	for i := range s.Regions {
		if sh.Instances > 0 {
			s.Regions[i].Instances = min(s.Regions[i].Instances, sh.Instances)
		}
	}
	for i := range s.Traffic {
		if t := &s.Traffic[i]; t.Reach > 0 {
			t.Reach = min(t.Reach, s.region(t.Region).Instances)
		}
	}
	s.Short = nil
}
