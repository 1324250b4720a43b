package coordinator

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/allot-dev/allot"
)

// Defaults of Config.
const (
	DefaultPeriod     = 2 * time.Second
	DefaultHalfLife   = 500 * time.Millisecond
	DefaultDeadAfter  = 5 * time.Second
	DefaultHotTTL     = 30 * time.Second
	DefaultHysteresis = 0.01
	DefaultMaxStep    = 0.5
	DefaultMaxHotKeys = 1 << 20
)

// Config configures a Coordinator. Zero durations and numbers take their
// defaults.
type Config struct {
	// Domain is the validated domain it coordinates; Domain.Regions lists
	// every region, in a fixed order.
	Domain *allot.Domain
	// Term is the leader's election revision. It must be above the Term
	// of the Snapshot the Coordinator starts from.
	Term int64
	// Period is how often Tick rebalances (default 2 s).
	Period time.Duration
	// HalfLife is the half-life of the demand average (default 500 ms, so
	// that shares follow a shift of demand within two periods).
	HalfLife time.Duration
	// DeadAfter is how long a region may stay silent (no report, no ack)
	// before its shares are frozen (default 5 s).
	DeadAfter time.Duration
	// HotTTL is how long a key stays hot after a region last reported it
	// near its limit or rejecting (default 30 s).
	HotTTL time.Duration
	// Hysteresis is the smallest share change worth publishing (default 0.01).
	Hysteresis float64
	// MaxStep is the most a share moves in one rebalance (default 0.5).
	MaxStep float64
	// MaxHotKeys bounds the hot keys tracked over all limits (default 2^20).
	MaxHotKeys int
	// GoneHold is how long a region that the snapshot's records name but
	// the domain no longer lists is counted as still applying what they
	// hold (0: not at all): its enforcers go on enforcing their last
	// shares until their grants expire, so no other region may be raised
	// into them before. A Fleet sets it to its grant TTL + tolerated skew.
	GoneHold time.Duration
}

// Coordinator is the rebalancing state machine of one domain's leader. It
// turns demand reports into share assignments that never over-allocate:
// for every limit's default vector and every hot key, the shares that
// regions may be applying sum to at most 1 at every instant (see the
// package documentation for the argument).
//
// It does no I/O and never reads the clock: the driver passes messages to
// Step, calls Tick every few hundred milliseconds, persists and sends what
// they return. A Coordinator is not safe for concurrent use; the driver
// serialises calls. The zero value is not usable; call New.
type Coordinator struct {
	cfg      Config
	domain   string
	regions  []string
	regionOf map[string]int
	limits   []*limitState
	limitOf  map[string]*limitState

	term    int64
	version uint64      // of the latest assignment sent, to any region
	sent    []uint64    // by region: version of its latest assignment
	changed []uint64    // by region: version of its latest assignment with a new share
	acked   []uint64    // by region: latest version it acknowledged
	heard   []time.Time // by region: when its latest report or ack arrived
	lastAt  []time.Time // by region: At of its latest report
	live    []bool      // by region, as of the latest rebalance
	next    time.Time   // of the next rebalance
	hotKeys int
	stats   Stats
	// gone holds, by limit, what regions no longer configured may still
	// apply of any of its vectors, until goneUntil (Config.GoneHold).
	gone      map[string]float64
	goneOf    map[string]float64 // by limit + "\x00" + region
	goneUntil time.Time

	// Scratch space of pass, by region.
	vec    Vector
	dst    []float64
	defb   []float32 // held shares of the limit's default vector
	excess []excess
}

// limitState is one limit's default vector and hot keys.
type limitState struct {
	name   string
	floors []float64 // by region
	def    []cell    // the default vector, by region
	index  map[string]int32
	keys   []hotKey
	cells  []cell // key i's vector is cells[i*n : i*n+n] for n regions
}

type hotKey struct {
	name     string
	hot      int64 // unix ns when a region last reported it hot
	recorded bool  // a Record of it may exist
}

