package coordinator

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot"
)

// Defaults of FleetConfig.
const (
	// DefaultGrantTTL is how long an instance's grant lasts without a
	// renewal. The coordinator renews every live instance's grant at every
	// rebalance, so only an instance cut off from every coordinator for
	// longer than this holds nothing (see Fleet).
	DefaultGrantTTL = time.Minute
	// DefaultMaxSkew is the clock skew between a coordinator and an
	// instance that Fleet tolerates: a grant is reclaimed only once its
	// expiry plus this has passed on the coordinator's clock.
	DefaultMaxSkew = 500 * time.Millisecond
	// weightFloor is the part of a limit's allowance that a region's live
	// instances share evenly whatever their demand, so that an instance
	// that sees its first requests has some while the next rebalance
	// gives it more; the rest follows demand.
	weightFloor = 0.2
	// weightHysteresis: weights move only if one moves by more than this.
	weightHysteresis = 0.02
)

// Weighted reports whether a region's share of limit l is divided among
// the region's instances (by Grant.Weights): a split-mode limit enforced
// in each instance's memory. Leased and exact limits count in the regional
// store that every instance shares, and shared-mode limits count each
// instance in its own slot (see regional), so their shares apply
// undivided.
func Weighted(l *allot.Limit) bool {
	return l.Mode == allot.Split && l.Enforcement == allot.Local && !l.Unlimited
}

// FleetConfig configures a Fleet.
type FleetConfig struct {
	Coordinator Config // the region-level Coordinator's; Domain and Term are required
	// GrantTTL is how long a grant lasts unrenewed (default DefaultGrantTTL).
	GrantTTL time.Duration
	// MaxSkew is the tolerated clock skew (default DefaultMaxSkew).
	MaxSkew time.Duration
}

// Fleet is the rebalancing state machine of one domain's leader, with the
// instances of every region in it. It wraps the region-level Coordinator
// (which allocates shares among regions) and stands between it and the
// instances:
//
//   - Every instance names itself (an id it keeps across reconnects). The
//     Fleet knows, per instance, what it may be applying and what it
//     acknowledged. A region's Ack goes to the Coordinator only for the
//     version that every instance that may hold share has acknowledged:
//     connected instances, and cut-off ones until their grant has
//     expired (Expires + MaxSkew on this clock). So an instance cut off
//     while the rest of its region stays connected holds its region's
//     lowering back until its grant expires; then it holds nothing.
//   - A region's share of a Weighted limit is divided among its live
//     instances by their demand (Grant.Weights), with the demarcation rule
//     the Coordinator applies to regions: an instance's part is raised
//     only out of what others have given up and acknowledged, so what a
//     region's instances may be applying together never exceeds the
//     region's share.
//   - Every grant carries an expiry, renewed at every rebalance for every
//     instance heard from within Config.DeadAfter.
//   - An instance that attaches (new or reconnecting) gets a full grant
//     first: every share of its region, its weights and an expiry. It
//     applies nothing else before that. A new instance's weights start at
//     what it says it holds (0 for a new process), so it holds nothing of
//     a Weighted limit until the rebalance gives it a part.
//   - An instance that does not name itself (an enforcer older than
//     instances) is counted as holding its region's whole share of every
//     Weighted limit while it is connected and for GrantTTL + MaxSkew
//     after; it never expires its grants itself.
//   - A Fleet that does not continue an earlier one of this process (a new
//     leader after a failover) cannot know which instances hold grants of
//     an earlier term: unless the domain never had a leader (an empty
//     snapshot), for GrantTTL + MaxSkew it forwards no region's ack and
//     raises no instance's weight above what the instance says it holds.
//
// Demand: each instance reports its own traffic; the Fleet keeps every
// instance's latest report as a rate and forwards one report per region
// whose amounts are the sum of its connected instances' rates.
//
// Like the Coordinator, a Fleet does no I/O and never reads the clock; it
// is not safe for concurrent use. The zero value is not usable; call
// NewFleet.
type Fleet struct {
	cfg      FleetConfig
	co       *Coordinator
	dom      *allot.Domain
	limits   []string // every limit, in configuration order
	weighted []string // the Weighted limits, in configuration order
	regions  []*fleetRegion
	regionOf map[string]int
	quiet    time.Time // until then, instances of an earlier leader may hold grants
	next     time.Time // of the next weight rebalance
	members  bool      // the instances that may hold grants changed: persist them
	stats    FleetStats
}

