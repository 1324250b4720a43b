package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
)

// Systems compared in one run.
const (
	// Allot is split mode driven by the real coordinator.
	Allot = "allot"
	// Naive gives every instance global ÷ instances, with no coordinator.
	Naive = "naive"
)

// NoFallback is allot in shared mode without the staleness fallback: the
// engine has no switch for it, so the limit's stale_after is set to a day.
const NoFallback = "no-fallback"

// ChargeAfter is allot with LLM calls admitted while the token limit is
// not exhausted (a check of 0 tokens) and charged their real cost only
// when the response ends, instead of reserving prompt + p90 output.
const ChargeAfter = "charge-after"

// ideal is the pass that checks every request against one engine holding
// the whole limit: the reference for false rejects and utilisation.
const ideal = "ideal"

// systems lists the systems Run simulates for a limit, in report order:
// allot and the naive even split; for a shared-mode limit allot without
// fallback; for a limit of tokens, charging after the response; with
// GatewayLeases, gateways deciding from leases.
func systems(sc *Scenario, l *allot.Limit) []string {
	s := []string{Allot, Naive}
	if sc.GatewayLeases {
		s = append(s, Gateways)
	}
	if l.Mode == allot.Shared {
		s = append(s, NoFallback)
	}
	if l.Unit == allot.Tokens {
		s = append(s, ChargeAfter)
	}
	return s
}

// T0 is the virtual clock's start: aligned to every window.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sweepEvery is how often every engine drops the keys whose state is back
// to full (regional.Engine.Sweep: no decision changes), which bounds the
// memory of a run over many keys.
const sweepEvery = 5 * time.Second

// event is one thing due at a virtual instant; seq breaks ties in the
// order events were scheduled, so a run is deterministic.
type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// world is one system's run of a scenario. Not safe for concurrent use:
// everything happens on the caller's goroutine, in virtual time.
type world struct {
	sc     *Scenario
	sys    string
	dom    *allot.Domain
	lim    *allot.Limit
	keys   *keySpace // shared by the systems of a run, read-only
	now    time.Time
	end    time.Time
	q      queue
	seq    uint64
	net    *rand.Rand // latency, loss, duplication
	ctx    context.Context
	dec    allot.Decision
	items  [1]regional.Item
	batch  []uint64 // arrivals of one tick: instance<<32 | key id
	region []*region
	m      *metrics

	// The coordinator (its Fleet, as the coordinator's driver runs it), nil
	// while down. gen counts coordinators, so that messages sent to a
	// stopped one are lost.
	coord *coordinator.Fleet
	// reloaded is the Fleet that stepped down for a configuration change:
	// the next term continues it, as the coordinator's driver does in the
	// same process (coordinator/service: a reload).
	reloaded *coordinator.Fleet
	gen      int
	term     int64
	snap     coordinator.Snapshot // what was persisted
	cut      map[string]bool      // regions partitioned from the coordinator and peers
	tally    map[string]*tally    // by Weighted limit (coordinated systems)
}

// region is one region of a system.
type region struct {
	name string
	idx  int // in the domain's regions
	link Link
	skew time.Duration // its clock reads true time + skew
	gone bool          // removed by a config event: its instances stopped
	// leftAt is when its instances left (a graceful stop, when a config
	// event removed it): they tell a new term that starts within
	// leaveBudget by a leaving hello.
	leftAt time.Time
	inst   []*instance
	store  *simStore  // nil without leased or exact limits
	gw     []*gateway // the gateways system's gateways (gateway.go)
	// counts is the CountStore its instances share their shared-mode
	// counts in, with peers and several instances (the regional Redis).
	counts *regional.MemoryCounts
}

// instance is one enforcer instance: an engine, the Enforcer over it
// when the domain has leased or exact limits, the Reservations of LLM
// calls and, in the coordinated systems, the instance's core (node.Node:
// its side of the assignment protocol, its reports and its peer sync, as
// regional/coordclient and regional/peersync drive it).
type instance struct {
	e  *regional.Engine
	f  *regional.Enforcer
	rs *regional.Reservations
	id string
	j  int        // its index in the region
	n  *node.Node // nil in the naive and ideal systems
	// sent is when its peer sync last sent a message; replied, by inbound
	// stream, when it last answered one with a heartbeat.
	sent    time.Time
	replied map[string]time.Time
	// What it applies of each local limit (see tally): its default share,
	// and its hot keys' own shares.
	def map[string]float64
	own map[string]map[string]float64
}

