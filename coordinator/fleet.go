package coordinator

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
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
	// keyRest is a hot key's rest factor when it reaches few of a
	// region's instances: the instances without a weight of their own for
	// it apply keyRest × their weight for the limit to it, so together at
	// most keyRest of it, and the weights of their own share the other
	// 1 − keyRest. Small, so that a key that reaches 10 of 200 instances
	// gets its allowance there; an instance that starts seeing it has
	// little of it until it reports the key and a rebalance gives it a
	// weight of its own.
	keyRest = 0.02
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
//   - A hot key of a Weighted limit that reaches few of a region's
//     instances is divided among those that reported it near its limit or
//     rejected (weights of their own for the key, by their demand for
//     it), the same way: the region's other instances apply
//     keyRest × their weight for the limit to it (the key's rest factor,
//     sent to every instance of the region), so together at most keyRest
//     of it, and the weights of their own share the rest. A key that
//     reaches many is divided by the limit's weights, as every other key.
//     See moveKeys.
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
// whose amounts are the sum of its connected instances' rates. Weights
// follow each instance's demand for the limit averaged in time (see
// average).
//
// State and work: per instance, one cell per Weighted limit and one per
// hot key it reported (while it reports it, and HotTTL less a period
// after); per hot key with weights of its own, its rest factor. A
// rebalance is proportional to instances × their own hot keys.
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
	// long is, by Weighted limit, its window where it is a sliding window
	// longer than the period (0: otherwise): its weights move once a
	// window (see timedWeights).
	long []time.Duration
	// amount is, by Weighted limit, its amount a window where it counts
	// requests (0: otherwise), for one request's weight (see divide).
	amount   []float64
	regions  []*fleetRegion
	regionOf map[string]int
	quiet    time.Time // until then, instances of an earlier leader may hold grants
	next     time.Time // of the next weight rebalance
	members  bool      // the instances that may hold grants changed: persist them
	// goneIn is, by region the configuration no longer lists, the
	// instances of the previous term that may still apply share of it
	// (prev, NewFleet): once each has said it left (a leaving Hello), the
	// region's hold ends. A region whose holders are not all known (a
	// legacy instance, or a quiet period) is not in it.
	goneIn map[string]map[string]bool
	// pool is, by limit and hot key (empty: the default vector), what
	// instances released of the current window of a Weighted limit with a
	// long window (docs/adr/0005) that no grant has handed out yet. A
	// window no longer than the period begins again before the next
	// rebalance: moving allowance within it is not worth a message.
	pool map[keyID]pooled
	// wanters are, by limit and key, the instances with a want of it, in
	// the order their wants came.
	wanters map[keyID][]*fleetInstance
	// keyed is, by Weighted limit, the latest instant (unix ns) a hot key
	// of it was given a share of its own in a region, or lost one, or lost
	// a weight of its own at an instance: see movable.
	keyed []int64
	stats FleetStats
}

// pooled is allowance of one window of a Weighted sliding-window limit,
// a fraction of the limit: released by instances (Ack.Released), not yet
// handed out as extras (Grant.Extras).
type pooled struct {
	win   int64 // the window's start (unix ns)
	value float64
}

// maxPooled bounds the limits and hot keys a Fleet pools releases of, and
// those each instance is known to want allowance for.
const maxPooled = 1 << 16

// FleetStats are a Fleet's counters and gauges, for metrics.
type FleetStats struct {
	Instances int    // instances that may hold share, over all regions
	Expired   uint64 // instances whose grant expired and were removed
	Grants    uint64 // grants sent
	// KeyWeights are the instances' weights of their own for hot keys
	// (held, or being given), over all regions; RestFactors the hot keys
	// with a rest factor below 1.
	KeyWeights  int
	RestFactors int
}

type fleetRegion struct {
	name   string
	insts  []*fleetInstance // in the order they attached
	byID   map[string]*fleetInstance
	shares *Applier  // the region's shares as the Coordinator last sent them
	sent   uint64    // version of the latest assignment the Coordinator sent the region
	acked  uint64    // version of the latest Ack forwarded to the Coordinator
	at     time.Time // At of the latest report forwarded
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
	// keys are the hot keys of Weighted limits that instances of the
	// region reported, or that have a rest factor; keyList the same, in
	// the order they appeared, for passes in a fixed order.
	keys    map[keyID]*fleetKey
	keyList []*fleetKey
	nkeys   []int // len(keyList) by Weighted limit
	// restVer counts the changes of rest factors; restMin is the latest
	// one that every instance that may hold share has acked (as of the
	// latest moveKeys).
	restVer uint64
	restMin uint64
	// restLog are the changes of rest factors after restFrom (those up to
	// it are trimmed), in order: a grant carries those after what its
	// instance acked.
	restLog  []restChange
	restFrom uint64
	// slot is, by Weighted limit with a long window, the boundary its
	// weights were last moved for (see timedWeights).
	slot []int64
	// Scratch space of moveWeights: one vector's cells, by instance.
	cells  []cell
	want   []float32
	state  []uint8
	demand []float64
}

type fleetInstance struct {
	id       string
	legacy   bool
	keyAware bool // it applies weights of their own and rest factors (KeyAware in its hello)
	attached bool
	heard    time.Time // latest message (hello, report, ack)
	gone     time.Time // legacy: when its stream ended
	acked    uint64    // latest region version of this term it acked
	seq      uint64    // latest grant sent
	ackedSeq uint64    // latest grant it acked
	changed  uint64    // seq of the latest grant with a changed weight
	granted  time.Time // when the latest grant was sent
	expires  time.Time // Expires of the latest grant sent
	full     bool      // a full grant was sent since it attached
	lastAt   time.Time // At of its previous report
	lastRecv time.Time // when the coordinator took it
	fresh    bool      // reported since the region's latest forwarded report
	// started is when a new instance (one that never applied an
	// assignment) attached, until its first report: that report covers
	// the time since it started, not a report interval.
	started time.Time
	rates   streamReport
	w       []cell // by weighted limit
	// helloAt is when its latest hello was sent (Ack.SentAt, its clock),
	// helloRecv when the coordinator took it: a grant echoes them while
	// no report has come (ClockEcho).
	helloAt, helloRecv time.Time
	// keys are its weights of its own for hot keys, in the order they
	// appeared; byKey the same, by key.
	keys  []*keyCell
	byKey map[keyID]*keyCell
	// restAcked is the latest change of rest factors it acked (it holds
	// them all); restSent, the rest factors' version each grant it has not
	// acked yet carries, by seq.
	restAcked uint64
	restSent  []seqVer
	moved     bool // scratch of moveWeights: it needs a grant
	// wants is what it wants of the current window of Weighted limits
	// (Ack.Wanted), by limit and hot key, less the extras sent since.
	wants map[keyID]pooled
}

type seqVer struct{ seq, ver uint64 }

// restChange is change ver of rest factors: key k's.
type restChange struct {
	ver uint64
	k   *fleetKey
}

// setRest sets key k's rest factor to v, a new change: a lowering is held
// at the old bound until every instance acked it.
func (fr *fleetRegion) setRest(k *fleetKey, v float32) {
	fr.restVer++
	k.rest.share, k.rest.target, k.rest.bound, k.restVer = v, v, max(k.rest.bound, v), fr.restVer
	fr.restLog = append(fr.restLog, restChange{fr.restVer, k})
}

// trimRestLog drops the changes of rest factors that every instance that
// may hold share acked.
func (fr *fleetRegion) trimRestLog() {
	i := 0
	for i < len(fr.restLog) && fr.restLog[i].ver <= fr.restMin {
		i++
	}
	if i > 0 {
		fr.restLog = slices.Delete(fr.restLog, 0, i)
		fr.restFrom = max(fr.restFrom, fr.restMin)
	}
}