// FleetStats are a Fleet's counters and gauges, for metrics.
type FleetStats struct {
	Instances int    // instances that may hold share, over all regions
	Expired   uint64 // instances whose grant expired and were removed
	Grants    uint64 // grants sent
}

type fleetRegion struct {
	name   string
	insts  []*fleetInstance // in the order they attached
	byID   map[string]*fleetInstance
	shares *Applier  // the region's shares as the Coordinator last sent them
	sent   uint64    // version of the latest assignment the Coordinator sent the region
	acked  uint64    // version of the latest Ack forwarded to the Coordinator
	at     time.Time // At of the latest report forwarded
	cells  []cell    // scratch: one weighted limit's cells, by instance
	// since is when each limit's default share took its value (zero:
	// before any instance held share), for full grants.
	since map[string]time.Time
	// fresh: no instance of the region has held share yet, in a domain
	// that never had a leader before this Fleet.
	fresh bool
	// awaiting are the instances the previous leader persisted as members
	// that have not attached yet: until they have (or Fleet.quiet), they
	// may hold grants this Fleet does not know.
	awaiting map[string]bool
}

type fleetInstance struct {
	id       string
	legacy   bool
	attached bool
	heard    time.Time // latest message (hello, report, ack)
	gone     time.Time // legacy: when its stream ended
	acked    uint64    // latest region version of this term it acked
	seq      uint64    // latest grant sent
	ackedSeq uint64    // latest grant it acked
	changed  uint64    // seq of the latest grant with a changed weight
	expires  time.Time // Expires of the latest grant sent
	full     bool      // a full grant was sent since it attached
	lastAt   time.Time // At of its previous report
	fresh    bool      // reported since the region's latest forwarded report
	rates    streamReport
	w        []cell // by weighted limit
}

// streamReport is an instance's latest report as rates (cost per second)
// over the interval since its previous report.
type streamReport map[string]*limitRate // by limit

type limitRate struct {
	admitted, rejected float64
	keys               map[string]*keyRate
}

type keyRate struct {
	admitted, rejected float64
	near               bool // near its limit or with rejections
}