// tally is, for one Weighted limit of a coordinated system, the sum over
// every instance of every region of what it applies for each key: def is
// Σ default shares, adj[key] Σ (own − default) over the instances with a
// share of their own for key. So Σ of key's shares in force is def +
// adj[key], kept up to date at every share change (checkShares).
type tally struct {
	def float64
	adj map[string]float64
}

// clock is region r's clock.
func (w *world) clock(r *region) time.Time { return w.now.Add(r.skew) }

// clockOf is what instance in of r runs its engine on: its region's
// clock converted to the coordinator's time by its node, as allot
// regional does (node.Node.Now); the naive and ideal instances have no
// node and run on their region's clock.
func (w *world) clockOf(r *region, in *instance) time.Time {
	if in.n != nil {
		return in.n.Now(w.clock(r))
	}
	return w.clock(r)
}

func (w *world) at(t time.Time, fn func()) {
	w.seq++
	heap.Push(&w.q, event{at: t, seq: w.seq, fn: fn})
}

func (w *world) after(d time.Duration, fn func()) { w.at(w.now.Add(d), fn) }

// every runs fn at start and then every d until the end.
func (w *world) every(start time.Time, d time.Duration, fn func()) {
	var loop func()
	loop = func() {
		fn()
		w.after(d, loop)
	}
	w.at(start, loop)
}

// localConfig returns the scenario's configuration with every limit
// enforced locally (and, for the no-fallback system, stale_after a day).
func localConfig(sc *Scenario, staleDay bool) (*allot.Config, error) {
	c, err := allot.ParseConfig(sc.Name, []byte(sc.Config))
	if err != nil {
		return nil, err
	}
	for _, l := range c.Domains[0].Limits {
		l.Enforcement = allot.Local
		if staleDay {
			l.StaleAfter = 24 * time.Hour
		}
	}
	return c, nil
}

// run simulates one system of the scenario (or the ideal pass).
func run(sc *Scenario, cfg *allot.Config, sys string, keys *keySpace) (*metrics, error) {
	w, err := build(sc, cfg, sys, keys)
	if err != nil {
		return nil, err
	}
	for w.q.Len() > 0 {
		e := heap.Pop(&w.q).(event)
		if e.at.After(w.end) {
			break
		}
		w.now = e.at
		e.fn()
	}
	w.m.finish()
	return w.m, nil
}

// build makes the world of one system of the scenario, its events
// scheduled.
func build(sc *Scenario, cfg *allot.Config, sys string, keys *keySpace) (*world, error) {
	d := cfg.Domains[0]
	w := &world{sc: sc, sys: sys, dom: d, lim: d.Limit(sc.Limit), keys: keys, now: T0, end: T0.Add(sc.Duration),
		net: rand.New(rand.NewPCG(sc.Seed, 2)), ctx: context.Background(), cut: map[string]bool{}}
	w.m = newMetrics(sc, w.lim, d, keys, sys == ideal)
	var err error
	switch sys {
	case ideal:
		err = w.buildIdeal()
	case Naive:
		err = w.buildNaive()
	default:
		err = w.buildAllot(cfg)
	}
	if err != nil {
		return nil, err
	}
	var engines []*regional.Engine
	for _, r := range w.region {
		for _, in := range r.inst {
			if !slices.Contains(engines, in.e) {
				engines = append(engines, in.e)
			}
		}
	}
	w.every(T0.Add(sweepEvery), sweepEvery, func() {
		for _, e := range engines {
			e.Sweep(w.now)
		}
	})
	if sys != ideal {
		w.every(T0, w.sc.Tick, w.sample)
		w.every(T0, w.sc.EnforcerTick, w.enforcerTick)
	}
	w.traffic()
	return w, nil
}

// buildIdeal makes every region's requests go to one engine that holds
// the whole limit, on true time, without a coordinator.
func (w *world) buildIdeal() error {
	cfg, err := localConfig(w.sc, false)
	if err != nil {
		return err
	}
	one := &instance{e: regional.New(cfg, regional.Options{})}
	for i, name := range w.dom.Regions {
		w.region = append(w.region, &region{name: name, idx: i, inst: []*instance{one}})
	}
	for _, f := range w.sc.Faults {
		if f.Kind == "config" { // the one global limiter follows the configuration
			w.fault(f)
		}
	}
	return nil
}

