package coordinator

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot"
)

// Defaults of Config.
const (
	DefaultPeriod        = 2 * time.Second
	DefaultHalfLife      = 2 * time.Second
	DefaultClaimHalfLife = time.Minute
	DefaultDeadAfter     = 5 * time.Second
	DefaultHotTTL        = 30 * time.Second
	DefaultHysteresis    = 0.01
	DefaultMaxStep       = 1
	DefaultMaxHotKeys    = 1 << 20
)

// Demand estimation (see Coordinator.observe).
const (
	// shiftFrac: a region's measured rate that differs from its average
	// by more than this part of the vector's demand (or of the rate) in
	// several reports in a row is a shift, not noise: the average takes
	// it at once, and the next Tick rebalances without waiting for the
	// period (see observe).
	shiftFrac = 0.05
	// fallAfter and riseAfter: reports in a row that make a shift; a rate
	// above newLevel × both the average and the claim (the region's
	// decayed peak) is one at once.
	fallAfter = 2
	riseAfter = 3
	newLevel  = 1.25
	// knownAfter: a region's demand for a hot key is known once it has
	// held a share of its own for the key through this many of its
	// reports (its enforcers count the key's every request from the
	// report after the share came), or once it reports traffic of the key.
	knownAfter = 3
	// lagMoves: a vector whose shares are off their targets by less than
	// the hysteresis but more than a quarter of it for this many
	// rebalances in a row moves anyway, so that hysteresis never freezes
	// a wrong split.
	lagMoves = 3
	// saturatedHysteresis: in a limit whose window is longer than the
	// period, where every region uses at least its share (overload),
	// shares move only if one would move by this much: no split of that
	// kind wastes share, and a move within a window loses some of it in
	// its transition (a short window's moves wait for its edge, see
	// onTime). It is the tolerance the simulator's convergence allows.
	saturatedHysteresis = 0.05
	// longWindowReports: in a limit whose window is longer than the period,
	// a region's demand counts from this many reports on (see retarget).
	longWindowReports = 3
	// defaultRTT is a region's round trip before one is measured, and
	// defaultTickGap the driver's interval between Ticks before two came.
	defaultRTT     = 200 * time.Millisecond
	defaultTickGap = 250 * time.Millisecond
	// leadMargin is added to the time moved share takes to be in force.
	leadMargin = 50 * time.Millisecond
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
	// HalfLife is the half-life of the demand average (default 2 s, twice
	// the report interval, so that one report's noise moves shares little);
	// a shift of demand is taken at once (see shiftFrac).
	HalfLife time.Duration
	// ClaimHalfLife is the half-life of a region's claim, the decayed peak
	// of its demand, to which Allocate gives share no region needs now
	// (default 1 minute).
	ClaimHalfLife time.Duration
	// DeadAfter is how long a region may stay silent (no report, no ack)
	// before its shares are frozen (default 5 s).
	DeadAfter time.Duration
	// HotTTL is how long a key stays hot after a region last reported it
	// near its limit or rejecting (default 30 s).
	HotTTL time.Duration
	// Hysteresis is the smallest share change worth publishing (default 0.01).
	Hysteresis float64
	// MaxStep is the most a share moves in one rebalance (default 1: no
	// cap).
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
	floorBuf []float64 // scratch of floorsOf
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
	urgent  bool        // a report showed a shift of demand: rebalance without waiting for the period
	// Timing of rebalances (see Tick): the shortest window of a sliding-
	// window limit, if not longer than the period (0: none), by region the round trip of its latest
	// acknowledged assignment and when its latest assignment was sent,
	// the driver's latest interval between Ticks and its latest Tick, and
	// the window boundary the latest rebalance was timed for.
	window   time.Duration
	rtt      []time.Duration
	sentAt   []time.Time
	tickGap  time.Duration
	lastTick time.Time
	slot     int64
	hotKeys  int
	stats    Stats
	// gone holds, by limit, what regions no longer configured may still
	// apply of any of its vectors, until goneUntil (Config.GoneHold).
	gone      map[string]float64
	goneOf    map[string]float64 // by limit + "\x00" + region
	goneUntil time.Time

	// Scratch space of pass, by region.
	vec    Vector
	dst    []float64
	rate   []float64 // by hot key of one limit: its rate in the report being applied
	defb   []float32 // held shares of the limit's default vector
	excess []excess
}