// NewFleet returns the Fleet of a leader elected with cfg.Coordinator.Term,
// starting from snap like New. prev, if not nil, is the Fleet this process
// ran for the domain until now (a new term after a configuration change):
// its instances, what they hold and what they acked of their grants are
// carried over, so the new term needs no quiet period.
func NewFleet(now time.Time, cfg FleetConfig, snap Snapshot, prev *Fleet) (*Fleet, error) {
	co, err := New(now, cfg.Coordinator, snap)
	if err != nil {
		return nil, err
	}
	if cfg.GrantTTL < 0 || cfg.MaxSkew < 0 {
		return nil, fmt.Errorf("%w: negative grant TTL or skew", ErrBadConfig)
	}
	cfg.GrantTTL = cmp.Or(cfg.GrantTTL, DefaultGrantTTL)
	cfg.MaxSkew = cmp.Or(cfg.MaxSkew, DefaultMaxSkew)
	d := cfg.Coordinator.Domain
	f := &Fleet{cfg: cfg, co: co, dom: d, regionOf: map[string]int{}}
	for _, l := range d.Limits {
		f.limits = append(f.limits, l.Name)
		if Weighted(l) {
			f.weighted = append(f.weighted, l.Name)
		}
	}
	fresh := prev == nil && snap.Term == 0
	for i, r := range d.Regions {
		app, err := NewApplier(d, r, snap)
		if err != nil {
			return nil, err
		}
		fr := &fleetRegion{name: r, byID: map[string]*fleetInstance{}, shares: app, since: map[string]time.Time{}, fresh: fresh}
		for _, l := range f.limits {
			if !fresh {
				fr.since[l] = now.Add(cfg.MaxSkew) // not known: from now on
			}
		}
		f.regions = append(f.regions, fr)
		f.regionOf[r] = i
	}
	if prev == nil {
		if snap.Term > 0 { // an earlier leader may have granted
			f.quiet = now.Add(cfg.GrantTTL + cfg.MaxSkew)
			if snap.Members != nil {
				// It said whom: a region waits only until those attached.
				for _, m := range snap.Members {
					if i, ok := f.regionOf[m.Region]; ok {
						fr := f.regions[i]
						if fr.awaiting == nil {
							fr.awaiting = map[string]bool{}
						}
						fr.awaiting[m.Instance] = true
					}
				}
			} else {
				for _, fr := range f.regions {
					fr.awaiting = map[string]bool{"": true} // not known: wait for the expiry
				}
			}
		}
		return f, nil
	}
	f.quiet = prev.quiet
	for _, pr := range prev.regions {
		i, ok := f.regionOf[pr.name]
		if !ok {
			continue
		}
		fr := f.regions[i]
		fr.fresh = pr.fresh
		for l, t := range pr.since {
			if _, ok := fr.since[l]; ok || fr.fresh {
				fr.since[l] = t
			}
		}
		for _, pi := range pr.insts {
			in := &fleetInstance{id: pi.id, legacy: pi.legacy, gone: pi.gone, expires: pi.expires, heard: pi.heard, w: make([]cell, len(f.weighted))}
			for j, l := range f.weighted {
				if k := slices.Index(prev.weighted, l); k >= 0 {
					in.w[j] = pi.w[k]
					in.w[j].bound = max(in.w[j].bound, in.w[j].share) // unacknowledged: either may apply
					in.w[j].flags = 0
				}
			}
			fr.insts = append(fr.insts, in) // detached: every stream reconnects to the new term
			fr.byID[in.id] = in
		}
	}
	return f, nil
}

// Coordinator returns the region-level Coordinator the Fleet drives, for
// its Stats. Do not Step or Tick it directly.
func (f *Fleet) Coordinator() *Coordinator { return f.co }

// Stats returns the Fleet's counters.
func (f *Fleet) Stats() FleetStats {
	s := f.stats
	for _, fr := range f.regions {
		s.Instances += len(fr.insts)
	}
	return s
}

func (f *Fleet) region(name string) (*fleetRegion, error) {
	i, ok := f.regionOf[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownRegion, name)
	}
	return f.regions[i], nil
}

// Attach tells the Fleet that an instance of region connected. hello is
// the latest assignment and grant it applied (Version and Seq 0: none) and
// weights what it holds of its latest grant; legacy says the instance does
// not know instances (id is then one the driver made up for its stream).
// The instance's first assignment is a full grant, returned in Send.
func (f *Fleet) Attach(now time.Time, region, id string, legacy bool, hello Ack, weights []Weight) (Ready, error) {
	fr, err := f.region(region)
	if err != nil {
		return Ready{}, err
	}
	if id == "" {
		return Ready{}, fmt.Errorf("%w: an instance without an id", ErrBadValue)
	}
	in := fr.byID[id]
	if in == nil {
		in = &fleetInstance{id: id, legacy: legacy, w: make([]cell, len(f.weighted))}
		for j := range in.w {
			in.w[j] = cell{} // a new instance holds nothing
		}
		if legacy {
			for j := range in.w {
				in.w[j] = cell{share: 1, bound: 1, target: 1}
			}
		}
		// What an instance unknown to this Fleet says it holds stays
		// counted as held (a new leader cannot know better).
		for _, w := range weights {
			if j := slices.Index(f.weighted, w.Limit); j >= 0 && w.Value >= 0 && w.Value <= 1 && !legacy {
				v := down32(w.Value)
				in.w[j] = cell{share: v, bound: up32(w.Value), target: v}
			}
		}
		fr.insts = append(fr.insts, in)
		fr.byID[id] = in
		f.members = true
	}
	delete(fr.awaiting, id)
	in.attached, in.full, in.heard = true, false, now
	if hello.Term == f.co.term && hello.Version <= fr.sent {
		in.acked = max(in.acked, hello.Version)
	}
	if hello.Term == f.co.term && hello.Seq <= in.seq {
		f.ackSeq(in, hello.Seq)
	}
	rd := f.evalAck(now, fr)
	f.moveWeights(now, fr, true, &rd) // a part for it at once, if one is free
	rd.Send = append(rd.Send, f.fullGrant(now, fr, in))
	f.membersOut(&rd)
	return rd, nil
}