// fleetKey is one hot key of a Weighted limit in one region: the
// instances' weights of their own for it, and its rest factor.
type fleetKey struct {
	id    keyID
	limit int        // index in Fleet.weighted
	cells []*keyCell // by instance, in the order they appeared
	pos   int        // in fleetRegion.keyList
	// rest is the key's rest factor, the part of its weight for the limit
	// that an instance without a weight of its own for the key applies to
	// it (target: 1 or keyRest); its bound is confirmed once every
	// instance that may hold share acked restVer, the change that set it.
	rest    cell
	restVer uint64
	// apart: the weights of their own are divided within 1 − the rest
	// factor (held ≤ keyRest, confirmed), whatever the limit's weights.
	// Otherwise each is at most the instance's weight for the limit, and
	// changes with it.
	apart bool
}

// keyCell is one instance's weight of its own for one hot key. Its
// demand is an average of the instance's demand for the key.
type keyCell struct {
	in  *fleetInstance
	k   *fleetKey
	c   cell
	hot int64 // unix ns when the instance last reported the key near its limit or rejected
	// streak counts its latest reports in a row that said so (up to 255).
	streak uint8
	kpos   int32 // in k.cells
	ipos   int32 // in in.keys
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
	if cfg.GrantTTL < 0 || cfg.MaxSkew < 0 {
		return nil, fmt.Errorf("%w: negative grant TTL or skew", ErrBadConfig)
	}
	cfg.GrantTTL = cmp.Or(cfg.GrantTTL, DefaultGrantTTL)
	cfg.MaxSkew = cmp.Or(cfg.MaxSkew, DefaultMaxSkew)
	// A region the configuration no longer lists keeps what it held until
	// its instances' grants have expired: as prev knew them (an instance
	// that left holds nothing), or a grant TTL from now.
	if cfg.Coordinator.GoneHold == 0 {
		cfg.Coordinator.GoneHold = cfg.GrantTTL + cfg.MaxSkew
		if prev != nil {
			cfg.Coordinator.GoneHold = prev.goneHold(now, cfg.Coordinator.Domain)
		}
	}
	co, err := New(now, cfg.Coordinator, snap)
	if err != nil {
		return nil, err
	}
	d := cfg.Coordinator.Domain
	f := &Fleet{cfg: cfg, co: co, dom: d, regionOf: map[string]int{}}
	for _, l := range d.Limits {
		f.limits = append(f.limits, l.Name)
		if Weighted(l) {
			f.weighted = append(f.weighted, l.Name)
			var w time.Duration
			if co.longWindow(l) {
				w = l.Rate.Period
			}
			f.long = append(f.long, w)
			var a float64
			if l.Unit == allot.Requests {
				a = float64(l.Rate.Amount)
			}
			f.amount = append(f.amount, a)
		}
	}
	// An earlier leader persisted records (Term) or at least whom it
	// granted (Members: a Ready of members only writes no Term).
	earlier := snap.Term > 0 || snap.Members != nil
	fresh := prev == nil && !earlier
	// A new leader pools nothing, and from the next window only: what an
	// earlier one granted of this one it does not know. The first leader
	// of a fleet pools from its start: nothing was granted before it.
	f.pool, f.wanters, f.keyed = map[keyID]pooled{}, map[keyID][]*fleetInstance{}, make([]int64, len(f.weighted))
	for j := range f.keyed {
		if !fresh {
			f.keyed[j] = now.UnixNano()
		}
	}
	for i, r := range d.Regions {
		app, err := NewApplier(d, r, snap)
		if err != nil {
			return nil, err
		}
		fr := &fleetRegion{name: r, byID: map[string]*fleetInstance{}, shares: app, since: map[string]time.Time{}, fresh: fresh,
			keys: map[keyID]*fleetKey{}, nkeys: make([]int, len(f.weighted))}
		for _, l := range f.limits {
			if !fresh {
				fr.since[l] = now.Add(cfg.MaxSkew) // not known: from now on
			}
		}
		f.regions = append(f.regions, fr)
		f.regionOf[r] = i
	}
	if prev == nil {
		if earlier { // an earlier leader may have granted
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
	for r, holders := range prev.goneIn { // dropped before prev: still held
		if !slices.Contains(d.Regions, r) {
			if f.goneIn == nil {
				f.goneIn = map[string]map[string]bool{}
			}
			f.goneIn[r] = maps.Clone(holders)
		}
	}
	for _, pr := range prev.regions {
		i, ok := f.regionOf[pr.name]
		if !ok {
			if holders, known := prev.holders(now, pr); known && len(holders) > 0 {
				if f.goneIn == nil {
					f.goneIn = map[string]map[string]bool{}
				}
				f.goneIn[pr.name] = holders
			}
			continue
		}
		fr := f.regions[i]
		fr.fresh = pr.fresh
		// No log: a grant after it carries every rest factor that changed.
		fr.restVer, fr.restFrom = pr.restVer, pr.restVer
		// Still not attached: they may hold grants of the leader before prev.
		fr.awaiting = maps.Clone(pr.awaiting)
		for l, t := range pr.since {
			if _, ok := fr.since[l]; ok || fr.fresh {
				fr.since[l] = t
			}
		}
		for _, pk := range pr.keyList { // rest factors: every instance keeps its own across the new term
			if j := slices.Index(f.weighted, prev.weighted[pk.limit]); j >= 0 {
				k := f.key(fr, j, pk.id)
				k.rest, k.restVer, k.apart = pk.rest, pk.restVer, pk.apart
				k.rest.flags = 0
			}
		}
		for _, pi := range pr.insts {
			in := &fleetInstance{id: pi.id, legacy: pi.legacy, keyAware: pi.keyAware, gone: pi.gone, expires: pi.expires, heard: pi.heard,
				w: make([]cell, len(f.weighted)), restAcked: pi.restAcked}
			for j, l := range f.weighted {
				if k := slices.Index(prev.weighted, l); k >= 0 {
					in.w[j] = pi.w[k]
					in.w[j].bound = max(in.w[j].bound, in.w[j].share) // unacknowledged: either may apply
					in.w[j].flags = 0
				}
			}
			fr.insts = append(fr.insts, in) // detached: every stream reconnects to the new term
			fr.byID[in.id] = in
			for _, pc := range pi.keys {
				if j := slices.Index(f.weighted, prev.weighted[pc.k.limit]); j >= 0 {
					kc := f.addCell(fr, in, j, pc.k.id)
					kc.c = cell{share: pc.c.share, bound: max(pc.c.bound, pc.c.share), target: pc.c.share, demand: pc.c.demand}
					kc.hot = pc.hot
				}
			}
		}
		fr.restMin = restMin(f, now, fr)
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
		for _, k := range fr.keyList {
			s.KeyWeights += len(k.cells)
			if k.rest.share < 1 {
				s.RestFactors++
			}
		}
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
//
// A hello with Leaving comes from an instance that left and holds
// nothing: what it held is free at once, and no grant is sent. It may
// come from a region the configuration no longer lists, whose hold
// (Config.GoneHold) ends once every instance that may have applied share
// of it left.
func (f *Fleet) Attach(now time.Time, region, id string, legacy bool, hello Ack, weights []Weight) (Ready, error) {
	if id == "" {
		return Ready{}, fmt.Errorf("%w: an instance without an id", ErrBadValue)
	}
	fr, err := f.region(region)
	if err != nil {
		if hello.Leaving && f.goneIn[region][id] {
			f.leftGone(region, id)
			return Ready{}, nil
		}
		return Ready{}, err
	}
	if hello.Leaving && !legacy {
		delete(fr.awaiting, id)
		in := fr.byID[id]
		if in == nil {
			return Ready{}, nil
		}
		f.leave(fr, in)
		rd := f.evalAck(now, fr)
		f.moveWeights(now, fr, true, nil, &rd)
		f.membersOut(now, &rd)
		return rd, nil
	}
	in := fr.byID[id]
	if in == nil {
		in = &fleetInstance{id: id, legacy: legacy, w: make([]cell, len(f.weighted))}
		if legacy {
			for j := range in.w {
				in.w[j] = cell{share: 1, bound: 1, target: 1}
			}
		}
		fr.insts = append(fr.insts, in)
		fr.byID[id] = in
		f.members = true
		if !legacy {
			f.held(fr, in, weights)
		}
	}
	delete(fr.awaiting, id)
	in.attached, in.full, in.heard = true, false, now
	in.helloAt, in.helloRecv = hello.SentAt, now
	if hello.Term == 0 && in.lastAt.IsZero() {
		in.started = now
	}
	in.keyAware = !legacy && slices.Contains(weights, KeyAware)
	if hello.Term == f.co.term && hello.Version <= fr.sent {
		in.acked = max(in.acked, hello.Version)
	}
	if hello.Term == f.co.term && hello.Seq <= in.seq {
		f.ackSeq(in, hello.Seq)
	}
	rd := f.evalAck(now, fr)
	if recs := f.co.Unsaved(now); recs != nil { // persisted before the grant goes out
		rd.Persist = append(recs, rd.Persist...)
		rd.Term, rd.Version = f.co.term, max(rd.Version, f.co.version)
	}
	f.moveWeights(now, fr, true, nil, &rd) // a part for it at once, if one is free
	rd.Send = append(rd.Send, f.fullGrant(now, fr, in))
	f.membersOut(now, &rd)
	return rd, nil
}

// held counts what an instance unknown to this Fleet says it holds as
// held (a new leader cannot know better): its weights, its own for hot
// keys, and the rest factors it applies (a key's rest factor is then
// known only to be at most 1 elsewhere).
func (f *Fleet) held(fr *fleetRegion, in *fleetInstance, weights []Weight) {
	for _, w := range weights {
		j := slices.Index(f.weighted, w.Limit)
		if j < 0 || !(w.Value >= 0 && w.Value <= 1) || w.Key == "" && w.Rest {
			continue
		}
		v := down32(w.Value)
		c := cell{share: v, bound: up32(w.Value), target: v}
		id := keyID{w.Limit, w.Key}
		switch {
		case w.Key == "":
			in.w[j] = c
		case w.Rest:
			k := f.key(fr, j, id)
			if k.restVer == 0 { // a factor this Fleet never set: keep it, counted at most 1
				fr.setRest(k, v)
			}
		case in.byKey[id] == nil:
			f.addCell(fr, in, j, id).c = c
		}
	}
}

// membersOut adds the instances that may hold grants at now to rd when
// they changed: this Fleet's, and during its quiet period those of an
// earlier leader that have not attached yet (Instance "" for a region
// whose earlier instances are not known), so that a leader after this
// one waits for them too.
func (f *Fleet) membersOut(now time.Time, rd *Ready) {
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
		if now.Before(f.quiet) {
			for _, id := range slices.Sorted(maps.Keys(fr.awaiting)) {
				rd.Members = append(rd.Members, Member{Region: fr.name, Instance: id})
			}
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
		for _, r := range slices.Concat(m.Released, m.Wanted) {
			if !(r.Value >= 0 && r.Value <= 1) {
				return Ready{}, fmt.Errorf("%w: %s/%s moved %v of %q %q", ErrBadValue, m.Region, id, r.Value, r.Limit, r.Key)
			}
		}
		in.heard = now
		var touched []keyID
		if !m.Leaving && !in.legacy && (m.Seq > in.ackedSeq || m.Version > in.acked) { // a new ack: what it moved is new
			touched = f.pooling(now, in, m)
		}
		if m.Leaving { // it holds nothing: what it held is free at once
			f.leave(fr, in)
			rd := f.evalAck(now, fr)
			f.moveWeights(now, fr, true, nil, &rd)
			f.membersOut(now, &rd)
			return rd, nil
		}
		in.acked = max(in.acked, m.Version)
		freed := f.ackSeq(in, m.Seq)
		rd := f.evalAck(now, fr)
		switch {
		case restMin(f, now, fr) > fr.restMin: // every instance now has a rest factor that may free weight
			f.moveWeights(now, fr, false, nil, &rd)
		case freed:
			f.moveWeights(now, fr, false, in, &rd)
		}
		f.fill(now, touched, &rd)
		return rd, nil
	case Report:
		if m.At.Equal(in.lastAt) && !m.At.IsZero() {
			return Ready{}, nil // sent again on a new stream (regional/node.Node.LastReport): taken already
		}
		if err := f.checkReport(in, m); err != nil {
			return Ready{}, err
		}
		in.heard = now
		dt := reportInterval(in.lastAt, m.At)
		if in.lastAt.IsZero() && !in.started.IsZero() {
			dt = min(max(now.Sub(in.started), minReportInterval), defaultReportInterval)
		}
		in.rates, in.lastAt, in.lastRecv, in.fresh, in.started = rates(m, dt), m.At, now, true, time.Time{}
		f.average(in, dt)
		if !in.legacy {
			f.noteHot(now, fr, in, m, dt)
		}
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

// goneHold returns how long after now an instance of a region that d no
// longer lists may still apply share it was granted: until its latest
// grant's expiry plus the tolerated skew, a grant TTL plus the skew for
// one whose expiry it does not know (one of an earlier leader it still
// awaited, or a legacy one), and never for one that left. It returns a
// negative duration if none may (Config.GoneHold: no hold).
func (f *Fleet) goneHold(now time.Time, d *allot.Domain) time.Duration {
	hold := time.Duration(-1)
	for _, fr := range f.regions {
		if slices.Contains(d.Regions, fr.name) {
			continue
		}
		if f.quietIn(now, fr) {
			return f.cfg.GrantTTL + f.cfg.MaxSkew
		}
		for _, in := range fr.insts {
			switch {
			case !f.holds(now, in):
			case in.legacy:
				return f.cfg.GrantTTL + f.cfg.MaxSkew
			default:
				hold = max(hold, in.expires.Add(f.cfg.MaxSkew).Sub(now))
			}
		}
	}
	return hold
}

// holders returns the instances of fr that may apply share at now, and
// whether they are all known: not during a quiet period, and none of
// them legacy (its id is its stream's, not its own).
func (f *Fleet) holders(now time.Time, fr *fleetRegion) (map[string]bool, bool) {
	if f.quietIn(now, fr) {
		return nil, false
	}
	out := map[string]bool{}
	for _, in := range fr.insts {
		switch {
		case !f.holds(now, in):
		case in.legacy:
			return nil, false
		default:
			out[in.id] = true
		}
	}
	return out, true
}

// leftGone records that instance id of region, which the configuration
// no longer lists, left: once none that may apply share of it is left,
// the region holds nothing.
func (f *Fleet) leftGone(region, id string) {
	delete(f.goneIn[region], id)
	if len(f.goneIn[region]) == 0 {
		delete(f.goneIn, region)
		f.co.releaseGone(region)
	}
}

// leave removes instance in of fr, which holds nothing.
func (f *Fleet) leave(fr *fleetRegion, in *fleetInstance) {
	f.dropCells(fr, in)
	f.dropWants(in)
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
	i := 0
	for i < len(in.restSent) && in.restSent[i].seq <= in.ackedSeq {
		in.restAcked = max(in.restAcked, in.restSent[i].ver)
		i++
	}
	in.restSent = in.restSent[i:]
	if in.changed == 0 || in.ackedSeq < in.changed {
		return false
	}
	in.changed = 0
	for j := range in.w {
		in.w[j].confirm()
	}
	for _, kc := range in.keys {
		kc.c.confirm()
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
			f.dropCells(fr, in)
			if in.attached { // silent past its grant: it holds nothing now
				in.w, in.acked, in.full, in.changed = make([]cell, len(f.weighted)), 0, false, 0
				i++
				continue
			}
			delete(fr.byID, in.id)
			fr.insts = slices.Delete(fr.insts, i, i+1)
			f.members = true
			f.dropWants(in)
		}
		merge(&rd, f.evalAck(now, fr))
	}
	merge(&rd, f.fanOut(now, f.co.Tick(now)))
	if now.Before(f.next) {
		f.membersOut(now, &rd)
		return rd
	}
	f.next = now.Add(f.co.cfg.Period)
	f.prunePool(now)
	for _, fr := range f.regions {
		f.moveWeights(now, fr, true, nil, &rd)
		// Renew every live instance that this pass sent nothing.
		for _, in := range fr.insts {
			if f.renewable(now, in) && in.full && !in.granted.Equal(now) {
				rd.Send = append(rd.Send, f.grantOnly(now, fr, in))
			}
		}
	}
	f.membersOut(now, &rd)
	return rd
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
			switch {
			case sh.Key == "" && sh.Value != fr.shares.Share(sh.Limit, ""):
				fr.since[sh.Limit] = now.Add(f.cfg.MaxSkew)
			case sh.Key != "":
				if j := slices.Index(f.weighted, sh.Limit); j >= 0 {
					f.keyed[j] = now.UnixNano()
				}
			}
		}
		fr.shares.Apply(a) // the Coordinator's own output: valid
		for _, in := range fr.insts {
			if in.attached && in.full {
				out.Send = append(out.Send, f.grant(now, fr, in, a, false))
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
	a = f.grant(now, fr, in, a, true)
	a.Grant.Fresh = fr.fresh
	fr.fresh = false
	return a
}

// grant addresses assignment a to instance in with a new grant: its
// weights (for the limits, and its own for hot keys), the rest factors
// and a renewed expiry. A full grant carries every rest factor below 1
// (the instance drops any other), another those changed since the latest
// the instance acked.
func (f *Fleet) grant(now time.Time, fr *fleetRegion, in *fleetInstance, a Assignment, full bool) Assignment {
	in.seq++
	in.granted, in.expires = now, now.Add(f.cfg.GrantTTL)
	g := &Grant{Seq: in.seq, Expires: in.expires, Full: full, Weights: make([]Weight, len(f.weighted), len(f.weighted)+len(in.keys))}
	changed := false
	for j, l := range f.weighted {
		g.Weights[j] = Weight{Limit: l, Value: float64(in.w[j].share)}
		if in.w[j].flags&dirty != 0 {
			in.w[j].flags &^= dirty
			changed = true
		}
	}
	for _, kc := range in.keys { // an instance that is not KeyAware has none
		if kc.c.share > 0 { // none: it applies the rest factor
			g.Weights = append(g.Weights, Weight{Limit: kc.k.id.limit, Key: kc.k.id.key, Value: float64(kc.c.share)})
		}
		if kc.c.flags&dirty != 0 {
			kc.c.flags &^= dirty
			changed = true
		}
	}
	if in.keyAware && (full || in.restAcked < fr.restVer) { // an older one would take them for its weights
		rest := func(k *fleetKey) Weight {
			return Weight{Limit: k.id.limit, Key: k.id.key, Value: float64(k.rest.share), Rest: true}
		}
		switch {
		case !full && in.restAcked >= fr.restFrom: // the changes since: from the log
			i, _ := slices.BinarySearchFunc(fr.restLog, in.restAcked+1, func(c restChange, v uint64) int { return cmp.Compare(c.ver, v) })
			for _, c := range fr.restLog[i:] {
				if c.k.restVer == c.ver && fr.keys[c.k.id] == c.k { // its latest change, of a key still there
					g.Weights = append(g.Weights, rest(c.k))
				}
			}
		default:
			for _, k := range fr.keyList {
				if full && k.rest.share < 1 || !full && k.restVer > in.restAcked {
					g.Weights = append(g.Weights, rest(k))
				}
			}
		}
		if len(in.restSent) == maxRestSent { // acks are late: forget the oldest, and wait for a later one
			in.restSent = slices.Delete(in.restSent, 0, 1)
		}
		in.restSent = append(in.restSent, seqVer{in.seq, fr.restVer})
	}
	if changed || in.changed != 0 {
		in.changed = in.seq // every grant carries all weights: the latest confirms them all
	}
	for j, l := range f.weighted {
		if f.movable(now, j) {
			g.Pooled = append(g.Pooled, l)
		}
		if f.long[j] > 0 {
			g.PooledKeys = append(g.PooledKeys, l)
		}
	}
	f.stats.Grants++
	a.Instance, a.Grant = in.id, g
	switch {
	case !in.lastAt.IsZero():
		a.Clock = &ClockEcho{ReportAt: in.lastAt, Received: in.lastRecv, Sent: now}
	case !in.helloAt.IsZero():
		// Before its first report: its hello's, so that it knows its
		// clock from its first grant on (and may move allowance from
		// then on: see regional/node).
		a.Clock = &ClockEcho{ReportAt: in.helloAt, Received: in.helloRecv, Sent: now}
	}
	return a
}

// grantOnly is a grant to in with no shares (Version 0): the region's
// shares go with the Coordinator's assignments.
func (f *Fleet) grantOnly(now time.Time, fr *fleetRegion, in *fleetInstance) Assignment {
	return f.grant(now, fr, in, Assignment{Domain: f.co.domain, Region: fr.name, Term: f.co.term}, false)
}

// window returns the start (unix ns) of the window of the j-th Weighted
// limit that holds now (0: not a long window).
func (f *Fleet) window(j int, now time.Time) int64 {
	per := int64(f.long[j])
	if per <= 0 {
		return 0
	}
	t := now.UnixNano()
	return t - t%per
}

// movable reports whether allowance of the j-th Weighted limit may move
// within the window that holds now: a long window none of whose hot
// keys has had a share or a weight of its own anywhere since the window
// began (nor a leader other than this Fleet). Engine.MoveShare releases,
// and AddExtra adds to, the default vector and the keys that follow it
// only: a key with a share of its own at the giver would keep what it
// could spend while the receiver's following key spent it too.
func (f *Fleet) movable(now time.Time, j int) bool {
	if f.long[j] <= 0 || f.keyed[j] >= f.window(j, now) {
		return false
	}
	for _, fr := range f.regions {
		if fr.nkeys[j] > 0 || fr.shares.keyed[f.weighted[j]] > 0 {
			return false
		}
	}
	return true
}

// pooling takes what in's new ack m released into the pool, and what it
// wants, and returns the limits and keys whose pool grew or that in now
// wants. A release counts of the current window only, of a long window
// (and of its default vector, one whose allowance may move, see movable);
// the pool holds at most all of the limit. A want replaces the one known.
func (f *Fleet) pooling(now time.Time, in *fleetInstance, m Ack) []keyID {
	var touched []keyID
	for _, r := range m.Released {
		j := slices.Index(f.weighted, r.Limit)
		if j < 0 || f.long[j] <= 0 || r.Key == "" && !f.movable(now, j) || !(r.Value > 0) {
			continue
		}
		w, id := f.window(j, now), keyID{r.Limit, r.Key}
		p, ok := f.pool[id]
		if r.Window.IsZero() || r.Window.UnixNano() != w || !ok && len(f.pool) >= maxPooled {
			continue // late (that window is over here), or too many
		}
		if p.win != w {
			p = pooled{win: w}
		}
		p.value = min(p.value+r.Value, 1)
		f.pool[id] = p
		touched = append(touched, id)
	}
	for _, r := range m.Wanted {
		j := slices.Index(f.weighted, r.Limit)
		if j < 0 || f.long[j] <= 0 {
			continue
		}
		id := keyID{r.Limit, r.Key}
		if w := f.window(j, now); r.Window.IsZero() || r.Window.UnixNano() != w || !(r.Value > 0) {
			f.unwant(in, id)
			continue
		}
		if in.wants == nil {
			in.wants = map[keyID]pooled{}
		}
		_, ok := in.wants[id]
		if !ok && (len(in.wants) >= maxPooled || len(f.wanters) >= maxPooled) {
			continue
		}
		in.wants[id] = pooled{win: r.Window.UnixNano(), value: r.Value}
		if !ok {
			f.wanters[id] = append(f.wanters[id], in)
		}
		touched = append(touched, id)
	}
	return touched
}

// prunePool drops what the pool and the instances' wants hold of windows
// that are over.
func (f *Fleet) prunePool(now time.Time) {
	stale := func(id keyID, win int64) bool {
		j := slices.Index(f.weighted, id.limit)
		return j < 0 || f.window(j, now) != win
	}
	maps.DeleteFunc(f.pool, func(id keyID, p pooled) bool { return stale(id, p.win) })
	for id, ins := range f.wanters {
		for _, in := range slices.Clone(ins) {
			if stale(id, in.wants[id].win) {
				f.unwant(in, id)
			}
		}
	}
}

// dropWants drops every want of in, which is removed.
func (f *Fleet) dropWants(in *fleetInstance) {
	for id := range in.wants {
		f.unwant(in, id)
	}
}

// unwant drops in's want of id.
func (f *Fleet) unwant(in *fleetInstance, id keyID) {
	if _, ok := in.wants[id]; !ok {
		return
	}
	delete(in.wants, id)
	ws := slices.DeleteFunc(f.wanters[id], func(x *fleetInstance) bool { return x == in })
	if len(ws) == 0 {
		delete(f.wanters, id)
	} else {
		f.wanters[id] = ws
	}
}

// fill hands out the pool of the limits and keys touched: to every
// instance that wants allowance of the same window, in region and
// instance order, as much as it wants while the pool lasts, in a grant of
// its own added to rd (Grant.Extras). Stale entries are dropped.
func (f *Fleet) fill(now time.Time, touched []keyID, rd *Ready) {
	if len(touched) == 0 {
		return
	}
	extras := map[*fleetInstance][]Moved{}
	for _, id := range touched {
		p, ok := f.pool[id]
		if !ok {
			continue
		}
		j := slices.Index(f.weighted, id.limit)
		w := f.window(j, now)
		if p.win != w {
			delete(f.pool, id)
			continue
		}
		for _, in := range slices.Clone(f.wanters[id]) {
			want := in.wants[id]
			switch {
			case p.value <= 0:
			case want.win != w: // stale
				f.unwant(in, id)
			case in.attached && in.full && !in.legacy:
				x := min(want.value, p.value)
				p.value -= x
				if want.value -= x; want.value > 0 {
					in.wants[id] = want
				} else {
					f.unwant(in, id)
				}
				extras[in] = append(extras[in], Moved{Limit: id.limit, Key: id.key, Window: time.Unix(0, w), Value: x})
			}
		}
		if p.value > 0 {
			f.pool[id] = p
		} else {
			delete(f.pool, id)
		}
	}
	for _, fr := range f.regions {
		for _, in := range fr.insts {
			if xs := extras[in]; len(xs) > 0 {
				a := f.grantOnly(now, fr, in)
				a.Grant.Extras = xs
				rd.Send = append(rd.Send, a)
				rd.Term = f.co.term
			}
		}
	}
}

// steadyStreak is how many reports in a row must say a key is near its
// limit (or rejected) at each instance that reported it for the key to
// count as reaching those instances only: a key with sparse traffic is
// reported by whichever instances its latest requests happened to reach.
const steadyStreak = 2

// maxRestSent bounds the grants of an instance whose rest factors' acks
// are awaited.
const maxRestSent = 32

// Member states in dividing one vector among instances (see divide).
const (
	memberOut    uint8 = iota // takes no part: its target is 0
	memberLive                // takes part by its demand
	memberFrozen              // keeps what it has: it cannot be taken back
	memberAll                 // an instance that does not know instances: it holds everything
)

// moveWeights moves the weights of fr's instances toward their targets
// (new targets first when retarget) and adds a grant for every instance
// whose weights changed to rd: the limits' weights, and those of hot keys
// (only those of instance only's keys, if not nil: it acked and may have
// freed some).
func (f *Fleet) moveWeights(now time.Time, fr *fleetRegion, retarget bool, only *fleetInstance, rd *Ready) {
	if len(f.weighted) == 0 || len(fr.insts) == 0 {
		return
	}
	quiet := f.quietIn(now, fr)
	var noRaise func(int, float64) float64
	if quiet {
		noRaise = func(int, float64) float64 { return -1 } // no raise: lowerings only
	}
	legacy, unaware, live := false, false, 0
	n := len(fr.insts)
	fr.state, fr.demand, fr.want = grow(fr.state, n), grow(fr.demand, n), grow(fr.want, n)
	for i, in := range fr.insts {
		unaware = unaware || !in.legacy && !in.keyAware && f.holds(now, in)
		switch {
		case in.legacy && f.holds(now, in):
			fr.state[i], legacy = memberAll, true
		case in.legacy:
			fr.state[i] = memberOut
		case f.renewable(now, in):
			fr.state[i] = memberLive
			live++
		default:
			fr.state[i] = memberFrozen // until its grant expires
		}
	}
	ri := f.co.regionOf[fr.name] // the Coordinator's index of the region
	for j, l := range f.weighted {
		cs := fr.cells[:0]
		busy := 0 // live instances with demand, or not reported yet (divide counts those with the mean)
		for i, in := range fr.insts {
			cs = append(cs, in.w[j])
			fr.demand[i] = float64(in.w[j].demand)
			if in.rates == nil && fr.state[i] == memberLive {
				fr.demand[i] = -1 // no report yet: see divide
			}
			if fr.state[i] == memberLive && fr.demand[i] != 0 {
				busy++
			}
		}
		unit := 0.0 // the weight of one request a window
		if a := f.amount[j]; a > 0 {
			f.co.setUnits(l, ri, busy, a)
			if s := fr.shares.Share(l, ""); s > 0 {
				unit = 1 / (a * s)
			}
		}
		if retarget && (f.long[j] == 0 || newcomer(cs, fr.state) || f.timedWeights(fr, j, now)) {
			divide(cs, fr.state, fr.demand, 1, fr.want, unit)
		}
		clip := noRaise
		if !quiet && unaware && loose(fr, j) {
			// An instance that does not know rest factors applies its
			// weight to every key, also to one whose weights of their own
			// exceed their instances' weights (apart): it is raised only
			// once the keys are back together.
			clip = func(i int, give float64) float64 {
				if in := fr.insts[i]; !in.legacy && !in.keyAware {
					return -1
				}
				return give
			}
		}
		grant(cs, nil, weightHysteresis/2, 0, clip)
		for i, in := range fr.insts {
			in.w[j] = cs[i]
		}
		fr.cells = cs
	}
	if f.moveKeys(now, fr, retarget, only, live, legacy, unaware, quiet) {
		for _, in := range fr.insts {
			in.moved = true // a rest factor changed: every instance gets it
		}
	}
	for _, in := range fr.insts {
		moved := in.moved
		in.moved = false
		for j := range in.w {
			moved = moved || in.w[j].flags&dirty != 0
		}
		if moved && in.attached && in.full {
			rd.Send = append(rd.Send, f.grantOnly(now, fr, in))
		}
	}
}

// loose reports whether a hot key of fr's weighted limit j has a weight
// of its own above its instance's weight for the limit (by bound): the
// instances' weights for the limit then do not bound what they apply to
// the key.
func loose(fr *fleetRegion, j int) bool {
	for _, k := range fr.keyList {
		if k.limit != j {
			continue
		}
		for _, kc := range k.cells {
			if kc.c.bound > kc.in.w[j].bound {
				return true
			}
		}
	}
	return false
}

// restMin is the latest change of rest factors that every instance of fr
// that may hold share has acked: none during a quiet period, when an
// instance of an earlier leader that has not attached yet may apply any
// rest factor (1 for a key it never had one for).
func restMin(f *Fleet, now time.Time, fr *fleetRegion) uint64 {
	if f.quietIn(now, fr) {
		return 0
	}
	v := fr.restVer
	for _, in := range fr.insts {
		if !in.legacy && f.holds(now, in) {
			v = min(v, in.restAcked)
		}
	}
	return v
}

// moveKeys moves the weights of their own that fr's instances hold for
// hot keys, and the keys' rest factors, toward their targets (new
// targets first when retarget): every key, or only's. live counts the
// region's live instances; legacy says an instance that does not know
// instances holds everything, quiet that this is a new leader's quiet
// period: either forbids every raise; unaware, that an instance that may
// hold share does not know weights of their own and rest factors (an
// older enforcer: it applies its weight for the limit to every key), so
// every key stays together. It reports whether a rest factor changed.
//
// An instance applies, to a key, its weight of its own for it if it has
// one, else its weight for the limit × the key's rest factor. Two ways
// keep what they apply together within the key's share, counting of each
// figure the largest an instance may be applying (its bound):
//
//   - Together: each weight of its own is at most its instance's weight
//     for the limit, lowered with it in the same grant. Every instance
//     then applies at most its weight for the limit, and those sum to at
//     most 1, whatever the rest factor.
//   - Apart: the rest factor is keyRest, acked by every instance that may
//     hold share, and the weights of their own sum to at most 1 −
//     keyRest: the others apply at most keyRest × Σ limit weights ≤
//     keyRest.
//
// A key goes apart when the instances that reported it are at most a
// quarter of the region's live instances (it reaches few of them): its
// rest factor goes down to keyRest at once, the weights of their own
// follow their limit's (at most it, up to their share by demand); once
// every instance acked the factor and they fit within 1 − keyRest, they
// are divided by demand. It comes back together when they are more than
// half (or none): the weights of their own come down to at most the
// limit's and, once acked, the rest factor goes back to 1 and they are
// dropped.
func (f *Fleet) moveKeys(now time.Time, fr *fleetRegion, retarget bool, only *fleetInstance, live int, legacy, unaware, quiet bool) bool {
	fr.restMin = restMin(f, now, fr)
	fr.trimRestLog()
	if len(fr.keyList) == 0 {
		return false
	}
	hotAfter := now.Add(-f.keyTTL()).UnixNano()
	var clip func(int, float64) float64
	if legacy || quiet {
		clip = func(int, float64) float64 { return -1 } // lowerings only
	}
	var keys []*fleetKey
	if only != nil {
		for _, kc := range only.keys {
			keys = append(keys, kc.k)
		}
	} else {
		keys = slices.Clone(fr.keyList) // keys may be removed from fr.keyList
	}
	restMoved := false
	for _, k := range keys {
		if k.restVer <= fr.restMin {
			k.rest.bound = k.rest.share // every instance that may hold share applies it
		}
		// reach counts the live instances that reported it, steady those
		// that did in their latest reports in a row; sum is Σ their
		// weights for the limit.
		reach, steady, sum := 0, 0, 0.0
		cs := fr.cells[:0]
		n := len(k.cells)
		fr.state, fr.demand, fr.want = grow(fr.state, n), grow(fr.demand, n), grow(fr.want, n)
		for i, kc := range k.cells {
			cs = append(cs, kc.c)
			switch {
			case kc.in.legacy || kc.hot < hotAfter:
				fr.state[i] = memberOut
			case f.renewable(now, kc.in):
				fr.state[i] = memberLive
				reach++
				sum += float64(kc.in.w[k.limit].share)
				if kc.streak >= steadyStreak {
					steady++
				}
			default:
				fr.state[i] = memberFrozen
			}
			fr.demand[i] = float64(kc.c.demand)
		}
		few := !legacy && !unaware && (steady == reach && steady > 0 && 4*reach <= live || k.rest.target < 1 && reach > 0 && 2*reach <= live)
		lockstep := true // every weight of its own is within its instance's weight for the limit
		for i, kc := range k.cells {
			lockstep = lockstep && cs[i].bound <= kc.in.w[k.limit].bound
		}
		switch {
		case few && k.rest.target == 1:
			k.rest.target = keyRest
		case !few && k.rest.target < 1 && !quiet && !legacy && lockstep && !k.apart:
			k.rest.target = 1
		}
		if t := k.rest.target; t != k.rest.share && (t < k.rest.share || !quiet && !legacy) {
			fr.setRest(k, t)
			restMoved = true
		}
		if !few {
			k.apart = false
		}
		if !k.apart && few && k.rest.bound <= keyRest && fits(cs) {
			k.apart = true
		}
		if k.apart {
			if retarget {
				divide(cs, fr.state, fr.demand, 1-keyRest, fr.want, 0)
			}
			// The rest factor takes its part of the vector.
			cs = append(cs, cell{share: k.rest.bound, bound: k.rest.bound, target: k.rest.bound})
			grant(cs, nil, weightHysteresis/2, 0, clip)
			cs = cs[:len(cs)-1]
		} else {
			// Each follows its weight for the limit (scaled to fit within
			// 1 − keyRest, so that the key may go apart), and none once
			// the key is back to the limit's weights.
			scale := 1.0
			if sum > 1-keyRest {
				scale = (1 - keyRest) / sum
			}
			for i, kc := range k.cells {
				w := kc.in.w[k.limit].share
				var t float32
				switch {
				case !few || k.rest.share == 1 || fr.state[i] == memberOut:
					// it applies its weight for the limit × the rest factor
				case fr.state[i] == memberFrozen:
					t = min(cs[i].share, w)
				default:
					t = min(down32(float64(w)*scale), w)
				}
				if t < cs[i].share || lockstep && clip == nil {
					cs[i].target = t
					cs[i].set(t)
				}
			}
		}
		for i, kc := range k.cells {
			kc.c = cs[i]
			kc.in.moved = kc.in.moved || kc.c.flags&dirty != 0
		}
		fr.cells = cs
		for i := len(k.cells) - 1; i >= 0; i-- {
			if kc := k.cells[i]; kc.c.share == 0 && kc.c.bound == 0 && kc.c.target == 0 && fr.state[i] == memberOut {
				f.removeCell(fr, kc)
			}
		}
		if len(k.cells) == 0 && k.rest.share == 1 && k.rest.bound == 1 && k.restVer <= fr.restMin {
			f.removeKey(fr, k)
			f.keyed[k.limit] = now.UnixNano()
		}
	}
	return restMoved
}

// fits reports whether the weights of their own of a key (cells cs) fit
// within 1 − keyRest.
func fits(cs []cell) bool {
	sum := 0.0
	for i := range cs {
		sum += float64(cs[i].bound)
	}
	return sum <= 1-keyRest
}

// keyTTL is how long an instance keeps a weight of its own for a hot key
// after it last reported the key near its limit or rejected: HotTTL less
// a period, so that it gives it up before the region's share of the key
// follows the default vector again.
func (f *Fleet) keyTTL() time.Duration {
	return max(f.co.cfg.HotTTL-f.co.cfg.Period, f.co.cfg.HotTTL/2)
}

// divide sets the targets of one vector's cells cs, by instance (state
// and demand by instance): an instance that does not know instances
// holds everything while it may hold share; a frozen one keeps what it
// has; the live ones share avail less what the frozen ones hold,
// weightFloor of it evenly and the rest by their demand; the others get
// nothing. The cells move only when one would move by more than
// weightHysteresis (at most the even part of a live one's weight) and by
// more than a third of what it is, so that noise in the demand of evenly
// loaded instances does not shuffle them, or when
// the live ones leave more than weightHysteresis of it unused (what an
// instance that left gave up, spread over many). An instance that has
// not reported yet (demand < 0) counts with the mean demand of those that
// have. Where unit (the weight of one request a window; 0: none) times
// the live instances with demand fits in avail, each of them gets at
// least unit, out of what the others have above it, and the cells move
// when one is below it: below one request a window an instance admits
// nothing of a key at that share. want is scratch space, at least
// len(cs) long.
func divide(cs []cell, state []uint8, demand []float64, avail float64, want []float32, unit float64) {
	all, live, sum := false, 0, 0.0
	heard, known := 0, 0.0 // live instances that reported, and their demand
	for i := range cs {
		if state[i] == memberLive && demand[i] >= 0 {
			heard++
			known += demand[i]
		}
	}
	for i := range cs {
		if state[i] == memberLive && demand[i] < 0 {
			// An instance that has not reported yet counts with the mean
			// demand of those that did (evenly, if none did): a first split
			// by the first report to come in would give it nothing.
			demand[i] = 0
			if heard > 0 {
				demand[i] = known / float64(heard)
			}
		}
	}
	for i := range cs {
		switch state[i] {
		case memberAll:
			all = true
		case memberLive:
			live++
			sum += demand[i]
		case memberFrozen:
			avail -= float64(cs[i].share)
		}
	}
	avail = max(avail, 0)
	moved, unused := false, avail
	// The absolute part of the hysteresis is at most the even part of one
	// live instance's weight: with many instances a weight is smaller than
	// weightHysteresis, and an instance that holds nothing would never get
	// one.
	hysteresis := weightHysteresis
	if live > 0 {
		hysteresis = min(hysteresis, weightFloor*avail/float64(live))
	}
	for i := range cs {
		if state[i] == memberLive {
			unused -= float64(cs[i].share)
		}
		want[i] = 0
		switch {
		case all:
			if state[i] == memberAll {
				want[i] = 1
			}
		case state[i] == memberFrozen:
			want[i] = cs[i].share
		case state[i] != memberLive:
		case sum > 0:
			want[i] = down32(avail * (weightFloor/float64(live) + (1-weightFloor)*demand[i]/sum))
		default:
			want[i] = down32(avail / float64(live))
		}
	}
	short := !all && unit > 0 && lift1(cs, state, demand, avail, want, unit)
	for i := range cs {
		d := math.Abs(float64(want[i] - cs[i].share))
		if d > hysteresis && d > float64(max(want[i], cs[i].share))/3 {
			moved = true
		}
	}
	moved = moved || short || !all && live > 0 && unused > weightHysteresis
	for i := range cs {
		cs[i].target = cs[i].share
		if moved {
			cs[i].target = want[i]
		}
	}
}

// lift1 raises the want of every live instance with demand to unit at
// least (see divide), where they all fit in avail, out of what the live
// ones have above unit, in proportion; it reports whether one of them
// holds less than unit now.
func lift1(cs []cell, state []uint8, demand []float64, avail float64, want []float32, unit float64) bool {
	busy, short, spare := 0, 0.0, 0.0
	below := false
	for i := range cs {
		if state[i] != memberLive {
			continue
		}
		w := float64(want[i])
		if demand[i] != 0 {
			busy++
			short += max(unit-w, 0)
			below = below || float64(cs[i].share) < unit*(1-1e-6)
		}
		spare += max(w-unit, 0)
	}
	if float64(busy)*unit > avail || short == 0 && !below {
		return false
	}
	if short > 0 && spare > 0 {
		// What the wants leave unused to rounding may make spare a hair
		// less than short: the instances short then get a hair less than
		// unit (see regional's fitSlack).
		give, take := min(spare/short, 1), min(short/spare, 1)
		for i := range cs {
			if state[i] != memberLive {
				continue
			}
			w := float64(want[i])
			switch {
			case demand[i] != 0 && w < unit:
				want[i] = down32(w + (unit-w)*give)
			case w > unit:
				want[i] = down32(w - (w-unit)*take)
			}
		}
	}
	return below
}

// timedWeights reports whether a rebalance of fr at now moves the weights
// of the j-th Weighted limit, whose window is longer than the period:
// once a window, at the last rebalance before its next boundary less the
// Coordinator's lead, as the Coordinator moves such a limit's shares (see
// Coordinator.timed). An instance that holds nothing gets its part at
// once (see newcomer).
func (f *Fleet) timedWeights(fr *fleetRegion, j int, now time.Time) bool {
	w := int64(f.long[j])
	if w <= 0 {
		return true
	}
	fr.slot = grow(fr.slot, len(f.weighted))
	lead := f.co.lead()
	b := (now.Add(lead).UnixNano()/w + 1) * w
	if b == fr.slot[j] || now.Add(f.co.cfg.Period).Add(lead).UnixNano() < b {
		return false
	}
	fr.slot[j] = b
	return true
}

// newcomer reports whether a live instance holds nothing of vector cs, or
// the live ones leave more than weightHysteresis of it unused: weights
// then move at once, whatever the limit's window.
func newcomer(cs []cell, state []uint8) bool {
	unused := 1.0
	for i := range cs {
		switch state[i] {
		case memberLive:
			if cs[i].share == 0 && cs[i].target == 0 {
				return true
			}
			unused -= float64(cs[i].share)
		case memberFrozen, memberAll:
			unused -= float64(cs[i].share)
		}
	}
	return unused > weightHysteresis
}

// grow returns s with at least n elements.
func grow[T any](s []T, n int) []T {
	if len(s) < n {
		s = append(s, make([]T, n-len(s))...)
	}
	return s
}

// average takes the report just received from in, which covers dt, into
// its demand for every Weighted limit (in.w's demand): an average
// exponentially weighted in time, with the Coordinator's half-life (the
// mean of the reports so far until it spans one), so that an instance's
// weight follows its demand, not the noise of one report interval.
func (f *Fleet) average(in *fleetInstance, dt time.Duration) {
	keep := float32(math.Exp2(-float64(dt) / float64(f.co.cfg.HalfLife)))
	for j, l := range f.weighted {
		c := &in.w[j]
		k := min(keep, float32(c.n)/float32(c.n+1))
		c.demand = k*c.demand + (1-k)*float32(in.demand(l))
		c.n = min(c.n, 254) + 1
	}
}

func (in *fleetInstance) demand(limit string) float64 {
	if lr := in.rates[limit]; lr != nil {
		return lr.admitted + lr.rejected
	}
	return 0
}

// keyDemand is the instance's demand for one key in its latest report (0
// if the report did not count the key's traffic).
func (in *fleetInstance) keyDemand(id keyID) float64 {
	if lr := in.rates[id.limit]; lr != nil {
		if kr := lr.keys[id.key]; kr != nil {
			return kr.admitted + kr.rejected
		}
	}
	return 0
}

// noteHot takes report m of instance in, which covers dt: it averages the
// instance's demand for each key it has a weight of its own for, with a
// half-life of one rebalance period (a report counts a key's traffic
// only from the request that made the key hot in its interval, so one
// report's figure swings from 0 to the key's whole rate), and records
// the hot keys of Weighted limits that m says are near their limit or
// rejected: the instance gets (or keeps) a weight of its own for each.
func (f *Fleet) noteHot(now time.Time, fr *fleetRegion, in *fleetInstance, m Report, dt time.Duration) {
	keep := float32(math.Exp2(-float64(dt) / float64(f.co.cfg.Period)))
	for _, kc := range in.keys {
		kc.c.demand = kc.c.demand*keep + float32(in.keyDemand(kc.k.id))*(1-keep)
		switch lr := in.rates[kc.k.id.limit]; {
		case lr != nil && lr.keys[kc.k.id.key] != nil && lr.keys[kc.k.id.key].near:
			kc.streak = min(kc.streak, 254) + 1
		default:
			kc.streak = 0
		}
	}
	for _, ld := range m.Limits {
		j := slices.Index(f.weighted, ld.Limit)
		if j < 0 || !f.serving(in, j) || !in.keyAware {
			continue // it holds nothing of the limit (every key is rejected there), or it knows no weights of its own
		}
		for _, kd := range ld.Keys {
			if !kd.NearLimit && kd.Rejected == 0 {
				continue
			}
			id := keyID{ld.Limit, kd.Key}
			kc := in.byKey[id]
			if kc == nil {
				kc = f.addCell(fr, in, j, id)
				kc.c.demand, kc.streak = float32(in.keyDemand(id)), 1
			}
			kc.hot = now.UnixNano()
		}
	}
}

// serving reports whether instance in applies a part of the j-th
// Weighted limit: a positive weight it acked, or one it is being lowered
// from (a raise not acked yet may be one from nothing).
func (f *Fleet) serving(in *fleetInstance, j int) bool {
	c := in.w[j]
	return in.legacy || c.share > 0 && (c.flags&pending == 0 || c.bound > c.share)
}

// key returns fr's hot key id of the j-th Weighted limit, added (with a
// rest factor of 1) if new.
func (f *Fleet) key(fr *fleetRegion, j int, id keyID) *fleetKey {
	k := fr.keys[id]
	if k == nil {
		id.key = strings.Clone(id.key) // do not pin the report's buffer
		k = &fleetKey{id: id, limit: j, pos: len(fr.keyList), rest: cell{share: 1, bound: 1, target: 1}}
		fr.keys[id] = k
		fr.keyList = append(fr.keyList, k)
		fr.nkeys[j]++
	}
	return k
}

// removeKey deletes key k of fr, which has no weights of its own and a
// rest factor of 1 that every instance acked.
func (f *Fleet) removeKey(fr *fleetRegion, k *fleetKey) {
	last := fr.keyList[len(fr.keyList)-1]
	fr.keyList[k.pos], last.pos = last, k.pos
	fr.keyList[len(fr.keyList)-1] = nil
	fr.keyList = fr.keyList[:len(fr.keyList)-1]
	fr.nkeys[k.limit]--
	delete(fr.keys, k.id)
}

// addCell gives instance in of fr a weight of its own (at 0) for key id
// of the j-th Weighted limit.
func (f *Fleet) addCell(fr *fleetRegion, in *fleetInstance, j int, id keyID) *keyCell {
	k := f.key(fr, j, id)
	kc := &keyCell{in: in, k: k, kpos: int32(len(k.cells)), ipos: int32(len(in.keys))}
	k.cells = append(k.cells, kc)
	in.keys = append(in.keys, kc)
	if in.byKey == nil {
		in.byKey = map[keyID]*keyCell{}
	}
	in.byKey[k.id] = kc
	return kc
}

// removeCell deletes a weight of its own that is 0 and acknowledged (or
// that its instance no longer holds).
func (f *Fleet) removeCell(fr *fleetRegion, kc *keyCell) {
	k, in := kc.k, kc.in
	last := k.cells[len(k.cells)-1]
	k.cells[kc.kpos], last.kpos = last, kc.kpos
	k.cells[len(k.cells)-1] = nil
	k.cells = k.cells[:len(k.cells)-1]
	ilast := in.keys[len(in.keys)-1]
	in.keys[kc.ipos], ilast.ipos = ilast, kc.ipos
	in.keys[len(in.keys)-1] = nil
	in.keys = in.keys[:len(in.keys)-1]
	delete(in.byKey, k.id)
}

// dropCells deletes every weight of its own of instance in, which holds
// nothing any more.
func (f *Fleet) dropCells(fr *fleetRegion, in *fleetInstance) {
	for len(in.keys) > 0 {
		f.removeCell(fr, in.keys[len(in.keys)-1])
	}
	in.restAcked, in.restSent = 0, nil
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

// rates converts an instance's report into rates over dt, the interval
// since its previous report (its first is taken to cover
// defaultReportInterval, as the Coordinator takes a region's first, or
// for a new instance the time since it attached). Keys without traffic
// are left out: an instance reports every key it holds a share of its
// own for, and the Coordinator counts a key left out of a report at 0.
func rates(m Report, dt time.Duration) streamReport {
	sr := streamReport{}
	perSec := 1 / dt.Seconds()

	for _, ld := range m.Limits {
		lr := sr[ld.Limit]
		if lr == nil {
			lr = &limitRate{}
			sr[ld.Limit] = lr
		}
		lr.admitted += ld.Admitted * perSec
		lr.rejected += ld.Rejected * perSec
		for _, kd := range ld.Keys {
			if kd.Admitted == 0 && kd.Rejected == 0 && !kd.NearLimit {
				continue // a key it holds a share of its own for, without traffic: as if absent
			}
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

// regionHotMin: a key of a Weighted limit is hot in a region only if the
// region's demand for it (the traffic its instances counted, from the
// request that made it hot) is at least this part of the region's
// allowance for it, the region's share × the limit's rate (plans and
// overrides are not known here: a key whose limit they raise counts as
// hot sooner).
const regionHotMin = 0.05

// maxForwardGap bounds how long a region's report waits for a connected
// instance that does not report.
const maxForwardGap = 2 * time.Second

// roundDone reports whether the region's report is due at at: every
// connected instance reported since the previous one (so the Coordinator
// gets one report per round of the instances' reports, not one per
// instance, each merging them all), or maxForwardGap has passed since
// the region's previous report (its first waits for every instance: the
// Coordinator takes it as the region's first measure of demand).
func (f *Fleet) roundDone(fr *fleetRegion, at time.Time) bool {
	if !fr.at.IsZero() && at.Sub(fr.at) >= maxForwardGap {
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
// rates times the interval since the region's previous report. A key is
// near its limit (hot) if an instance's latest report says it is near or
// rejected it, except, for a Weighted limit, when that instance holds
// nothing of the limit, or when the region's demand for the key is below
// regionHotMin of the region's allowance for it (an instance's part of a
// region's share is small, so it sees keys near that are far from the
// region's allowance: tracked, every one of them would cost a share at
// every instance of the region). Such a key's demand is forwarded, as
// admitted.
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
		w := slices.Index(f.weighted, limit)
		for _, in := range fr.insts {
			lr := in.rates[limit]
			if lr == nil || !in.attached {
				continue
			}
			seen = true
			// An instance that holds nothing of the limit rejects every
			// key: that says nothing of the keys' allowance (every key a
			// starting instance sees would be hot for HotTTL).
			serving := w < 0 || f.serving(in, w)
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
				sum.near = sum.near || kr.near && serving
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
		var perSec float64 // the limit's rate, before plans and overrides
		if l := f.dom.Limit(limit); l != nil && l.Rate.Period > 0 {
			perSec = float64(l.Rate.Amount) / l.Rate.Period.Seconds()
		}
		for _, k := range ks {
			kr := keys[k]
			kd := KeyDemand{Key: k, Admitted: amount(kr.admitted * dt), Rejected: amount(kr.rejected * dt), NearLimit: kr.near}
			if w >= 0 && kr.admitted+kr.rejected < regionHotMin*fr.shares.Share(limit, k)*perSec {
				kr.near = false
			}
			if !kr.near { // its demand, and nothing that makes it hot
				kd = KeyDemand{Key: k, Admitted: amount((kr.admitted + kr.rejected) * dt)}
			}
			ld.Keys = append(ld.Keys, kd)
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