// cell is one region's part of one vector. Shares are float32 to keep a
// hot key small; every share granted is rounded down to one.
type cell struct {
	share  float32 // latest share granted; follow: the default vector's
	bound  float32 // largest share of its own the region may be applying
	target float32 // where share is heading, set by every rebalance
	demand float32 // the region's demand: an average of its rate (cost per second), see report
	flags  uint8
}

const (
	pending uint8 = 1 << iota // share not acknowledged yet
	dirty                     // share changed since the last assignment built
	viaDef                    // the region may be following the default vector
)

const follow = float32(Follow)

// held is the largest share the region may be applying for the vector;
// d is the default vector's held share in the region.
func (x *cell) held(d float32) float32 {
	if x.flags&viaDef != 0 {
		return max(x.bound, d)
	}
	return x.bound
}

// set grants share s. The old share stays counted in bound until the
// region acknowledges.
func (x *cell) set(s float32) {
	if s == x.share {
		return
	}
	x.share = s
	x.flags |= pending | dirty
	if s == follow {
		x.flags |= viaDef
	} else {
		x.bound = max(x.bound, s)
	}
}

// confirm records that the region applied share and no older one can
// come back.
func (x *cell) confirm() {
	if x.flags&pending == 0 {
		return
	}
	x.flags &^= pending
	if x.share == follow {
		x.bound = 0
	} else {
		x.bound = x.share
		x.flags &^= viaDef
	}
}

// level is what held would be at share s.
func level(s, d float32) float32 {
	if s == follow {
		return d
	}
	return s
}