// membersOut adds the instances that may hold grants to rd when they
// changed.
func (f *Fleet) membersOut(rd *Ready) {
	if !f.members {
		return
	}
	f.members = false
	rd.Term = f.co.term
	rd.Members = []Member{}
	for _, fr := range f.regions {
		for _, in := range fr.insts {
			rd.Members = append(rd.Members, Member{Region: fr.name, Instance: in.id})
		}
	}
}

// Detach tells the Fleet that an instance's stream ended. It keeps
// counting as holding what it was granted until its grant expires.
func (f *Fleet) Detach(now time.Time, region, id string) Ready {
	fr, err := f.region(region)
	if err != nil {
		return Ready{}
	}
	in := fr.byID[id]
	if in == nil {
		return Ready{}
	}
	in.attached = false
	if in.legacy {
		in.gone = now
	}
	return f.evalAck(now, fr)
}

// Step applies an instance's Report or Ack (Instance set) received at now.
// On error nothing is applied.
func (f *Fleet) Step(now time.Time, m Message) (Ready, error) {
	var domain, region, id string
	switch m := m.(type) {
	case Report:
		domain, region, id = m.Domain, m.Region, m.Instance
	case Ack:
		domain, region, id = m.Domain, m.Region, m.Instance
	default:
		return Ready{}, fmt.Errorf("%w: message %T", ErrBadValue, m)
	}
	if domain != f.co.domain {
		return Ready{}, fmt.Errorf("%w %q", ErrUnknownDomain, domain)
	}
	fr, err := f.region(region)
	if err != nil {
		return Ready{}, err
	}
	in := fr.byID[id]
	if in == nil || !in.attached {
		return Ready{}, fmt.Errorf("%w: instance %q of %s is not connected", ErrStale, id, region)
	}
	switch m := m.(type) {
	case Ack:
		if !in.full {
			return Ready{}, nil // it acks what it held before its grant expired
		}
		switch {
		case m.Term < f.co.term:
			return Ready{}, fmt.Errorf("%w: ack of term %d, leader's term is %d", ErrStale, m.Term, f.co.term)
		case m.Term > f.co.term || m.Version > fr.sent || m.Seq > in.seq:
			return Ready{}, fmt.Errorf("%w: %s/%s acked term %d version %d grant %d, latest sent is term %d version %d grant %d",
				ErrBadVersion, m.Region, id, m.Term, m.Version, m.Seq, f.co.term, fr.sent, in.seq)
		}
		in.heard = now
		if m.Leaving { // it holds nothing: what it held is free at once
			f.leave(fr, in)
			rd := f.evalAck(now, fr)
			f.moveWeights(now, fr, true, &rd)
			f.membersOut(&rd)
			return rd, nil
		}
		in.acked = max(in.acked, m.Version)
		freed := f.ackSeq(in, m.Seq)
		rd := f.evalAck(now, fr)
		if freed {
			f.moveWeights(now, fr, false, &rd)
		}
		return rd, nil
	case Report:
		if err := f.checkReport(in, m); err != nil {
			return Ready{}, err
		}
		in.heard = now
		in.rates, in.lastAt, in.fresh = rates(in, m), m.At, true
		if f.roundDone(fr, m.At) {
			if err := f.forwardReport(now, fr, m.At); err != nil {
				return Ready{}, err
			}
		}
		if !in.full { // heard again after its grant expired
			return Ready{Term: f.co.term, Send: []Assignment{f.fullGrant(now, fr, in)}}, nil
		}
	}
	return Ready{}, nil
}