// buildNaive gives every instance an engine enforcing global ÷ instances.
func (w *world) buildNaive() error {
	cfg, err := localConfig(w.sc, false)
	if err != nil {
		return err
	}
	total := 0
	for _, r := range w.sc.Regions {
		total += r.Instances
	}
	for i, name := range w.dom.Regions {
		sr := w.sc.region(name)
		r := &region{name: name, idx: i, link: *sr.Link}
		for j := range sr.Instances {
			e := regional.New(cfg, regional.Options{})
			for _, l := range w.dom.Limits {
				if err := e.SetShare(w.now, w.dom.Name, l.Name, 1/float64(total)); err != nil {
					return err
				}
			}
			r.inst = append(r.inst, w.newInstance(r, j, e, nil))
		}
		w.region = append(w.region, r)
	}
	for _, f := range w.sc.Faults {
		if f.Kind == "clock_skew" || f.Kind == "config" { // the naive instances have clocks and configurations too
			w.fault(f)
		}
	}
	return nil
}

// newInstance wraps engine e (and store, if any) for instance j of r.
func (w *world) newInstance(r *region, j int, e *regional.Engine, store *simStore) *instance {
	in := &instance{e: e, id: fmt.Sprintf("%s-i%d", r.name, j), j: j}
	if store != nil {
		in.f = regional.NewEnforcer(e, store, regional.EnforcerOptions{Region: r.name, Instance: fmt.Sprint("i", j)})
	}
	if w.lim.Unit == allot.Tokens && w.sys != ChargeAfter {
		rnd := rand.New(rand.NewPCG(w.sc.Seed, uint64(1000+r.idx*100000+j)))
		in.rs = regional.NewReservations(e, in.f, regional.ReservationOptions{Rand: rnd})
	}
	return in
}

// buildAllot builds the coordinated systems: allot, no-fallback and
// charge-after.
func (w *world) buildAllot(cfg *allot.Config) error {
	d := w.dom
	if w.sys == Gateways {
		// One enforcer per region decides in memory; its gateways lease
		// from it.
		c, err := localConfig(w.sc, false)
		if err != nil {
			return err
		}
		cfg = c
		// The coordinator and the instances' cores see the limits as the
		// engines enforce them: one instance a region holds all of it.
		d, w.dom = c.Domains[0], c.Domains[0]
	}
	if w.sys == NoFallback {
		c, err := allot.ParseConfig(w.sc.Name, []byte(w.sc.Config))
		if err != nil {
			return err
		}
		for _, l := range c.Domains[0].Limits {
			l.StaleAfter = 24 * time.Hour
		}
		cfg = c
	}
	for i, name := range d.Regions {
		sr := w.sc.region(name)
		r := &region{name: name, idx: i, link: *sr.Link}
		n := sr.Instances
		if w.sys == Gateways {
			n = 1 // one enforcer; the instances are gateways (gateway.go)
		}
		if stored(d) && w.sys != Gateways {
			r.store = &simStore{w: w, r: i}
		}
		if w.peers() && n > 1 {
			r.counts = &regional.MemoryCounts{Now: func() time.Time { return w.clock(r) }}
		}
		for j := range n {
			e := regional.New(cfg, regional.Options{})
			if w.peers() {
				if err := e.SetPeers(name, slices.DeleteFunc(slices.Clone(d.Regions), func(p string) bool { return p == name })); err != nil {
					return err
				}
			}
			in := w.newInstance(r, j, e, r.store)
			opts := node.Options{Region: name, Instance: in.id, Engine: e}
			if r.counts != nil {
				opts.Counts = r.counts
			}
			nd, err := node.New(opts)
			if err != nil {
				return err
			}
			in.n = nd
			if err := nd.Link(w.clock(r)); err != nil { // an instance holds nothing until granted
				return err
			}
			w.track(in)
			r.inst = append(r.inst, in)
		}
		w.region = append(w.region, r)
	}
	if w.sys == Gateways {
		w.buildGateways()
	}
	if err := w.start(); err != nil {
		return err
	}
	w.every(T0.Add(w.sc.Tick), w.sc.Tick, func() {
		if w.coord != nil {
			w.ready(w.coord.Tick(w.now))
		}
		for _, r := range w.region { // grants not renewed in time end
			for _, in := range r.inst {
				_, applied := in.n.Expire(w.clock(r))
				w.applied(in, applied)
			}
		}
	})
	for i, r := range w.region {
		for j, in := range r.inst {
			phase := w.sc.ReportEvery * time.Duration(i*len(r.inst)+j+1) / time.Duration(len(w.region)*len(r.inst)+1)
			w.every(T0.Add(phase), w.sc.ReportEvery, func() { w.report(r, in) })
		}
	}
	for _, f := range w.sc.Faults {
		w.fault(f)
	}
	if w.peers() {
		for _, r := range w.region {
			for _, in := range r.inst {
				phase := w.sc.SyncTick * time.Duration(in.j) / time.Duration(len(r.inst))
				w.every(T0.Add(w.sc.SyncTick+phase), w.sc.SyncTick, func() { w.syncTick(r, in) })
			}
		}
	}
	return nil
}