// New returns the Coordinator of a leader elected with cfg.Term. It starts
// from snap, what earlier leaders persisted: each region may still be
// applying the recorded share or bound (or, for a key, its default share)
// until it acknowledges an assignment of the new term, and every vector is
// sent again. Limits without a record start from InitialShares.
//
// Counting a key's default share too may count a key above 1 (its record
// and the default's were written at different times). Such a key's shares
// do not move until the regions acknowledge: then the coordinator knows
// what they apply.
func New(now time.Time, cfg Config, snap Snapshot) (*Coordinator, error) {
	d := cfg.Domain
	if d == nil || len(d.Regions) == 0 || cfg.Term <= 0 || cfg.Term <= snap.Term {
		return nil, fmt.Errorf("%w: want a domain with regions and a term above the snapshot's (%d), got %d", ErrBadConfig, snap.Term, cfg.Term)
	}
	if cfg.Period < 0 || cfg.HalfLife < 0 || cfg.DeadAfter < 0 || cfg.HotTTL < 0 ||
		!(cfg.Hysteresis >= 0 && cfg.Hysteresis < 1) || !(cfg.MaxStep >= 0 && cfg.MaxStep <= 1) || cfg.MaxHotKeys < 0 {
		return nil, fmt.Errorf("%w: negative or out of range setting", ErrBadConfig)
	}
	cfg.Period = cmp.Or(cfg.Period, DefaultPeriod)
	cfg.HalfLife = cmp.Or(cfg.HalfLife, DefaultHalfLife)
	cfg.DeadAfter = cmp.Or(cfg.DeadAfter, DefaultDeadAfter)
	cfg.HotTTL = cmp.Or(cfg.HotTTL, DefaultHotTTL)
	cfg.Hysteresis = cmp.Or(cfg.Hysteresis, DefaultHysteresis)
	cfg.MaxStep = cmp.Or(cfg.MaxStep, DefaultMaxStep)
	cfg.MaxHotKeys = cmp.Or(cfg.MaxHotKeys, DefaultMaxHotKeys)

	n := len(d.Regions)
	live := make([]bool, n)
	c := &Coordinator{
		cfg: cfg, domain: d.Name, regions: d.Regions, regionOf: make(map[string]int, n),
		limitOf: make(map[string]*limitState, len(d.Limits)), term: cfg.Term,
		sent: make([]uint64, n), changed: make([]uint64, n), acked: make([]uint64, n),
		heard: make([]time.Time, n), lastAt: make([]time.Time, n), live: live,
		vec: Vector{Demand: make([]float64, n), Live: live, Shares: make([]float64, n), Held: make([]float64, n)},
		dst: make([]float64, n), defb: make([]float32, n),
	}
	for i, r := range d.Regions {
		c.regionOf[r] = i
	}
	for _, l := range d.Limits {
		ls := &limitState{name: l.Name, floors: make([]float64, n), def: make([]cell, n), index: map[string]int32{}}
		for r, s := range InitialShares(l.Floors, d.Regions) {
			ls.floors[r] = l.Floors[d.Regions[r]]
			ls.def[r] = cell{share: float32(s), bound: float32(s), target: float32(s)}
		}
		c.limits = append(c.limits, ls)
		c.limitOf[l.Name] = ls
	}
	for _, rec := range snap.Records {
		if err := c.restore(now, rec); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Coordinator) restore(now time.Time, rec Record) error {
	ls := c.limitOf[rec.Limit]
	if ls == nil || rec.Cells == nil {
		return nil // a limit no longer configured, or a deletion
	}
	n := len(c.regions)
	cs, blank := ls.def, cell{} // a region the record lacks holds nothing
	if rec.Key != "" {
		i, ok := ls.index[rec.Key]
		if !ok {
			i = ls.add(rec.Key, now.UnixNano(), n)
			c.hotKeys++
		}
		cs, blank = ls.cells[int(i)*n:int(i)*n+n], cell{share: follow} // it follows the default
	}
	for r := range cs {
		cs[r] = blank
	}
	for _, cl := range rec.Cells {
		r, ok := c.regionOf[cl.Region]
		if !ok { // a region no longer configured: held until GoneHold has passed
			if c.cfg.GoneHold > 0 && cl.Bound >= 0 && cl.Bound <= 1 {
				h := max(cl.Bound, 0)
				if cl.Share != Follow && cl.Share >= 0 && cl.Share <= 1 {
					h = max(h, cl.Share)
				}
				if c.gone == nil {
					c.gone, c.goneOf = map[string]float64{}, map[string]float64{}
				}
				c.goneRegion(rec.Limit, cl.Region, h)
				c.goneUntil = now.Add(c.cfg.GoneHold)
			}
			continue
		}
		if !validShare(cl.Share, rec.Key) || !(cl.Bound >= 0 && cl.Bound <= 1) {
			return fmt.Errorf("%w: record of %s %q: region %s: share %v, bound %v", ErrBadConfig, rec.Limit, rec.Key, cl.Region, cl.Share, cl.Bound)
		}
		cs[r].share, cs[r].bound = follow, up32(cl.Bound)
		if cl.Share != Follow {
			cs[r].share = down32(cl.Share)
			cs[r].bound = max(cs[r].bound, up32(cl.Share))
		}
	}
	for r := range cs {
		cs[r].target = cs[r].share
		cs[r].flags = pending | dirty
		if rec.Key != "" {
			cs[r].flags |= viaDef // the record does not say whether it still follows
		}
	}
	return nil
}

// goneRegion counts h as what gone region may apply of limit's vectors:
// the most of its default and its keys (a key that follows the default
// applies the default's).
func (c *Coordinator) goneRegion(limit, region string, h float64) {
	id := limit + "\x00" + region
	c.goneOf[id] = max(c.goneOf[id], h)
	sum := 0.0
	for k, v := range c.goneOf {
		if strings.HasPrefix(k, limit+"\x00") {
			sum += v
		}
	}
	c.gone[limit] = sum
}

// reserved is what regions no longer configured may still apply of a
// vector of limit at now.
func (c *Coordinator) reserved(limit string, now time.Time) float64 {
	if c.gone == nil || !now.Before(c.goneUntil) {
		return 0
	}
	return c.gone[limit]
}

func validShare(v float64, key string) bool {
	return v >= 0 && v <= 1 || key != "" && v == Follow
}

func up32(x float64) float32 {
	f := float32(x)
	if float64(f) < x {
		f = math.Nextafter32(f, 2)
	}
	return f
}

func (ls *limitState) add(key string, hot int64, n int) int32 {
	key = strings.Clone(key) // do not pin the report's buffer
	i := int32(len(ls.keys))
	ls.index[key] = i
	ls.keys = append(ls.keys, hotKey{name: key, hot: hot})
	for range n {
		ls.cells = append(ls.cells, cell{share: follow, target: follow, flags: viaDef})
	}
	return i
}

// remove deletes key i by moving the last key into its place.
func (ls *limitState) remove(i, n int) {
	last := len(ls.keys) - 1
	delete(ls.index, ls.keys[i].name)
	if i != last {
		ls.keys[i] = ls.keys[last]
		ls.index[ls.keys[i].name] = int32(i)
		copy(ls.cells[i*n:i*n+n], ls.cells[last*n:])
	}
	ls.keys[last] = hotKey{}
	ls.keys = ls.keys[:last]
	ls.cells = ls.cells[:last*n]
}

// Step applies a Report or an Ack received at now. A report only updates
// demand and returns an empty Ready; an ack of a region's latest
// assignment frees the shares that region gave up, which may let other
// regions' raises go out at once. On error nothing is applied.
func (c *Coordinator) Step(now time.Time, m Message) (Ready, error) {
	var rd Ready
	var err error
	switch m := m.(type) {
	case Report:
		err = c.report(now, m)
	case Ack:
		rd, err = c.ack(now, m)
	default:
		err = fmt.Errorf("%w: message %T", ErrBadValue, m)
	}
	if err != nil {
		c.stats.Rejected++
	}
	return rd, err
}

func (c *Coordinator) region(domain, region string) (int, error) {
	if domain != c.domain {
		return 0, fmt.Errorf("%w %q", ErrUnknownDomain, domain)
	}
	r, ok := c.regionOf[region]
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownRegion, region)
	}
	return r, nil
}