// leave removes instance in of fr, which holds nothing.
func (f *Fleet) leave(fr *fleetRegion, in *fleetInstance) {
	delete(fr.byID, in.id)
	if i := slices.Index(fr.insts, in); i >= 0 {
		fr.insts = slices.Delete(fr.insts, i, i+1)
	}
	f.members = true
}

// ackSeq records that in applied grant seq; it reports whether that
// confirmed a change of its weights (which may free weight for others).
func (f *Fleet) ackSeq(in *fleetInstance, seq uint64) bool {
	in.ackedSeq = max(in.ackedSeq, seq)
	if in.changed == 0 || in.ackedSeq < in.changed {
		return false
	}
	in.changed = 0
	for j := range in.w {
		in.w[j].confirm()
	}
	return true
}

// quietIn reports whether instances of fr that this Fleet does not know
// may hold grants of an earlier leader at now.
func (f *Fleet) quietIn(now time.Time, fr *fleetRegion) bool {
	return len(fr.awaiting) > 0 && now.Before(f.quiet)
}

// holds reports whether instance in may be applying share at now: one
// that does not know instances while connected and for GrantTTL +
// MaxSkew after; any other while it is renewed, and until its latest
// grant's expiry plus MaxSkew.
func (f *Fleet) holds(now time.Time, in *fleetInstance) bool {
	switch {
	case in.legacy:
		return in.attached || now.Before(in.gone.Add(f.cfg.GrantTTL+f.cfg.MaxSkew))
	case f.renewable(now, in):
		return true
	}
	return !in.expires.IsZero() && now.Before(in.expires.Add(f.cfg.MaxSkew))
}

// renewable reports whether in gets its grant renewed: connected and
// heard from within DeadAfter.
func (f *Fleet) renewable(now time.Time, in *fleetInstance) bool {
	return in.attached && now.Sub(in.heard) < f.co.cfg.DeadAfter
}

// evalAck forwards the region's Ack of the latest version that every
// instance that may hold share has acked, if the Coordinator has not had
// it. A region none of whose instances holds anything acks its latest.
func (f *Fleet) evalAck(now time.Time, fr *fleetRegion) Ready {
	if f.quietIn(now, fr) {
		return Ready{}
	}
	v := fr.sent
	for _, in := range fr.insts {
		if f.holds(now, in) {
			v = min(v, in.acked)
		}
	}
	if v <= fr.acked {
		return Ready{}
	}
	rd, err := f.co.Step(now, Ack{Domain: f.co.domain, Region: fr.name, Term: f.co.term, Version: v})
	if err != nil {
		return Ready{} // cannot happen: v ≤ sent, this term
	}
	fr.acked = v
	return f.fanOut(now, rd)
}

// Tick rebalances regions (Coordinator.Tick) and instances' weights when a
// period has passed, removes instances whose grant has expired, and renews
// the grant of every live instance.
func (f *Fleet) Tick(now time.Time) Ready {
	rd := Ready{Term: f.co.term}
	for _, fr := range f.regions {
		for i := 0; i < len(fr.insts); {
			in := fr.insts[i]
			if f.holds(now, in) || in.attached && !in.full {
				i++
				continue
			}
			f.stats.Expired++
			if in.attached { // silent past its grant: it holds nothing now
				in.w, in.acked, in.full, in.changed = make([]cell, len(f.weighted)), 0, false, 0
				i++
				continue
			}
			delete(fr.byID, in.id)
			fr.insts = slices.Delete(fr.insts, i, i+1)
			f.members = true
		}
		merge(&rd, f.evalAck(now, fr))
	}
	merge(&rd, f.fanOut(now, f.co.Tick(now)))
	if now.Before(f.next) {
		f.membersOut(&rd)
		return rd
	}
	f.next = now.Add(f.co.cfg.Period)
	for _, fr := range f.regions {
		f.moveWeights(now, fr, true, &rd)
		// Renew every live instance that this pass sent nothing.
		for _, in := range fr.insts {
			if f.renewable(now, in) && in.full && !sentTo(rd.Send, fr.name, in.id) {
				rd.Send = append(rd.Send, f.grant(now, fr, in, Assignment{Domain: f.co.domain, Region: fr.name, Term: f.co.term}))
			}
		}
	}
	f.membersOut(&rd)
	return rd
}