// applied records the shares instance in's core applied, in order.
func (w *world) applied(in *instance, shares []coordinator.Share) {
	for _, s := range shares {
		w.tallyShare(in, s)
		w.checkShares(s)
	}
}

// track starts tallying what instance in applies of every local limit,
// from its engine's shares now.
func (w *world) track(in *instance) {
	if w.tally == nil {
		w.tally = map[string]*tally{}
	}
	in.def, in.own = map[string]float64{}, map[string]map[string]float64{}
	for _, l := range w.dom.Limits {
		if !coordinator.Weighted(l) {
			continue // every instance applies its region's share
		}
		t := w.tally[l.Name]
		if t == nil {
			t = &tally{adj: map[string]float64{}}
			w.tally[l.Name] = t
		}
		in.def[l.Name] = in.e.Share(w.dom.Name, l.Name, "")
		in.own[l.Name] = map[string]float64{}
		t.def += in.def[l.Name]
	}
}

// tallyShare records that instance in applied s.
func (w *world) tallyShare(in *instance, s coordinator.Share) {
	t := w.tally[s.Limit]
	if t == nil || in.def == nil {
		return // not a Weighted limit
	}
	own := in.own[s.Limit]
	if s.Key == "" {
		d := s.Value - in.def[s.Limit]
		in.def[s.Limit] = s.Value
		t.def += d
		for k := range own {
			t.adj[k] -= d
		}
		return
	}
	old, had := own[s.Key]
	switch {
	case s.Value < 0 && had:
		t.adj[s.Key] -= old - in.def[s.Limit]
		delete(own, s.Key)
	case s.Value < 0:
	case had:
		t.adj[s.Key] += s.Value - old
		own[s.Key] = s.Value
	default:
		t.adj[s.Key] += s.Value - in.def[s.Limit]
		own[s.Key] = s.Value
	}
}

// share is region r's share of key (0 once a config event removed it):
// what its instances apply together
// for a limit divided among them (coordinator.Weighted, and every limit
// of the naive system); for a limit counted in the regional store or a
// CountStore, the largest share any of its instances applies to the
// region's count.
func (w *world) share(r *region, limit, key string) float64 {
	if r.gone {
		return 0 // its instances stopped: nothing of theirs is in force
	}
	sum, most := 0.0, 0.0
	seen := map[*regional.Engine]bool{}
	for _, in := range r.inst {
		if seen[in.e] {
			continue // the ideal system's one engine
		}
		seen[in.e] = true
		v := in.e.Share(w.dom.Name, limit, key)
		sum += v
		most = max(most, v)
	}
	if l := w.dom.Limit(limit); w.sys == Naive || l == nil || coordinator.Weighted(l) {
		return sum
	}
	return most
}

func (sc *Scenario) region(name string) *Region {
	for i := range sc.Regions {
		if sc.Regions[i].Name == name {
			return &sc.Regions[i]
		}
	}
	return nil
}

// start starts a coordinator from the persisted snapshot, under a new
// term, and every instance connects to it.
func (w *world) start() error {
	w.term++
	c, err := coordinator.NewFleet(w.now, coordinator.FleetConfig{Coordinator: coordinator.Config{Domain: w.dom, Term: w.term,
		Period: w.sc.Period, HalfLife: w.sc.HalfLife}}, w.snap, w.reloaded)
	w.reloaded = nil
	if err != nil {
		return fmt.Errorf("start the coordinator of term %d: %w", w.term, err)
	}
	w.coord = c
	w.gen++
	for _, r := range w.region {
		if r.gone {
			w.farewell(r)
			continue
		}
		for _, in := range r.inst {
			w.connect(r, in)
		}
	}
	return nil
}