// limitState is one limit's default vector and hot keys.
type limitState struct {
	name string
	// window is the limit's window where it is a sliding window longer
	// than the period (0: otherwise), and slot the boundary of it its
	// vectors were last retargeted for (see timed).
	window time.Duration
	slot   int64
	scale  float64   // the limit's rate per second (0: not known), Vector.Scale
	hits   bool      // it counts requests (cost ≈ hits), so a rate's noise is about its square root
	lag    uint8     // rebalances in a row its default vector stayed within the hysteresis of its targets
	floors []float64 // by region
	// units is, by region, the least share that gives each of the
	// region's instances with demand one request a window, where the
	// Fleet divides the limit among instances (0: none); see floorsOf.
	units []float64
	def   []cell // the default vector, by region
	index map[string]int32
	keys  []hotKey
	cells []cell // key i's vector is cells[i*n : i*n+n] for n regions
	// unsaved: def is InitialShares, of which no record exists yet (see
	// Coordinator.Unsaved).
	unsaved bool
}

type hotKey struct {
	name     string
	hot      int64 // unix ns when a region last reported it hot
	recorded bool  // a Record of it may exist
	lag      uint8 // as limitState.lag
}

// cell is one region's part of one vector. Shares are float32 to keep a
// hot key small; every share granted is rounded down to one.
type cell struct {
	share  float32 // latest share granted; follow: the default vector's
	bound  float32 // largest share of its own the region may be applying
	target float32 // where share is heading, set by every rebalance
	demand float32 // the region's demand: an average of its rate (cost per second), see observe
	claim  float32 // a decayed peak of demand, Vector.Claim
	flags  uint8
	reps   uint8 // a key's: reports of the region since it has had a share of its own (up to knownAfter)
	streak int8  // reports in a row above (> 0) or below (< 0) demand by more than noise, see observe
	n      uint8 // reports in demand since it was measured first (up to 255), see observe
}