func sentTo(as []Assignment, region, id string) bool {
	for _, a := range as {
		if a.Region == region && a.Instance == id {
			return true
		}
	}
	return false
}

func merge(dst *Ready, rd Ready) {
	dst.Persist = append(dst.Persist, rd.Persist...)
	dst.Send = append(dst.Send, rd.Send...)
	dst.Term = cmp.Or(rd.Term, dst.Term)
	dst.Version = max(dst.Version, rd.Version)
}

// fanOut turns the Coordinator's region assignments into one per
// instance that has had its full grant (the others get theirs when they
// attach), and records the region's shares.
func (f *Fleet) fanOut(now time.Time, rd Ready) Ready {
	out := Ready{Term: rd.Term, Version: rd.Version, Persist: rd.Persist}
	for _, a := range rd.Send {
		fr, err := f.region(a.Region)
		if err != nil {
			continue
		}
		fr.sent = max(fr.sent, a.Version)
		for _, sh := range a.Shares {
			if sh.Key == "" && sh.Value != fr.shares.Share(sh.Limit, "") {
				fr.since[sh.Limit] = now.Add(f.cfg.MaxSkew)
			}
		}
		fr.shares.Apply(a) // the Coordinator's own output: valid
		for _, in := range fr.insts {
			if in.attached && in.full {
				out.Send = append(out.Send, f.grant(now, fr, in, a))
			}
		}
	}
	return out
}

// fullGrant is in's first assignment on a stream: every share of its
// region at the latest version sent, and its grant.
func (f *Fleet) fullGrant(now time.Time, fr *fleetRegion, in *fleetInstance) Assignment {
	in.full = true
	shares := fr.shares.All()
	for i := range shares {
		if shares[i].Key == "" {
			shares[i].Since = fr.since[shares[i].Limit]
		}
	}
	a := Assignment{Domain: f.co.domain, Region: fr.name, Term: f.co.term, Version: fr.sent, Shares: shares}
	a = f.grant(now, fr, in, a)
	a.Grant.Full, a.Grant.Fresh = true, fr.fresh
	fr.fresh = false
	return a
}

// grant addresses assignment a to instance in with a new grant: its
// weights and a renewed expiry.
func (f *Fleet) grant(now time.Time, fr *fleetRegion, in *fleetInstance, a Assignment) Assignment {
	in.seq++
	in.expires = now.Add(f.cfg.GrantTTL)
	g := &Grant{Seq: in.seq, Expires: in.expires, Weights: make([]Weight, len(f.weighted))}
	changed := false
	for j, l := range f.weighted {
		g.Weights[j] = Weight{Limit: l, Value: float64(in.w[j].share)}
		if in.w[j].flags&dirty != 0 {
			in.w[j].flags &^= dirty
			changed = true
		}
	}
	if changed || in.changed != 0 {
		in.changed = in.seq // every grant carries all weights: the latest confirms them all
	}
	f.stats.Grants++
	a.Instance, a.Grant = in.id, g
	return a
}