func validAmount(v float64) bool { return v >= 0 && v <= allot.MaxAmount }

func (c *Coordinator) report(now time.Time, m Report) error {
	r, err := c.region(m.Domain, m.Region)
	if err != nil {
		return err
	}
	if !m.At.After(c.lastAt[r]) {
		return fmt.Errorf("%w: report of %s at %v, not after %v", ErrStale, m.Region, m.At, c.lastAt[r])
	}
	for _, ld := range m.Limits {
		if c.limitOf[ld.Limit] == nil {
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
	// Demand is an exponentially weighted average of each region's rate,
	// updated at its reports over the interval each report covers. (A
	// decayed sum weighted at arrival would weigh regions by how recently
	// they reported, not by their demand.) Every cell of the region is
	// updated, those the report leaves out with a rate of 0.
	dt := reportInterval(c.lastAt[r], m.At)
	keep := float32(math.Exp2(-float64(dt) / float64(c.cfg.HalfLife)))
	perSec := (1 - float64(keep)) / dt.Seconds()
	c.lastAt[r], c.heard[r] = m.At, now
	c.stats.Reports++
	n := len(c.regions)
	for _, ls := range c.limits {
		ls.def[r].demand *= keep
		for i := range len(ls.keys) {
			ls.cells[i*n+r].demand *= keep
		}
	}
	for _, ld := range m.Limits {
		ls := c.limitOf[ld.Limit]
		ls.def[r].demand += float32((ld.Admitted + ld.Rejected) * perSec)
		for _, kd := range ld.Keys {
			hot := kd.NearLimit || kd.Rejected > 0
			i, ok := ls.index[kd.Key]
			switch {
			case ok:
			case !hot:
				continue
			case c.hotKeys >= c.cfg.MaxHotKeys:
				c.stats.DroppedKeys++
				continue
			default:
				i = ls.add(kd.Key, 0, n)
				c.hotKeys++
			}
			ls.cells[int(i)*n+r].demand += float32((kd.Admitted + kd.Rejected) * perSec)
			if hot {
				ls.keys[i].hot = now.UnixNano()
			}
		}
	}
	return nil
}

// Report intervals: the first report of a region is taken to cover
// defaultReportInterval; the others, the time since the previous one,
// bounded.
const (
	defaultReportInterval = time.Second
	minReportInterval     = 10 * time.Millisecond
	maxReportInterval     = time.Minute
)

func (c *Coordinator) ack(now time.Time, a Ack) (Ready, error) {
	r, err := c.region(a.Domain, a.Region)
	if err != nil {
		return Ready{}, err
	}
	switch {
	case a.Term < c.term:
		return Ready{}, fmt.Errorf("%w: ack of term %d, leader's term is %d", ErrStale, a.Term, c.term)
	case a.Term > c.term || a.Version > c.sent[r]:
		return Ready{}, fmt.Errorf("%w: %s acked term %d version %d, latest sent is term %d version %d",
			ErrBadVersion, a.Region, a.Term, a.Version, c.term, c.sent[r])
	}
	c.heard[r] = now
	c.stats.Acks++
	// Every assignment carries all of the region's unacknowledged shares,
	// so one sent after the latest change of them confirms them all.
	if a.Version < c.changed[r] || a.Version <= c.acked[r] {
		return Ready{}, nil // superseded (a later change is on its way) or repeated
	}
	c.acked[r] = a.Version
	return c.pass(now, false, r), nil
}

// Tick rebalances if a period has passed since the previous rebalance (the
// first Tick always does): it ages demand, marks regions not heard from
// within DeadAfter as frozen, computes new targets for every vector, starts
// hot keys no longer reported hot for HotTTL on their way back to the
// default vector, and returns the assignments that move shares toward the
// targets. Every region with unacknowledged shares gets them again.
func (c *Coordinator) Tick(now time.Time) Ready {
	if now.Before(c.next) {
		return Ready{}
	}
	c.next = now.Add(c.cfg.Period)
	c.stats.Rebalances++
	for r, h := range c.heard {
		c.live[r] = !h.IsZero() && now.Sub(h) < c.cfg.DeadAfter
	}
	return c.pass(now, true, -1)
}

// excess is a hot key whose held shares sum to more than its default
// vector's: raising the default share of a region that may follow it
// could take that key above 1.
type excess struct {
	cs   []cell
	free float64
}

// pass moves every vector toward its targets and returns what to persist
// and send. With rebalance it first sets new targets; acked is a region
// whose latest assignment was just acknowledged, or -1.
func (c *Coordinator) pass(now time.Time, rebalance bool, acked int) Ready {
	n := len(c.regions)
	var rd Ready
	t := tally{pending: make([]int, n), dirty: make([]bool, n)}
	hot := now.UnixNano() - int64(c.cfg.HotTTL)
	for _, ls := range c.limits {
		reserved := c.reserved(ls.name, now)
		if acked >= 0 {
			ls.def[acked].confirm()
		}
		if rebalance {
			c.retarget(ls, ls.def, nil)
		}
		for r := range ls.def {
			c.defb[r] = ls.def[r].bound
		}
		c.excess = c.excess[:0]
		for i := 0; i < len(ls.keys); {
			cs := ls.cells[i*n : i*n+n : i*n+n]
			if acked >= 0 {
				cs[acked].confirm()
			}
			expired := ls.keys[i].hot < hot
			switch {
			case rebalance && expired:
				for r := range cs {
					cs[r].target = follow
				}
			case rebalance:
				c.retarget(ls, cs, ls.def)
			}
			free := grant(cs, c.defb, c.cfg.Hysteresis, reserved, nil)
			if expired && retired(cs) {
				if ls.keys[i].recorded {
					rd.Persist = append(rd.Persist, Record{Limit: ls.name, Key: ls.keys[i].name})
				}
				ls.remove(i, n)
				c.hotKeys--
				continue
			}
			if exceeds(cs, c.defb) {
				c.excess = append(c.excess, excess{cs, free})
			}
			t.add(cs)
			i++
		}
		grant(ls.def, nil, c.cfg.Hysteresis, reserved, c.clip)
		t.add(ls.def)
	}

	// Every region with a changed share gets all its unacknowledged
	// shares; at a rebalance, so does every region with any.
	b := builder{regions: c.regions, shares: make([][]Share, n)}
	b.recs = append(make([]Record, 0, len(rd.Persist)+t.records), rd.Persist...)
	b.cells = make([]Cell, 0, t.records*n)
	for r := range b.shares {
		if t.pending[r] > 0 && (rebalance || t.dirty[r]) {
			b.shares[r] = make([]Share, 0, t.pending[r])
		}
	}
	for _, ls := range c.limits {
		for i := range ls.keys {
			if b.emit(ls.name, ls.keys[i].name, ls.cells[i*n:i*n+n]) {
				ls.keys[i].recorded = true
			}
		}
		b.emit(ls.name, "", ls.def)
	}
	for r, sh := range b.shares {
		if sh == nil {
			continue
		}
		c.version++
		c.sent[r] = c.version
		if t.dirty[r] {
			c.changed[r] = c.version
		}
		rd.Send = append(rd.Send, Assignment{Domain: c.domain, Region: c.regions[r], Term: c.term, Version: c.version, Shares: sh})
	}
	rd.Term, rd.Version, rd.Persist = c.term, c.version, b.recs
	return rd
}

// tally counts what a pass will output.
type tally struct {
	pending []int  // by region: unacknowledged shares
	dirty   []bool // by region: a share changed
	records int    // vectors with a changed share
}

func (t *tally) add(cs []cell) {
	changed := false
	for r := range cs {
		if cs[r].flags&pending != 0 {
			t.pending[r]++
		}
		if cs[r].flags&dirty != 0 {
			t.dirty[r], changed = true, true
		}
	}
	if changed {
		t.records++
	}
}

// retarget sets the targets of vector cs (def is the default vector when
// cs is a hot key's). Once a key's shares move, all of them are its own: a
// key never mixes shares of its own with following the default, which
// would tie the default vector's raises to it.
func (c *Coordinator) retarget(ls *limitState, cs, def []cell) {
	v := &c.vec
	v.Floors = ls.floors
	moved := false
	for r := range cs {
		x := &cs[r]
		v.Demand[r] = float64(x.demand)
		v.Shares[r] = float64(x.share)
		v.Held[r] = float64(x.bound)
		if def != nil {
			v.Held[r] = float64(x.held(def[r].bound))
			if x.share == follow {
				v.Shares[r] = float64(def[r].share)
			}
		}
	}
	Allocate(c.dst, *v, c.cfg.Hysteresis, c.cfg.MaxStep)
	for r := range cs {
		moved = moved || c.dst[r] != v.Shares[r]
	}
	for r := range cs {
		cs[r].target = cs[r].share
		if moved {
			cs[r].target = down32(c.dst[r])
		}
	}
}

func retired(cs []cell) bool {
	for r := range cs {
		if cs[r].share != follow || cs[r].flags&pending != 0 {
			return false
		}
	}
	return true
}

// exceeds reports whether key vector cs may follow the default vector
// (held shares defb) in some region and holds more than it in all.
func exceeds(cs []cell, defb []float32) bool {
	via, over := false, 0.0
	for r := range cs {
		via = via || cs[r].flags&viaDef != 0
		over += float64(cs[r].held(defb[r])) - float64(defb[r]) // exact: float32 differences
	}
	return via && over > 0
}

// clip caps a raise of give of the default share of region r so that no
// key with excess shares that may follow the default in r goes above 1,
// and takes what it grants from those keys' free share. It returns -1 if
// the default share in r may not rise at all, even within what it holds:
// such a key is counted above 1 since a failover, so what regions apply
// for it is not known to be within its held shares.
func (c *Coordinator) clip(r int, give float64) float64 {
	for _, e := range c.excess {
		if x := &e.cs[r]; x.flags&viaDef != 0 {
			if e.free < 0 {
				return -1
			}
			give = min(give, e.free+slack(x, c.defb[r]))
		}
	}
	for i := range c.excess {
		if x := &c.excess[i].cs[r]; x.flags&viaDef != 0 {
			c.excess[i].free -= max(give-slack(x, c.defb[r]), 0)
		}
	}
	return give
}

// slack is how far the default's held share d may rise before it lifts
// the held share of key cell x.
func slack(x *cell, d float32) float64 { return max(float64(x.bound)-float64(d), 0) }

// grant moves one vector's cells toward their targets and returns the
// vector's free share, 1 − Σ held. defb holds the default vector's held
// shares (nil when cs is the default vector). A move that does not raise
// a cell's held share (a lowering) is made at once. Raises come out of the
// free share: numeric ones in proportion to what they ask, and rounded to
// what is held already if the raise would be smaller than minStep;
// following the default again is all or nothing. clip, if not nil, caps
// the raises of each region, and forbids any rise where it returns < 0.
func grant(cs []cell, defb []float32, minStep, reserved float64, clip func(r int, give float64) float64) float64 {
	free, asked := 1.0-reserved, 0.0
	for r := range cs {
		free -= float64(cs[r].held(at(defb, r)))
	}
	if free < 0 {
		return free // over-counted since a failover: wait for acks (see New)
	}
	for r := range cs {
		x := &cs[r]
		d := at(defb, r)
		switch h, to := x.held(d), level(x.target, d); {
		case x.target == x.share:
		case to <= h:
			if x.target < x.share || clip == nil || clip(r, 0) >= 0 {
				x.set(x.target)
			}
		case x.target != follow:
			asked += float64(to - h)
		}
	}
	scale := 1.0
	if asked > free {
		scale = max(free, 0) / asked
	}
	for r := range cs {
		x := &cs[r]
		d := at(defb, r)
		h, to := float64(x.held(d)), float64(level(x.target, d))
		if x.target == x.share || to <= h {
			continue
		}
		if x.target == follow {
			if to-h <= free {
				free -= to - h
				x.set(follow)
			}
			continue
		}
		give := min((to-h)*scale, free)
		if clip != nil {
			if give = clip(r, give); give < 0 {
				continue
			}
		}
		s := x.target
		if give < to-h {
			if s = down32(h + give); float64(s)-h < minStep {
				s = float32(h)
			}
		}
		free -= max(float64(s)-h, 0)
		x.set(s)
	}
	return free
}

func at(defb []float32, r int) float32 {
	if defb == nil {
		return 0
	}
	return defb[r]
}

// builder collects the output of one pass, in slices sized by a tally.
type builder struct {
	regions []string
	shares  [][]Share // by region; nil for a region that gets no assignment
	recs    []Record
	cells   []Cell // backs the records' Cells
}

// emit adds the unacknowledged shares of one vector to the assignments
// being built and, if any of them changed, a record of the vector. It
// reports whether it added a record.
func (b *builder) emit(limit, key string, cs []cell) bool {
	changed := false
	for r := range cs {
		x := &cs[r]
		if x.flags&pending != 0 && b.shares[r] != nil {
			b.shares[r] = append(b.shares[r], Share{Limit: limit, Key: key, Value: float64(x.share)})
		}
		if x.flags&dirty != 0 {
			changed = true
			x.flags &^= dirty
		}
	}
	if changed {
		start := len(b.cells)
		for r := range cs {
			b.cells = append(b.cells, Cell{Region: b.regions[r], Share: float64(cs[r].share), Bound: float64(cs[r].bound)})
		}
		b.recs = append(b.recs, Record{Limit: limit, Key: key, Cells: b.cells[start:len(b.cells):len(b.cells)]})
	}
	return changed
}

// Stats returns the Coordinator's counters.
func (c *Coordinator) Stats() Stats {
	s := c.stats
	s.Term, s.Version, s.HotKeys = c.term, c.version, c.hotKeys
	return s
}