const (
	pending    uint8 = 1 << iota // share not acknowledged yet
	dirty                        // share changed since the last assignment built
	viaDef                       // the region may be following the default vector
	known                        // the region's demand has been measured (see Vector.Known)
	counted                      // a key's: the report being applied has traffic of it
	wasCounted                   // a key's: so had the region's previous report
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
	if x.share == follow || s == follow {
		x.reps = 0 // a share of its own from now on, or none
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
// sent again. Limits without a record start from InitialShares, which the
// first pass persists.
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
	if cfg.Period < 0 || cfg.HalfLife < 0 || cfg.ClaimHalfLife < 0 || cfg.DeadAfter < 0 || cfg.HotTTL < 0 ||
		!(cfg.Hysteresis >= 0 && cfg.Hysteresis < 1) || !(cfg.MaxStep >= 0 && cfg.MaxStep <= 1) || cfg.MaxHotKeys < 0 {
		return nil, fmt.Errorf("%w: negative or out of range setting", ErrBadConfig)
	}
	cfg.Period = cmp.Or(cfg.Period, DefaultPeriod)
	cfg.HalfLife = cmp.Or(cfg.HalfLife, DefaultHalfLife)
	cfg.ClaimHalfLife = cmp.Or(cfg.ClaimHalfLife, DefaultClaimHalfLife)
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
		rtt: make([]time.Duration, n), sentAt: make([]time.Time, n), tickGap: defaultTickGap,
		vec: Vector{Demand: make([]float64, n), Claim: make([]float64, n), Known: make([]bool, n), Keep: make([]float64, n), Live: live,
			Shares: make([]float64, n), Held: make([]float64, n)},
		dst: make([]float64, n), defb: make([]float32, n),
	}
	for i, r := range d.Regions {
		c.regionOf[r] = i
	}
	for _, l := range d.Limits {
		if w := l.Rate.Period; l.Algorithm == allot.SlidingWindow && l.Mode == allot.Split && !l.Unlimited &&
			w > 0 && w <= cfg.Period && (c.window == 0 || w < c.window) {
			c.window = w
		}
		ls := &limitState{name: l.Name, floors: make([]float64, n), def: make([]cell, n), index: map[string]int32{}, unsaved: true}
		if c.longWindow(l) {
			ls.window = l.Rate.Period
		}
		if !l.Unlimited && l.Rate.Amount > 0 && l.Rate.Period > 0 {
			ls.scale = float64(l.Rate.Amount) / l.Rate.Period.Seconds()
		}
		ls.hits = l.Unit == allot.Requests
		for r, s := range InitialShares(l.Floors, d.Regions) {
			ls.floors[r] = l.Floors[d.Regions[r]]
			// dirty: the first pass persists the vector. The regions apply it
			// without an assignment, from InitialShares of the regions their
			// configuration lists; once that list changes, only a record
			// says what a region no longer listed may still apply.
			ls.def[r] = cell{share: float32(s), bound: float32(s), target: float32(s), flags: dirty}
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
	if rec.Key == "" {
		ls.unsaved = false
	} else {
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
			if cs[r].share != follow {
				// It held a share of its own under the earlier leader, so its
				// enforcers count the key: its first report says its demand.
				cs[r].reps = knownAfter - 1
			}
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

// releaseGone stops holding what region, no longer configured, may
// apply: every instance of it left.
func (c *Coordinator) releaseGone(region string) {
	for id := range c.goneOf {
		if strings.HasSuffix(id, "\x00"+region) {
			delete(c.goneOf, id)
		}
	}
	for limit := range c.gone {
		sum := 0.0
		for k, v := range c.goneOf {
			if strings.HasPrefix(k, limit+"\x00") {
				sum += v
			}
		}
		c.gone[limit] = sum
	}
}

// reserved is what regions no longer configured may still apply of a
// vector of limit at now.
func (c *Coordinator) reserved(limit string, now time.Time) float64 {
	if c.gone == nil || !now.Before(c.goneUntil) {
		return 0
	}
	return c.gone[limit]
}

// Unsaved returns the records of the default vectors that start from
// InitialShares and were not persisted yet, and marks them persisted:
// whoever grants a part of them first (Fleet.Attach) persists these
// before, as a pass does with what it sends.
func (c *Coordinator) Unsaved(now time.Time) []Record {
	var b builder
	for _, ls := range c.limits {
		if ls.unsaved {
			if b.regions == nil {
				b = builder{regions: c.regions, shares: make([][]Share, len(c.regions)), gone: c.goneCells(now)}
			}
			b.emit(ls.name, "", ls.def)
			ls.unsaved = false
		}
	}
	return b.recs
}

// goneCells returns, by limit, a cell for each region no longer
// configured that may still apply some of its vectors at now. Records
// written while they hold carry these cells, so a leader of a later term
// holds them too (from its own now: longer, never shorter).
func (c *Coordinator) goneCells(now time.Time) map[string][]Cell {
	if c.gone == nil || !now.Before(c.goneUntil) {
		return nil
	}
	out := make(map[string][]Cell, len(c.gone))
	for id, h := range c.goneOf {
		limit, region, _ := strings.Cut(id, "\x00")
		out[limit] = append(out[limit], Cell{Region: region, Share: h, Bound: h})
	}
	for _, cs := range out {
		slices.SortFunc(cs, func(a, b Cell) int { return strings.Compare(a.Region, b.Region) })
	}
	return out
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
	silent := !c.lastAt[r].IsZero() && m.At.Sub(c.lastAt[r]) > c.cfg.DeadAfter
	dt := reportInterval(c.lastAt[r], m.At)
	c.lastAt[r], c.heard[r] = m.At, now
	c.stats.Reports++
	if silent {
		// Silent for longer than DeadAfter (cut off, or its reports
		// lost): this report covers an interval not known, so it measures
		// nothing. The region's demand is measured again from its next.
		c.forget(r)
		return nil
	}
	perSec := 1 / dt.Seconds()
	n := len(c.regions)
	for _, ls := range c.limits {
		// A limit whose window is longer than the period is enforced over
		// its window: its demand is averaged over half a window, and its
		// claims kept for two.
		hl, chl := max(c.cfg.HalfLife, ls.window/2), max(c.cfg.ClaimHalfLife, 2*ls.window)
		est := estimate{
			keep:      float32(math.Exp2(-float64(dt) / float64(hl))),
			claimKeep: float32(math.Exp2(-float64(dt) / float64(chl))),
			dt:        dt.Seconds(),
			hits:      ls.hits,
			smooth:    ls.window > 0,
		}
		// Every cell of the region is updated, those the report leaves out
		// with a rate of 0: first the limit's default vector, then its
		// keys (rates by key index, 0 for a key the report leaves out).
		ld := limitDemand(m.Limits, ls.name)
		def := 0.0
		if ld != nil {
			def = (ld.Admitted + ld.Rejected) * perSec
		}
		c.observe(ls.def, r, def, est, true) // a report covers every limit with traffic: one left out had none
		c.rate = slices.Grow(c.rate[:0], len(ls.keys))[:len(ls.keys)]
		clear(c.rate)
		if ld != nil {
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
					c.rate = append(c.rate, 0)
				}
				if rate := (kd.Admitted + kd.Rejected) * perSec; rate > 0 || kd.NearLimit {
					c.rate[i] += rate
					ls.cells[int(i)*n+r].flags |= counted
				}
				if hot {
					ls.keys[i].hot = now.UnixNano()
				}
			}
		}
		for i := range ls.keys {
			cs := ls.cells[i*n : i*n+n : i*n+n]
			x := &cs[r]
			own := x.share != follow
			if own && x.reps < knownAfter {
				x.reps++
			}
			// A region that follows the default vector for the key counts
			// it only while near its allowance there, from the request that
			// left it near: its demand is known from the second report in a
			// row that counts it (the first counts part of its interval).
			cur, prev := x.flags&counted != 0, x.flags&wasCounted != 0
			k := cur && prev || own && x.reps >= knownAfter
			x.flags &^= counted | wasCounted
			if cur {
				x.flags |= wasCounted
			}
			c.observe(cs, r, c.rate[i], est, k)
		}
	}
	return nil
}

// observe takes rate, region r's measured rate for vector cs over a
// report's interval, into its demand; k says whether it measures the
// region's demand (see knownAfter). The average is exponentially
// weighted in time (est.keep: its weight depends on the interval a report
// covers, not on how often regions report), except for a shift, taken at
// once: a rate beyond noise (shiftFrac of the vector's demand, and two
// standard deviations of a Poisson count over the interval for a limit
// of requests) below the average in fallAfter reports in a row, or above
// it in riseAfter, one below half of it, or one above newLevel times the
// claim; so is the first measure. A shift makes the next Tick rebalance.
// A fall is taken sooner than a rise, and a rise within the claim (a
// level the region had lately) moves nothing until it lasts: share a
// region no longer uses is free for others, while demand that rises for
// a moment (a burst, a flip between regions) is over before moved share
// would count (a raise counts from the next window). A limit with a long
// window (est.smooth) is averaged only. The claim is the largest of the
// demand, the rate and the claim decayed.
func (c *Coordinator) observe(cs []cell, r int, rate float64, est estimate, k bool) {
	x := &cs[r]
	// Until the average spans its half-life, it is the mean of the
	// reports so far, so that a first measure that is off (a report that
	// covers part of an interval) weighs no more than the others.
	keep := min(est.keep, float32(x.n)/float32(x.n+1))
	x.n = min(x.n, 254) + 1
	switch d := float64(x.demand); {
	case !k:
		x.flags &^= known
		x.demand, x.streak, x.n = float32(rate), 0, 0
	case x.flags&known == 0:
		x.flags |= known
		x.demand, x.streak, x.n = float32(rate), 0, 1
		c.urgent = c.urgent || rate > 0 || d > 0
	case est.smooth:
		x.demand = keep*x.demand + (1-keep)*float32(rate)
	default:
		total := 0.0
		for i := range cs {
			if cs[i].flags&known != 0 {
				total += float64(cs[i].demand)
			}
		}
		noise := shiftFrac * max(total, rate)
		if est.hits {
			noise = max(noise, 2*math.Sqrt(max(rate, d)/est.dt))
		}
		switch {
		case rate > newLevel*max(d, float64(x.claim))+2*noise:
			x.streak = riseAfter // above anything it had: taken at once
		case rate > d+noise:
			x.streak = max(x.streak, 0) + 1
		case rate < d-noise && rate < d/2:
			x.streak = -fallAfter // down by more than half: taken at once
		case rate < d-noise:
			x.streak = min(x.streak, 0) - 1
		default:
			x.streak = 0
		}
		switch {
		case x.streak >= riseAfter || -x.streak >= fallAfter:
			x.demand, x.streak, x.n = float32(rate), 0, 1
			c.urgent = true
		case x.streak > 0 && rate <= float64(x.claim):
			// A rise within the claim (a level the region had lately: a
			// burst, a flip between regions) moves nothing until it
			// lasts: the claim keeps share for it where no region needs it.
		default:
			x.demand = keep*x.demand + (1-keep)*float32(rate)
		}
	}
	x.claim = max(x.demand, float32(rate), x.claim*est.claimKeep)
}

// forget marks region r's demand as not known, in every vector.
func (c *Coordinator) forget(r int) {
	n := len(c.regions)
	for _, ls := range c.limits {
		ls.def[r].flags &^= known
		ls.def[r].streak = 0
		for i := range ls.keys {
			ls.cells[i*n+r].flags &^= known
			ls.cells[i*n+r].streak = 0
		}
	}
}

func limitDemand(ls []LimitDemand, name string) *LimitDemand {
	for i := range ls {
		if ls[i].Limit == name {
			return &ls[i]
		}
	}
	return nil
}

// estimate is how one report moves the demand averages (see observe).
type estimate struct {
	keep      float32 // weight of the average so far: 2^(−interval/HalfLife)
	claimKeep float32 // decay of a claim over the interval
	dt        float64 // the interval, in seconds
	hits      bool    // the limit counts requests: see limitState.hits
	smooth    bool    // a long window: the average only, no shift taken at once
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
	if a.Version == c.sent[r] && !c.sentAt[r].IsZero() {
		c.rtt[r] = max(now.Sub(c.sentAt[r]), time.Millisecond)
	}
	// Every assignment carries all of the region's unacknowledged shares,
	// so one sent after the latest change of them confirms them all.
	if a.Version < c.changed[r] || a.Version <= c.acked[r] {
		return Ready{}, nil // superseded (a later change is on its way) or repeated
	}
	c.acked[r] = a.Version
	return c.pass(now, false, r), nil
}

// Tick rebalances if a period has passed since the previous rebalance (the
// first Tick always does), or sooner when a report showed a shift of
// demand or a region's demand was first measured, and, where Ticks come
// often enough, at the Tick timed for the next window boundary of a
// sliding-window limit (see onTime): it marks regions not heard from
// within DeadAfter as frozen, computes new targets for every vector, starts
// hot keys no longer reported hot for HotTTL on their way back to the
// default vector, and returns the assignments that move shares toward the
// targets. Every region with unacknowledged shares gets them again.
func (c *Coordinator) Tick(now time.Time) Ready {
	if gap := now.Sub(c.lastTick); !c.lastTick.IsZero() && gap > 0 {
		c.tickGap = gap
	}
	c.lastTick = now
	if now.Before(c.next) && !c.urgent || !c.onTime(now) {
		return Ready{}
	}
	return c.rebalance(now)
}

// rebalance sets new targets and moves the shares toward them.
func (c *Coordinator) rebalance(now time.Time) Ready {
	c.next, c.urgent = now.Add(c.cfg.Period), false
	c.stats.Rebalances++
	for r, h := range c.heard {
		c.live[r] = !h.IsZero() && now.Sub(h) < c.cfg.DeadAfter
	}
	return c.pass(now, true, -1)
}

// onTime reports whether a rebalance that is due may happen at now. Share
// moved to a region of a sliding-window limit counts there from its next
// window (the giving region may have spent it in this one), and a region
// lowered gives up the rest of its window at once. So where the driver's
// Ticks come often enough, a rebalance is timed for a window boundary B
// (of the shortest such window, on the coordinator's clock, which regions
// cut their windows on): at the last Tick before B − lead, where lead is
// the time a lowering, its acknowledgement and the raise it frees take
// (one and a half of the longest round trip of a live region). Regions
// lowered then lose the end of their window only, and regions raised get
// the share from B. At most one rebalance is timed for each boundary.
func (c *Coordinator) onTime(now time.Time) bool {
	w := c.window
	if w <= 0 {
		return true
	}
	lead := c.lead()
	if lead+c.tickGap >= w {
		return true // the Ticks or the round trips are too slow to time it
	}
	t := now.Add(lead).UnixNano()
	b := (t/int64(w) + 1) * int64(w) // the next boundary the moves can be in force for
	if b == c.slot || now.Add(c.tickGap).Add(lead).UnixNano() < b {
		return false // timed already, or a later Tick still makes it
	}
	c.slot = b
	return true
}

// longWindow reports whether l is a split-mode sliding window longer than
// the period (see timed).
func (c *Coordinator) longWindow(l *allot.Limit) bool {
	return l.Algorithm == allot.SlidingWindow && l.Mode == allot.Split && !l.Unlimited && l.Rate.Period > c.cfg.Period
}

// lead is the time from a rebalance to the raises it frees being in
// force: a lowering, its acknowledgement and the raise, one and a half of
// the longest round trip of a live region.
func (c *Coordinator) lead() time.Duration {
	var rtt time.Duration
	for r := range c.rtt {
		if c.live[r] || c.heard[r].IsZero() {
			rtt = max(rtt, cmp.Or(c.rtt[r], defaultRTT))
		}
	}
	return rtt*3/2 + leadMargin
}

// timed reports whether a rebalance at now sets new targets for limit
// ls. A limit whose window is longer than the period is enforced at the
// least share in force since its window began (or in the window's first
// moments, with a window guard) and uses a raise from its next window
// only: a split moved within a window loses what the lowered regions give
// up and gains nothing. So its targets move once a window, at the last
// rebalance before the next boundary less lead (rebalances come at least
// every period), and the window runs at that split from its start.
func (c *Coordinator) timed(ls *limitState, now time.Time) bool {
	w := int64(ls.window)
	if w <= 0 {
		return true
	}
	lead := c.lead()
	b := (now.Add(lead).UnixNano()/w + 1) * w
	if b == ls.slot || now.Add(c.cfg.Period).Add(lead).UnixNano() < b {
		return false
	}
	ls.slot = b
	return true
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
		retarget := rebalance && c.timed(ls, now)
		if retarget {
			c.retarget(ls, ls.def, nil, &ls.lag)
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
			case retarget:
				c.retarget(ls, cs, ls.def, &ls.keys[i].lag)
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
	b := builder{regions: c.regions, shares: make([][]Share, n), gone: c.goneCells(now)}
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
		if b.emit(ls.name, "", ls.def) {
			ls.unsaved = false
		}
	}
	for r, sh := range b.shares {
		if sh == nil {
			continue
		}
		c.version++
		c.sent[r], c.sentAt[r] = c.version, now
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
// cs is a hot key's; lag counts its rebalances within the hysteresis, see
// lagMoves). Once a key's shares move, all of them are its own: a key
// never mixes shares of its own with following the default, which would
// tie the default vector's raises to it. A key whose demand is not known
// in a region that follows the default there moves to shares of its own
// at once (at the levels they have, where not known): only then do that
// region's enforcers count the key's every request.
func (c *Coordinator) retarget(ls *limitState, cs, def []cell, lag *uint8) {
	v := &c.vec
	v.Floors, v.Scale = c.floorsOf(ls), ls.scale
	unknown := false
	for r := range cs {
		x := &cs[r]
		v.Keep[r] = 1
		if def != nil && ls.scale > 0 && def[r].flags&known != 0 {
			// A key's demand in a region is at most the region's demand for
			// the whole limit.
			v.Keep[r] = max(ls.floors[r], MinShare, float64(def[r].demand)*(1+Headroom)/ls.scale)
		}
		v.Demand[r] = float64(x.demand)
		v.Claim[r] = float64(x.claim)
		// A long window runs a whole window at the split set for it: a
		// region's demand counts once it is the mean of a few reports.
		v.Known[r] = x.flags&known != 0 && (ls.window == 0 || x.n >= longWindowReports)
		v.Shares[r] = float64(x.share)
		v.Held[r] = float64(x.bound)
		if def != nil {
			v.Held[r] = float64(x.held(def[r].bound))
			if x.share == follow {
				v.Shares[r] = float64(def[r].share)
				if !v.Known[r] && v.Live[r] {
					// It keeps what it would follow: the default's new target.
					unknown, v.Shares[r] = true, float64(def[r].target)
				}
			}
		}
	}
	target(c.dst, *v)
	off := 0.0
	for r := range cs {
		c.dst[r] = min(max(c.dst[r], v.Shares[r]-c.cfg.MaxStep), v.Shares[r]+c.cfg.MaxStep)
		off = max(off, math.Abs(c.dst[r]-v.Shares[r]))
	}
	moved := false
	switch {
	case ls.window != 0 && !unknown && saturated(v) && off < saturatedHysteresis:
		// A long window, and every region uses all of its share: the
		// split wastes nothing, and a move within the window would only
		// cost what its transition loses.
		*lag = 0
	case off >= c.cfg.Hysteresis || unknown:
		moved = true
	case off >= c.cfg.Hysteresis/4 && *lag+1 >= lagMoves:
		moved = true
	case off >= c.cfg.Hysteresis/4:
		*lag++
	default:
		*lag = 0
	}
	if moved {
		*lag = 0
	}
	for r := range cs {
		cs[r].target = cs[r].share
		if moved {
			cs[r].target = down32(c.dst[r])
		}
	}
}

// saturated reports whether every region that takes part in v uses at
// least its share (v.Scale known), so that the split in force leaves no
// share idle.
func saturated(v *Vector) bool {
	if v.Scale <= 0 {
		return false
	}
	some := false
	for r := range v.Shares {
		if !v.in(r) {
			continue
		}
		if v.Demand[r]/v.Scale < v.Shares[r] {
			return false
		}
		some = true
	}
	return some
}

// floorsOf is limit ls's floors: the configured ones, each raised to
// the region's units (one request a window for each of its instances
// with demand, see setUnits) where all of them fit in the limit. Below
// that, an instance's part of a share is a fraction of a request a
// window, and a sliding window or bucket admits only whole requests: a
// region of 10 instances with a share of 0.49 of 20 a window holds 0.98
// at each instance, and admits nothing.
func (c *Coordinator) floorsOf(ls *limitState) []float64 {
	if ls.units == nil {
		return ls.floors
	}
	c.floorBuf = grow(c.floorBuf, len(ls.floors))
	sum, raised := 0.0, false
	for r, f := range ls.floors {
		u := ls.units[r]
		raised = raised || u > f
		c.floorBuf[r] = max(f, u)
		sum += c.floorBuf[r]
	}
	if !raised || sum > 1+1e-9 {
		return ls.floors
	}
	return c.floorBuf
}

// setUnits sets region r's units for the named limit, whose amount a
// window is amount, from n, its instances with demand (see floorsOf).
func (c *Coordinator) setUnits(limit string, r, n int, amount float64) {
	ls := c.limitOf[limit]
	if ls == nil || amount <= 0 {
		return
	}
	if ls.units == nil {
		if n == 0 {
			return
		}
		ls.units = make([]float64, len(c.regions))
	}
	ls.units[r] = float64(n) / amount
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
	cells   []Cell            // backs the records' Cells
	gone    map[string][]Cell // by limit: what regions no longer configured still hold
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
		b.cells = append(b.cells, b.gone[limit]...)
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