// moveWeights moves the weights of fr's instances toward their targets
// (new targets first when retarget) and adds a grant for every instance
// whose weights changed to rd.
func (f *Fleet) moveWeights(now time.Time, fr *fleetRegion, retarget bool, rd *Ready) {
	if len(f.weighted) == 0 || len(fr.insts) == 0 {
		return
	}
	quiet := f.quietIn(now, fr)
	for j, l := range f.weighted {
		cs := fr.cells[:0]
		for _, in := range fr.insts {
			cs = append(cs, in.w[j])
		}
		if retarget {
			f.targets(now, fr, l, cs)
		}
		var clip func(int, float64) float64
		if quiet {
			clip = func(int, float64) float64 { return -1 } // no raise: lowerings only
		}
		grant(cs, nil, weightHysteresis/2, clip)
		for i, in := range fr.insts {
			in.w[j] = cs[i]
		}
		fr.cells = cs
	}
	for _, in := range fr.insts {
		moved := false
		for j := range in.w {
			moved = moved || in.w[j].flags&dirty != 0
		}
		if moved && in.attached && in.full { // a grant only (Version 0): the region's shares go with the Coordinator's assignments
			rd.Send = append(rd.Send, f.grant(now, fr, in, Assignment{Domain: f.co.domain, Region: fr.name, Term: f.co.term}))
		}
	}
}

// targets sets the target weights of limit l in fr (cs by instance): an
// instance that does not know instances holds everything while it may
// hold share; one that is not renewed (silent, or cut off) keeps what it
// has until its grant expires, as it cannot be taken back; the live ones
// share the rest, weightFloor of it evenly and the rest by their demand.
// Weights move only when one would move by more than weightHysteresis and
// by more than a third of what it is, so that noise in the demand of
// evenly loaded instances does not shuffle them.
func (f *Fleet) targets(now time.Time, fr *fleetRegion, l string, cs []cell) {
	legacy := -1
	live, demand, avail := 0, 0.0, 1.0
	for i, in := range fr.insts {
		switch {
		case in.legacy && f.holds(now, in):
			legacy = i
		case f.renewable(now, in):
			live++
			demand += in.demand(l)
		default:
			avail -= float64(cs[i].share)
		}
	}
	avail = max(avail, 0)
	moved := false
	want := make([]float32, len(cs))
	for i, in := range fr.insts {
		switch {
		case legacy >= 0:
			if i == legacy {
				want[i] = 1
			}
		case in.legacy:
		case !f.renewable(now, in):
			want[i] = cs[i].share // frozen until its grant expires
		case demand > 0:
			want[i] = down32(avail * (weightFloor/float64(live) + (1-weightFloor)*in.demand(l)/demand))
		default:
			want[i] = down32(avail / float64(live))
		}
		d := math.Abs(float64(want[i] - cs[i].share))
		if d > weightHysteresis && d > float64(max(want[i], cs[i].share))/3 {
			moved = true
		}
	}
	for i := range cs {
		cs[i].target = cs[i].share
		if moved {
			cs[i].target = want[i]
		}
	}
}

func (in *fleetInstance) demand(limit string) float64 {
	if lr := in.rates[limit]; lr != nil {
		return lr.admitted + lr.rejected
	}
	return 0
}

// checkReport refuses what the Coordinator would refuse of a report: an
// unknown limit, a bad amount, or one not later than the instance's
// previous.
func (f *Fleet) checkReport(in *fleetInstance, m Report) error {
	if !m.At.After(in.lastAt) {
		return fmt.Errorf("%w: report of %s/%s at %v, not after %v", ErrStale, m.Region, in.id, m.At, in.lastAt)
	}
	for _, ld := range m.Limits {
		if !slices.Contains(f.limits, ld.Limit) {
			return fmt.Errorf("%w %q", ErrUnknownLimit, ld.Limit)
		}
		if !validAmount(ld.Admitted) || !validAmount(ld.Rejected) {
			return fmt.Errorf("%w: limit %s: admitted %v, rejected %v", ErrBadValue, ld.Limit, ld.Admitted, ld.Rejected)
		}
		for _, kd := range ld.Keys {
			if kd.Key == "" || !validAmount(kd.Admitted) || !validAmount(kd.Rejected) {
				return fmt.Errorf("%w: limit %s: key %q: admitted %v, rejected %v", ErrBadValue, ld.Limit, kd.Key, kd.Admitted, kd.Rejected)
			}
		}
	}
	return nil
}