// farewell has the instances of r, removed and left, tell the
// coordinator running now that they left, by a leaving hello on a new
// stream (coordclient: the stream that carried the leave broke), when it
// starts within leaveBudget of their leave. The message travels over r's
// link, which its cut (for traffic) does not stop.
func (w *world) farewell(r *region) {
	if r.leftAt.IsZero() || w.now.Sub(r.leftAt) > leaveBudget {
		return
	}
	for _, in := range r.inst {
		if in.n == nil {
			continue
		}
		hello, weights, err := in.n.Connect(w.clock(r), w.dom.Name)
		if err != nil || !hello.Leaving {
			continue
		}
		gen := w.gen
		w.transmit(r.link, r.name, "", true, func() {
			if w.coord == nil || w.gen != gen {
				return
			}
			if rd, err := w.coord.Attach(w.now, r.name, in.id, false, hello, weights); err == nil {
				w.ready(rd)
			}
		})
	}
}

// connect opens instance in's stream to the coordinator running now: its
// hello and its latest report, then the coordinator's full grant.
func (w *world) connect(r *region, in *instance) {
	local := w.clock(r)
	hello, weights, err := in.n.Connect(local, w.dom.Name)
	if err != nil {
		panic(err) // the domain is the world's own
	}
	gen := w.gen
	w.send(r.link, r.name, "", func() {
		if w.coord == nil || w.gen != gen {
			return
		}
		rd, err := w.coord.Attach(w.now, r.name, in.id, false, hello, weights)
		if err != nil {
			panic(err) // the instance and region are the world's own
		}
		w.ready(rd)
		// On the same stream, after the hello: its latest report again.
		if rep, ok := in.n.LastReport(local, w.dom.Name, w.sc.ReportEvery); ok {
			if rd, err := w.coord.Step(w.now, rep); err == nil {
				w.ready(rd)
			}
		}
	})
}

// errStoreDown is what a region's store answers during a store outage.
var errStoreDown = errors.New("sim: regional store unreachable")

func (w *world) fault(f Fault) {
	switch f.Kind {
	case "partition":
		w.at(T0.Add(f.At), func() { w.cut[f.Region] = true })
		w.at(T0.Add(f.At+f.For), func() {
			delete(w.cut, f.Region)
			if w.coord != nil && w.sys != Naive && w.sys != ideal { // its streams broke: they reconnect
				for _, in := range w.byName(f.Region).inst {
					w.connect(w.byName(f.Region), in)
				}
			}
		})
	case "failover":
		w.at(T0.Add(f.At), func() { w.coord = nil })
		w.at(T0.Add(f.At+f.For), func() {
			if err := w.start(); err != nil {
				panic(err) // the snapshot is the coordinator's own: a bug
			}
		})
	case "store_outage":
		s := w.byName(f.Region).store
		w.at(T0.Add(f.At), func() { s.m.SetErr(errStoreDown) })
		w.at(T0.Add(f.At+f.For), func() { s.m.SetErr(nil) })
	case "clock_skew":
		r := w.byName(f.Region)
		w.at(T0.Add(f.At), func() { r.skew = f.Skew })
		w.at(T0.Add(f.At+f.For), func() { r.skew = 0 })
	case "config":
		w.at(T0.Add(f.At), func() {
			if err := w.reconfigure(f); err != nil {
				panic(fmt.Sprintf("config event at %v: %v", f.At, err))
			}
		})
	}
}

// reconfigure applies config event f as a reload does: every instance of
// every region the configuration keeps takes it (the engine's SetConfig,
// then its core's Reconfigure, as cmd/allot's regional server does), the
// instances of a region it lacks stop, and the coordinator steps down and
// leads again f.For later under a new term, from what it persisted, with
// the new domain (coordinator/service.Server.SetConfig).
func (w *world) reconfigure(f Fault) error {
	cfg, err := w.configFor(f.Config)
	if err != nil {
		return err
	}
	d := cfg.Domains[0]
	w.m.relimit(w.now, float64(d.Limit(w.lim.Name).Rate.Amount))
	seen := map[*regional.Engine]bool{}
	for _, r := range w.region {
		if !slices.Contains(d.Regions, r.name) && w.sys != ideal {
			w.remove(r)
			continue
		}
		for _, in := range r.inst {
			if seen[in.e] {
				continue // the ideal pass's one engine
			}
			seen[in.e] = true
			in.e.Reconfigure(w.clockOf(r, in), cfg)
			if in.n != nil {
				if err := in.n.Reconfigure(w.clock(r)); err != nil {
					return fmt.Errorf("%s: %w", in.id, err)
				}
			}
		}
	}
	w.dom, w.lim = d, d.Limit(w.lim.Name)
	if w.sys == ideal || w.sys == Naive {
		return nil
	}
	w.coord, w.reloaded = nil, w.coord // steps down; its streams close
	w.at(w.now.Add(f.For), func() {
		if err := w.start(); err != nil {
			panic(err)
		}
	})
	return nil
}