func reportInterval(from, to time.Time) time.Duration {
	if from.IsZero() {
		return defaultReportInterval
	}
	return min(max(to.Sub(from), minReportInterval), maxReportInterval)
}

// rates converts an instance's report into rates over the interval since
// its previous report (the first is taken to cover defaultReportInterval,
// as the Coordinator takes a region's first).
func rates(in *fleetInstance, m Report) streamReport {
	sr := streamReport{}
	perSec := 1 / reportInterval(in.lastAt, m.At).Seconds() // the first covers defaultReportInterval, as a region's does

	for _, ld := range m.Limits {
		lr := sr[ld.Limit]
		if lr == nil {
			lr = &limitRate{}
			sr[ld.Limit] = lr
		}
		lr.admitted += ld.Admitted * perSec
		lr.rejected += ld.Rejected * perSec
		for _, kd := range ld.Keys {
			if lr.keys == nil {
				lr.keys = map[string]*keyRate{}
			}
			kr := lr.keys[kd.Key]
			if kr == nil {
				kr = &keyRate{}
				lr.keys[kd.Key] = kr
			}
			kr.admitted += kd.Admitted * perSec
			kr.rejected += kd.Rejected * perSec
			kr.near = kr.near || kd.NearLimit || kd.Rejected > 0
		}
	}
	return sr
}

// maxForwardGap bounds how long a region's report waits for a connected
// instance that does not report.
const maxForwardGap = 2 * time.Second

// roundDone reports whether the region's report is due at at: every
// connected instance reported since the previous one (so the Coordinator
// gets one report per round of the instances' reports, not one per
// instance, each merging them all), or maxForwardGap has passed.
func (f *Fleet) roundDone(fr *fleetRegion, at time.Time) bool {
	if at.Sub(fr.at) >= maxForwardGap {
		return true
	}
	for _, in := range fr.insts {
		if in.attached && !in.fresh {
			return false
		}
	}
	return true
}

// forwardReport gives the Coordinator one report of the region at at, if
// later than the region's previous one (instances' clocks and reports
// interleave: a report not later only updates its instance's rates): its
// amounts are the sum over the region's connected instances of their
// rates times the interval since the region's previous report; a key is
// near its limit if any instance's latest report says so.
func (f *Fleet) forwardReport(now time.Time, fr *fleetRegion, at time.Time) error {
	if !at.After(fr.at) {
		return nil
	}
	dt := reportInterval(fr.at, at).Seconds()
	rep := Report{Domain: f.co.domain, Region: fr.name, At: at}
	for _, limit := range f.limits {
		var ld LimitDemand
		seen := false
		keys := map[string]*keyRate{}
		for _, in := range fr.insts {
			lr := in.rates[limit]
			if lr == nil || !in.attached {
				continue
			}
			seen = true
			ld.Admitted += lr.admitted
			ld.Rejected += lr.rejected
			for k, kr := range lr.keys {
				sum := keys[k]
				if sum == nil {
					sum = &keyRate{}
					keys[k] = sum
				}
				sum.admitted += kr.admitted
				sum.rejected += kr.rejected
				sum.near = sum.near || kr.near
			}
		}
		if !seen {
			continue
		}
		ld.Limit = limit
		ld.Admitted, ld.Rejected = amount(ld.Admitted*dt), amount(ld.Rejected*dt)
		ks := make([]string, 0, len(keys))
		for k := range keys {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		for _, k := range ks {
			kr := keys[k]
			ld.Keys = append(ld.Keys, KeyDemand{Key: k, Admitted: amount(kr.admitted * dt), Rejected: amount(kr.rejected * dt), NearLimit: kr.near})
		}
		rep.Limits = append(rep.Limits, ld)
	}
	if _, err := f.co.Step(now, rep); err != nil {
		return err
	}
	fr.at = at
	for _, in := range fr.insts {
		in.fresh = false
	}
	return nil
}

func amount(v float64) float64 { return min(v, allot.MaxAmount) }