// configFor parses configuration src as this system runs it: every
// limit local for the ideal pass, the naive split and the gateways'
// enforcers; stale_after a day without fallback; as written for allot.
func (w *world) configFor(src string) (*allot.Config, error) {
	sc := &Scenario{Name: w.sc.Name, Config: src}
	switch w.sys {
	case ideal, Naive, Gateways:
		return localConfig(sc, false)
	}
	c, err := allot.ParseConfig(w.sc.Name, []byte(src))
	if err == nil && w.sys == NoFallback {
		for _, l := range c.Domains[0].Limits {
			l.StaleAfter = 24 * time.Hour
		}
	}
	return c, err
}

// leaveBudget is how long a stopping instance tries to tell the
// coordinator that it left, as cmd/allot's regional server gives
// coordclient.Client.Leave: a leave sent on a stream that breaks at once
// (leadership moved) is said again by the next stream's hello.
const leaveBudget = 3 * time.Second

// remove stops region r's instances for good, gracefully: each leaves
// (node.Node.Leave: it applies nothing more) and sends its leaving ack to
// the coordinator running now; they are cut from their peers, the
// region's requests are rejected, and what they applied leaves the tally
// of shares in force. A new term that starts within leaveBudget hears
// their leave again (farewell).
func (w *world) remove(r *region) {
	for _, in := range r.inst {
		if in.n == nil {
			continue
		}
		for _, ack := range in.n.Leave(w.clock(r)) {
			ack.Instance = in.id
			w.toCoord(r, ack)
		}
	}
	r.leftAt = w.now
	r.gone, w.cut[r.name] = true, true
	for _, in := range r.inst {
		if in.def == nil {
			continue
		}
		for limit, own := range in.own {
			for k := range own {
				w.tallyShare(in, coordinator.Share{Limit: limit, Key: k, Value: -1})
			}
		}
		for limit := range in.def {
			w.tallyShare(in, coordinator.Share{Limit: limit, Value: 0})
		}
	}
}

// send schedules deliver over link l between regions a and b (b is ""
// for the coordinator), unless the message is lost; it is also lost if a
// or b is partitioned when it is sent or delivered. It is counted for
// region a: sends name the region end of a coordinator link, and the
// sender of a peer message, first.
func (w *world) send(l Link, a, b string, deliver func()) { w.transmit(l, a, b, false, deliver) }

// transmit is send; with uncut, a cut does not stop the message (a
// removed region's last words).
func (w *world) transmit(l Link, a, b string, uncut bool, deliver func()) {
	w.m.messages[w.byName(a).idx]++
	cut := func() bool { return !uncut && (w.cut[a] || w.cut[b]) }
	if cut() || w.net.Float64() < l.Loss {
		return
	}
	copies := 1
	if w.net.Float64() < l.Dup {
		copies = 2
	}
	for range copies {
		d := l.RTT / 2
		if l.Jitter > 0 {
			d += time.Duration(w.net.Int64N(int64(l.Jitter)))
		}
		w.after(d, func() {
			if !cut() {
				deliver()
			}
		})
	}
}

// toCoord sends m from r to the coordinator running now.
func (w *world) toCoord(r *region, m coordinator.Message) {
	gen := w.gen
	w.send(r.link, r.name, "", func() {
		if w.coord == nil || w.gen != gen {
			return // that coordinator is gone
		}
		rd, err := w.coord.Step(w.now, m)
		if err != nil {
			w.m.refused++ // stale or duplicated: counted by the coordinator too
			return
		}
		w.ready(rd)
	})
}

// ready persists, then sends each assignment to its instance, as the
// coordinator's driver does.
func (w *world) ready(rd coordinator.Ready) {
	if len(rd.Persist) > 0 || rd.Members != nil {
		w.persist(rd)
	}
	gen := w.gen
	for _, a := range rd.Send {
		r := w.byName(a.Region)
		in := r.byID(a.Instance)
		w.send(r.link, r.name, "", func() {
			if w.gen == gen { // a stream of a coordinator that is gone is closed
				w.apply(r, in, a)
			}
		})
	}
}

func (r *region) byID(id string) *instance {
	for _, in := range r.inst {
		if in.id == id {
			return in
		}
	}
	panic("sim: unknown instance " + id)
}

// persist replaces (or, for a Record without Cells, deletes) the records
// of rd, and keeps its Term and Version: the fenced etcd write.
func (w *world) persist(rd coordinator.Ready) {
	for _, rec := range rd.Persist {
		i := 0
		for i < len(w.snap.Records) && (w.snap.Records[i].Limit != rec.Limit || w.snap.Records[i].Key != rec.Key) {
			i++
		}
		switch {
		case rec.Cells == nil && i < len(w.snap.Records):
			w.snap.Records = append(w.snap.Records[:i], w.snap.Records[i+1:]...)
		case rec.Cells == nil:
		case i < len(w.snap.Records):
			w.snap.Records[i] = rec
		default:
			w.snap.Records = append(w.snap.Records, rec)
		}
	}
	if rd.Members != nil {
		w.snap.Members = rd.Members
	}
	if len(rd.Persist) > 0 {
		w.snap.Term, w.snap.Version = rd.Term, rd.Version
	}
}

// apply is an instance's driver (regional/coordclient): its core applies
// the assignment, lowerings first, then the ack goes out.
func (w *world) apply(r *region, in *instance, a coordinator.Assignment) {
	applied, ack, err := in.n.Assign(w.clock(r), a)
	w.applied(in, applied)
	if err != nil {
		if ack.Domain == "" {
			w.m.refused++
			return
		}
		panic(fmt.Sprintf("%s: assignment applied in part: %v", in.id, err)) // the Instance validated it
	}
	w.toCoord(r, ack)
}

// report sends instance in's demand since its previous report, as
// regional/coordclient does.
func (w *world) report(r *region, in *instance) {
	for _, rep := range in.n.Reports(w.clock(r)) {
		w.toCoord(r, rep)
	}
}

func (w *world) byName(name string) *region {
	for _, r := range w.region {
		if r.name == name {
			return r
		}
	}
	panic("sim: unknown region " + name)
}

// enforcerTick runs every Enforcer's and Reservations' Tick, on its
// region's clock, as the servers do every 250 ms.
func (w *world) enforcerTick() {
	for _, r := range w.region {
		for _, in := range r.inst {
			if in.f != nil {
				in.f.Tick(w.ctx, w.clockOf(r, in))
			}
			if in.rs != nil {
				in.rs.Tick(w.ctx, w.clockOf(r, in))
			}
		}
	}
}

// sample records every region's share of the watched key.
func (w *world) sample() {
	shares := make([]float64, len(w.region))
	for i, r := range w.region {
		shares[i] = w.share(r, w.lim.Name, w.keys.hotName)
	}
	w.m.sample(w.now, shares)
}

// syncTick is instance in's peer sync tick, as regional/peersync does it:
// one message to every peer with its core's batches (with several
// instances, after merging the region's counts in its CountStore), or a
// heartbeat when none went out for a heartbeat interval; resync requests
// for the deltas lost on the streams it receives; and its loan asks.
func (w *world) syncTick(r *region, in *instance) {
	now := w.clockOf(r, in)
	batches, err := in.n.SyncOut(w.ctx, now)
	if err != nil {
		panic(err) // the world's CountStore does not fail
	}
	_, hb := node.PeerIntervals(in.e.Config())
	beat := len(batches) > 0 || now.Sub(in.sent) >= hb
	if beat {
		in.sent = now
	}
	for _, p := range w.region {
		if p == r {
			continue
		}
		to := p.peerOf(in)
		if beat {
			w.send(w.sc.PeerLink, r.name, p.name, func() {
				to.e.Heard(w.clockOf(p, to), r.name)
				for _, b := range batches {
					w.inbound(p, to, r, in, b)
				}
				w.reply(p, to, r, in, hb)
			})
		}
		for _, from := range p.inst {
			if r.peerOf(from) != in {
				continue
			}
			for _, b := range in.e.PendingResyncs(w.clockOf(r, in), streamID(from, in)) {
				w.resync(r, in, p, from, b)
			}
		}
	}
	for _, a := range in.e.LoanAsks(w.clockOf(r, in)) {
		w.borrow(r, in, a)
	}
}

// reply is the heartbeat that instance to of region p sends back on the
// stream from instance in of r, at most every hb: in hears p.
func (w *world) reply(p *region, to *instance, r *region, in *instance, hb time.Duration) {
	id := streamID(in, to)
	if now := w.clockOf(p, to); now.Sub(to.replied[id]) >= hb {
		if to.replied == nil {
			to.replied = map[string]time.Time{}
		}
		to.replied[id] = now
		w.send(w.sc.PeerLink, p.name, r.name, func() { in.e.Heard(w.clockOf(r, in), p.name) })
	}
}

// peerOf is the instance of r that instance in of another region streams
// to (and borrows from): as if each instance dialled the region's
// address, spread evenly.
func (r *region) peerOf(in *instance) *instance { return r.inst[in.j%len(r.inst)] }

// streamID names the stream from instance from to instance to.
func streamID(from, to *instance) string { return from.id + ">" + to.id }

// errLendTimeout is what a borrower's driver gives Credit when no answer
// came within LendTimeout.
var errLendTimeout = errors.New("sim: lend timed out")

// borrow sends a loan ask of instance in of r to its peer, as a Lend call
// with a timeout: the lender deducts, then grants; a grant that comes too
// late is lost (stranded at the lender for the window, never created).
func (w *world) borrow(r *region, in *instance, a regional.LoanAsk) {
	w.m.loanAsks++
	peer := w.byName(a.Peer)
	lender, done := peer.peerOf(in), false
	w.send(w.sc.PeerLink, r.name, peer.name, func() {
		g, err := lender.e.Lend(w.clockOf(peer, lender), regional.LoanRequest{From: r.name, Domain: a.Domain, Limit: a.Limit,
			Key: a.Key, Window: a.Window, Amount: a.Amount, ID: a.ID})
		w.send(w.sc.PeerLink, peer.name, r.name, func() {
			if !done {
				done = true
				w.m.loaned += float64(g.Granted)
				in.e.Credit(w.clockOf(r, in), a, g, err)
			}
		})
	})
	w.after(w.sc.LendTimeout, func() {
		if !done {
			done = true
			in.e.Credit(w.clockOf(r, in), a, regional.LoanGrant{}, errLendTimeout)
		}
	})
}

// peers says whether regions sync with their peers: always for a
// shared-mode limit, and in split mode when the scenario says so (then
// they borrow).
func (w *world) peers() bool { return w.lim.Mode == allot.Shared || w.sc.Peers }

// inbound delivers batch b from instance fromIn of region from to
// instance toIn of region to.
func (w *world) inbound(to *region, toIn *instance, from *region, fromIn *instance, b regional.Batch) {
	toIn.e.Heard(w.clockOf(to, toIn), from.name)
	resync, err := toIn.n.Inbound(w.clockOf(to, toIn), regional.Source{Region: from.name, Stream: streamID(fromIn, toIn)}, b)
	if err != nil {
		panic(fmt.Sprintf("%s: inbound from %s: %v", toIn.id, fromIn.id, err))
	}
	if resync {
		w.resync(to, toIn, from, fromIn, b)
	}
}

// resync asks instance peerIn of peer for the full state of b's limit, on
// behalf of instance in of r.
func (w *world) resync(r *region, in *instance, peer *region, peerIn *instance, b regional.Batch) {
	w.send(w.sc.PeerLink, r.name, peer.name, func() {
		full, err := peerIn.e.FullState(b.Domain, b.Limit)
		if err != nil {
			panic(err)
		}
		w.send(w.sc.PeerLink, peer.name, r.name, func() { w.inbound(r, in, peer, peerIn, full) })
	})
}

// checkShares records the sum over regions of the shares in force for
// the vector s changed: the coordinator's invariant says it is at most 1
// at every instant, and shares change only here.
func (w *world) checkShares(s coordinator.Share) {
	key := s.Key
	if key == "" {
		key = w.keys.hotName // the default vector, as the watched key sees it
	}
	if t := w.tally[s.Limit]; t != nil { // a Weighted limit: every instance's part, summed
		w.m.shareSum = max(w.m.shareSum, t.def+t.adj[key])
		return
	}
	sum := 0.0
	for _, r := range w.region {
		sum += w.share(r, s.Limit, key)
	}
	w.m.shareSum = max(w.m.shareSum, sum)
}
