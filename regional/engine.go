package regional

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot"
)

// Errors returned by Engine methods for bad input; nothing is charged when
// one is returned.
var (
	// ErrUnknownDomain is returned for a domain the configuration lacks.
	ErrUnknownDomain = errors.New("regional: unknown domain")
	// ErrUnknownLimit is returned by SetShare and SetKeyShare for a limit
	// the domain lacks.
	ErrUnknownLimit = errors.New("regional: unknown limit")
	// ErrBadCost is returned for a negative cost or one above allot.MaxAmount.
	ErrBadCost = errors.New("regional: bad cost")
	// ErrBadDescriptor is returned for a descriptor with an empty key, or
	// more than MaxEntries entries.
	ErrBadDescriptor = errors.New("regional: bad descriptor")
	// ErrBadShare is returned for a share outside [0, 1].
	ErrBadShare = errors.New("regional: bad share")
	// ErrCostAboveBurst is returned by Check and CheckItems for a cost that
	// no matching limit could ever admit: above its burst.
	ErrCostAboveBurst = errors.New("regional: cost above burst")
)

// MaxEntries bounds the entries of one descriptor.
const MaxEntries = 64

// DefaultMaxKeys is the key table's bound when Options.MaxKeys is 0:
// about 4M keys, a few hundred MB.
const DefaultMaxKeys = 1 << 22

// maxInline is how many matching limits one check handles without
// allocating.
const maxInline = 8

// Options configure an Engine.
type Options struct {
	// MaxKeys bounds the key table. Past it, keys whose state is back to
	// full are dropped first (which changes no decision), then the key
	// closest to full. 0 means DefaultMaxKeys.
	MaxKeys int
}

// Engine decides requests from memory: it matches a request's descriptors
// against the domain's limits, keeps each key's state in a bounded table,
// scales every limit by the region's share, and charges a request only if
// every matching limit admits it. Time is always an argument.
//
// An Engine is safe for concurrent use. The zero value is not usable; call
// New.
type Engine struct {
	mu     sync.Mutex               // serialises Reconfigure and share changes
	shares map[string]*limitShares  // by domain + "\x00" + limit; kept across reloads
	named  [][2]string              // (domain, limit) of each limitShares.id
	cfg    atomic.Pointer[compiled] // read lock-free on every check

	table *table
	seed  maphash.Seed
	// initial gives a limit's share when Reconfigure first sees it (nil: 1,
	// a region alone); guarded by mu.
	initial func(d *allot.Domain, l *allot.Limit) float64
	peer    atomic.Pointer[peerState] // set once by SetPeers (peer.go)
	guard   atomic.Int64              // the window guard, ns (SetWindowGuard)
}

// SetWindowGuard sets the window guard g of the sliding windows' share
// changes from now on. With g 0 (the zero value), a window uses the least
// share in force since it began: a lowering counts at once, a raise from
// the next window. With g > 0, a change made past a window's first g
// counts from the next window whichever way it goes, so that share
// moving from one region to another mid-window is neither lost there nor
// spent twice: the region that gave it up may spend it until the window
// ends, the one that got it from the next window on. It applies to
// windows of GuardedWindow or more. That holds when
// every instance's windows start within g/2 of the coordinator's (an
// instance measures its own error, node.Node.Skew): each instance whose
// error is unknown or larger keeps g at 0. Safe for concurrent use.
func (e *Engine) SetWindowGuard(g time.Duration) { e.guard.Store(int64(max(g, 0))) }

// GuardedWindow is the shortest window the window guard applies to.
// Shorter windows keep the least share in force since they began: they
// end soon, and a region that lost share then stops admitting at once,
// which the coordinator's next rebalance sees (measured: a 10 s window
// with 2 s rebalances oscillated between two regions under the guard,
// sim/scenarios/region-removed.yaml 77.9 → 66.7 % utilisation, while
// windows of a minute and more gained 26 to 71 points).
const GuardedWindow = time.Minute

// WindowGuard returns the window guard set by SetWindowGuard.
func (e *Engine) WindowGuard() time.Duration { return time.Duration(e.guard.Load()) }

type compiled struct {
	src     *allot.Config
	domains map[string]*domainState
	list    []*domainState // the same, scanned instead of the map when short
}

func (c *compiled) domain(name string) *domainState {
	if len(c.list) <= 4 {
		for _, ds := range c.list {
			if ds.d.Name == name {
				return ds
			}
		}
		return nil
	}
	return c.domains[name]
}

type domainState struct {
	d      *allot.Domain
	limits []*limitState
	byName map[string]*limitState
	adhoc  *limitState // keys of descriptors that bring their own limit and match none
	// stored says some limit is leased or exact: an Enforcer sends it to
	// its store.
	stored bool
}

type limitState struct {
	l      *allot.Limit
	base   params // the configured limit, share 1
	salt   uint64 // the key hash of the limit itself; values are mixed in
	shares *limitShares
	// change is the latest change of a bucket's rate or burst
	// (Reconfigure), or nil: a key last updated before it is brought up
	// to it under what was in force before, so that a raised rate never
	// refills the time before the raise.
	change *reconf
}

// reconf is a change of a token bucket or GCRA limit's configured rate or
// burst at an instant, with the changes before it (at most maxReconfs in
// all): a key is read under the parameters it was last updated under.
type reconf struct {
	at     int64
	before params  // in force before at (share 1)
	prev   *reconf // the change before, nil when none or forgotten
	// forgot: changes before this one were made and are no longer
	// kept, so a key last updated before at is read as empty at at.
	forgot bool
}

// maxReconfs bounds the configuration changes a limit keeps.
const maxReconfs = 4

// since returns, oldest first, the changes of c's chain after last.
func (c *reconf) since(last int64) []*reconf {
	var cs []*reconf
	for ; c != nil && c.at > last; c = c.prev {
		cs = append(cs, c)
	}
	slices.Reverse(cs)
	return cs
}

// changeFor is ls's latest configuration change for a key whose limit is
// base, or nil: a key with a plan or override of its own (base differs
// from the limit's) follows its own parameters, not the configuration's.
func (ls *limitState) changeFor(base params) *reconf {
	if c := ls.change; c != nil && base == ls.base {
		return c
	}
	return nil
}

// limitShares holds the region's share of one limit: the default for its
// keys and the hot keys' own. Both are replaced, never mutated.
type limitShares struct {
	id   int // index of the limit's demand counters in each shard
	def  atomic.Pointer[shareHist]
	keys atomic.Pointer[map[uint64]*keyShare]
	// following counts the keys of keys that follow def again (retired);
	// the engine's mu guards it.
	following int
	sync      atomic.Pointer[limitSync] // the link to other regions, after SetPeers (peer.go)

	// persist is the state of its long windows' marks, once gated
	// (persist.go).
	persist atomic.Pointer[limitPersist]
	// ownRates: a request brought its own rate for a key of the limit
	// (Item.Limit), whose count the limit's rate does not measure.
	ownRates atomic.Bool
}

// keyShare is a hot key's own share. A key that goes back to its limit's
// default (retired) keeps its own history, following the default's
// changes, until a whole period has passed: a window that began under
// its own share keeps the least share in force since it began, and a
// bucket last touched under it is brought up to date through the change.
// After a period both histories give the same state.
type keyShare struct {
	name   string // as KeyString names it
	hist   *shareHist
	follow bool  // retired: hist follows the limit's default
	until  int64 // a retired key is dropped from then on (unix ns)
}

// shareHist is a share and its recent changes, so that a key touched after
// a change is brought up to date as if the change had applied to it at the
// instant it was made: refill at the old share until then, clamp to the new
// burst, refill at the new share since. A key idle across more changes than
// the history holds treats the older ones as one (prev, the least of them:
// it refills at no more than the share it had, so nothing is spent twice).
//
// For sliding windows the history also keeps, whatever the number of
// changes, the least share in force in the window of its latest change
// (low, in windows of per ns): a window that outlives the kept changes
// still uses the share in force when it began. With a window guard g
// (Engine.SetWindowGuard), it also keeps early, the least share in force
// in the window's first g: past its first g, a window uses early, so
// that a change made later in the window, a lowering as well as a
// raise, counts from the next window on.
type shareHist struct {
	prev    float64 // share before changes[0]
	n       int
	changes [8]shareChange
	per     int64   // the period low is counted in; 0: none
	win     int64   // the window (index in per) of the latest change
	low     float64 // the least share in force in win, up to now
	early   float64 // the least share in force in win's first g
	g       int64   // the window guard (ns) when win was recorded; 0: none
	// extra is allowance added to window xwin (in per) from xfrom until
	// xuntil (unix ns), drawn from what others released of it (Engine.AddExtra):
	// the window may use low (or early) plus it, never above the share.
	xwin, xfrom, xuntil int64
	extra               float64
}

type shareChange struct {
	at    int64
	share float64
}

var fullShare = &shareHist{prev: 1}

func (h *shareHist) current() float64 {
	if h.n == 0 {
		return h.prev
	}
	return h.changes[h.n-1].share
}

// forCheck is the share a check at now may use. A key counted in windows
// (sliding_window) uses the least share in force since its window began:
// share moved here within a window takes effect at the next one, because
// the region that gave it up may already have spent its part of this
// window. (A token bucket needs no such care: lowering a share clamps the
// tokens, so spent share is never handed on.)
func (h *shareHist) forCheck(p params, now int64) float64 {
	s := h.current()
	if p.alg != allot.SlidingWindow || h.n == 0 {
		return s
	}
	if h.per == p.period && h.per > 0 {
		switch w := now / p.period; {
		case w > h.win:
			return s // the latest change was before this window began
		case w == h.win && h.g > 0 && now%p.period > h.g:
			// past the guard: later changes count from the next window
			return min(max(s, h.early), h.early+h.extraAt(w, now))
		case w == h.win:
			return min(s, h.low+h.extraAt(w, now))
		}
		s = min(s, h.low) // the clock stepped back: the least known
	}
	return min(s, h.leastSince(now-now%p.period))
}

// leastSince is the least share in force from ws on that the kept
// changes tell: exact when one of them is at or before ws, and the
// least before them otherwise.
func (h *shareHist) leastSince(ws int64) float64 {
	s := h.current()
	for i := h.n - 1; i >= 0; i-- {
		if h.changes[i].at <= ws {
			return min(s, h.changes[i].share) // in force when the window began
		}
		s = min(s, h.changes[i].share)
	}
	return min(s, h.prev)
}

// with returns a copy of h with share in force from at; per is the
// period of the limit's windows (0 for buckets), g the engine's window
// guard (SetWindowGuard).
func (h *shareHist) with(at int64, share float64, per, g int64) *shareHist {
	c := *h
	if per < int64(GuardedWindow) {
		g = 0
	}
	if per > 0 {
		inGuard := at%per <= g
		switch w := at / per; {
		case c.per != per || w > c.win:
			start := c.current() // the latest change was before this window began...
			if c.per != per {
				start = c.leastSince(at - at%per) // ...or, in another period, the least known
			}
			c.per, c.win, c.g = per, w, g
			c.extra = 0
			c.low, c.early = min(start, share), start
			if inGuard {
				c.early = c.low
			}
		default: // the same window, or the clock stepped back
			if share < c.current() || w < c.win {
				c.extra = 0 // a lowering gives up what the window had of it (MoveShare)
			}
			c.low = min(c.low, share)
			if inGuard || w < c.win {
				c.early = min(c.early, share)
			}
		}
	}
	if c.n > 0 && at <= c.changes[c.n-1].at { // same instant or clock step back: replace
		at = c.changes[c.n-1].at
		c.n--
	}
	if c.n == len(c.changes) {
		c.prev = min(c.prev, c.changes[0].share)
		copy(c.changes[:], c.changes[1:])
		c.n--
	}
	c.changes[c.n] = shareChange{at, share}
	c.n++
	return &c
}

// catchUp applies the share changes, and the configuration changes of c
// (nil: none), made since s was last updated.
func (h *shareHist) catchUp(s *slot, base params, c *reconf) {
	if base.alg == allot.SlidingWindow {
		return // counts are absolute: a window needs no conversion
	}
	last := lastUpdate(s, base.alg)
	cs := c.since(last)
	if len(cs) == 0 && (h.n == 0 || h.changes[h.n-1].at <= last) {
		return
	}
	if len(cs) > 0 && cs[0].forgot { // last updated under parameters no longer known: empty
		last = cs[0].at
		setTokens(s, last, 0, cs[0].before.scaled(h.at(last)))
	}
	h.walk(s, last, h.at(last), base, cs)
}

// at is the share in force at t that the kept changes tell (the least
// before them for an earlier t).
func (h *shareHist) at(t int64) float64 {
	share := h.prev
	for _, ch := range h.changes[:h.n] {
		if ch.at <= t {
			share = ch.share
		}
	}
	return share
}

// walk brings s from last, at share, through every later share change
// and the configuration changes cs (oldest first, all after last). A
// share change and a configuration change at the same instant are taken
// in the order that leaves the fewer tokens: which came first is not
// kept, and a raised burst adds its difference at the share then.
func (h *shareHist) walk(s *slot, last int64, share float64, base params, cs []*reconf) {
	cur := base
	if len(cs) > 0 {
		cur = cs[0].before
	}
	i := 0
	for i < h.n && h.changes[i].at <= last {
		i++
	}
	for {
		next := int64(math.MaxInt64)
		if i < h.n {
			next = h.changes[i].at
		}
		switch {
		case len(cs) > 0 && cs[0].at < next:
			cur = reconfigure(s, cs, cur, base, share)
			cs = cs[1:]
		case len(cs) > 0 && cs[0].at == next: // both at once
			ch := h.changes[i]
			a, b := *s, *s
			reshare(&a, ch.at, cur, share, ch.share)
			reconfigure(&a, cs, cur, base, ch.share)
			to := reconfigure(&b, cs, cur, base, share)
			reshare(&b, ch.at, to, share, ch.share)
			*s = a
			if tokensAt(&b, ch.at, to.scaled(ch.share)) < tokensAt(&a, ch.at, to.scaled(ch.share)) {
				*s = b
			}
			cur, share, cs = to, ch.share, cs[1:]
			i++
		case i < h.n:
			ch := h.changes[i]
			reshare(s, ch.at, cur, share, ch.share)
			share = ch.share
			i++
		default:
			return
		}
	}
}

// reshare moves s at at from share to share under p: a lowering clamps.
func reshare(s *slot, at int64, p params, from, to float64) {
	f, t := p.scaled(from), p.scaled(to)
	setTokens(s, at, math.Min(tokensAt(s, at, f), t.burst), t)
}

// reconfigure moves s at cs[0].at from cur to what follows cs[0] (base
// when it is the latest), at share: a raised burst adds its difference,
// a lowered one clamps. It returns what follows.
func reconfigure(s *slot, cs []*reconf, cur, base params, share float64) params {
	to := base
	if len(cs) > 1 {
		to = cs[1].before
	}
	f, t := cur.scaled(share), to.scaled(share)
	tok := tokensAt(s, cs[0].at, f)
	setTokens(s, cs[0].at, math.Min(tok+math.Max(0, t.burst-f.burst), t.burst), t)
	return to
}

// fresh initialises the state of a key this engine does not hold at now
// (new, or swept when full): as if it had been full all along and had
// followed every share change (and the configuration changes of c, nil
// for none), a bucket holds at most what the share in force before the
// changes kept gave it, clamped and refilled through them (a key first
// seen just after a raise has not the raised burst: the region that gave
// the share up may have spent it). A window starts empty.
func (h *shareHist) fresh(s *slot, now int64, base params, c *reconf) {
	if base.alg == allot.SlidingWindow {
		fresh(s, now, base.scaled(h.current()))
		return
	}
	if h.n > 0 && h.changes[0].at > now { // the clock stepped back: the least known
		fresh(s, now, base.scaled(h.leastSince(math.MinInt64)))
		return
	}
	var cs []*reconf
	for _, x := range c.since(math.MinInt64) {
		if x.at <= now {
			cs = append(cs, x)
		}
	}
	start := now
	if h.n > 0 {
		start = h.changes[0].at - 1
	}
	if len(cs) > 0 {
		start = min(start, cs[0].at-1)
	}
	if start == now {
		fresh(s, now, base.scaled(h.current()))
		return
	}
	p := base
	if len(cs) > 0 {
		p = cs[0].before
	}
	fresh(s, start, p.scaled(h.prev))
	h.walk(s, start, h.prev, base, cs)
}

// New returns an engine enforcing cfg.
func New(cfg *allot.Config, opts Options) *Engine {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	e := &Engine{
		shares: make(map[string]*limitShares),
		table:  newTable(opts.MaxKeys),
		seed:   maphash.MakeSeed(),
	}
	e.Reconfigure(time.Time{}, cfg)
	return e
}

// Reconfigure replaces the configuration from now on. Keys of limits that
// keep their domain and name keep their state; so do shares. A sliding
// window's counts are absolute, so a window takes a changed amount as it
// stands; a token bucket or GCRA key is brought up to now under what was
// in force before (a raised rate refills from now on, a raised burst adds
// its difference at once, a lowered one clamps).
func (e *Engine) Reconfigure(now time.Time, cfg *allot.Config) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.cfg.Load()
	c := &compiled{src: cfg, domains: make(map[string]*domainState)}
	for _, d := range cfg.Domains {
		ds := &domainState{d: d, byName: make(map[string]*limitState)}
		for _, l := range d.Limits {
			id := d.Name + "\x00" + l.Name
			sh := e.shares[id]
			if sh == nil {
				sh = &limitShares{id: len(e.named)}
				e.named = append(e.named, [2]string{d.Name, l.Name})
				sh.def.Store(fullShare)
				if e.initial != nil {
					sh.def.Store(&shareHist{prev: e.initial(d, l)})
				}
				e.shares[id] = sh
			}
			ls := &limitState{
				l:      l,
				base:   baseParams(l, allot.Effective{Rate: l.Rate, Burst: l.Burst}),
				salt:   maphash.String(e.seed, id),
				shares: sh,
			}
			ls.change = reconfigured(old, d.Name, ls.base, l.Name, now.UnixNano())
			ds.limits = append(ds.limits, ls)
			ds.byName[l.Name] = ls
			ds.stored = ds.stored || l.Enforcement != allot.Local && !l.Unlimited
		}
		ds.adhoc = &limitState{
			l:      &allot.Limit{Name: adhocName, Algorithm: allot.SlidingWindow},
			salt:   maphash.String(e.seed, d.Name+"\x00"+adhocName),
			shares: &limitShares{id: -1},
		}
		ds.adhoc.shares.def.Store(fullShare)
		c.domains[d.Name] = ds
		c.list = append(c.list, ds)
	}
	e.attachSync(c)
	e.cfg.Store(c)
}

// reconfigured is the change a limit's new base makes to what old
// compiled, nil when none: the limit's rate and burst are the same, it is
// new, it is a sliding window, or its algorithm changed (its state starts
// over as it stands).
func reconfigured(old *compiled, domain string, base params, name string, now int64) *reconf {
	if old == nil || base.alg == allot.SlidingWindow {
		return nil
	}
	ds := old.domains[domain]
	if ds == nil {
		return nil
	}
	o := ds.byName[name]
	if o == nil || o.base.alg != base.alg {
		return nil
	}
	if o.base == base {
		return o.change
	}
	c := &reconf{at: now, before: o.base}
	// keep at most maxReconfs changes: copies, since the old chain is
	// still read under the old configuration's limit state
	for p, q, n := c, o.change, 1; q != nil; p, q, n = p.prev, q.prev, n+1 {
		if n == maxReconfs {
			p.prev, p.forgot = nil, true
			break
		}
		cp := *q
		p.prev = &cp
	}
	return c
}

// SetInitialShare sets how a limit that a later Reconfigure adds gets its
// first share: a coordinated region starts new limits at its initial
// split, never at the whole limit. It affects only limits not seen yet.
func (e *Engine) SetInitialShare(fn func(d *allot.Domain, l *allot.Limit) float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.initial = fn
}

// Config returns the configuration in force.
func (e *Engine) Config() *allot.Config { return e.cfg.Load().src }

func baseParams(l *allot.Limit, eff allot.Effective) params {
	p := params{alg: l.Algorithm, amount: float64(eff.Rate.Amount), burst: float64(eff.Burst), period: int64(eff.Rate.Period)}
	if p.alg == allot.SlidingWindow {
		p.burst = p.amount
	}
	p.own = p.burst
	return p
}

// SetShare sets the region's default share of a limit from now on. A
// lower share clamps every key's tokens to the new burst before it refills
// at the new rate.
func (e *Engine) SetShare(now time.Time, domain, limit string, share float64) error {
	ls, err := e.limitFor(domain, limit, share)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ls.setDefault(now.UnixNano(), share, e.guard.Load())
	return nil
}

// setDefault puts share in force from t for the limit's default vector
// and the keys that follow it, under the window guard g. The caller
// holds the engine's mu.
func (ls *limitState) setDefault(t int64, share float64, g int64) {
	per := ls.windowPer()
	ls.shares.def.Store(ls.shares.def.Load().with(t, share, per, g))
	ls.follow(func(ks *keyShare) *shareHist { return ks.hist.with(t, share, per, g) }, t)
}

// windowPer is the period a limit's share histories count windows in: its
// own for a sliding window, none for buckets.
func (ls *limitState) windowPer() int64 {
	if ls.base.alg != allot.SlidingWindow {
		return 0
	}
	return ls.base.period
}

// follow gives every retired key of ls the history next makes of its
// own (a change of the default) and drops those retired long enough.
// The caller holds the engine's mu.
func (ls *limitState) follow(next func(*keyShare) *shareHist, now int64) {
	if ls.shares.following == 0 {
		return
	}
	old := *ls.shares.keys.Load()
	m := make(map[uint64]*keyShare, len(old))
	for h, ks := range old {
		switch {
		case !ks.follow:
			m[h] = ks
		case ks.until > now:
			m[h] = &keyShare{name: ks.name, hist: next(ks), follow: true, until: ks.until}
		default:
			ls.shares.following--
		}
	}
	ls.shares.keys.Store(&m)
}

// ResetShare replaces the region's default share of a limit and its
// history: share is in force since since, and nothing before it (zero
// since: in force always). An instance that held nothing learns so from
// its first full grant when its share has been in force (for a sliding
// window, a share in force since before the window began may be used in
// full; one raised within it, from the next window).
func (e *Engine) ResetShare(domain, limit string, share float64, since time.Time) error {
	ls, err := e.limitFor(domain, limit, share)
	if err != nil {
		return err
	}
	h := &shareHist{prev: share}
	if !since.IsZero() {
		// Before since: nothing, or what a restored window used (persist.go).
		h = &shareHist{n: 1, prev: ls.shares.restoredLow(since.UnixNano(), ls.windowPer())}
		h.changes[0] = shareChange{at: since.UnixNano(), share: share}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ls.shares.def.Store(h)
	// A retired key keeps the least share of its own window: the reset
	// applies to it from since, or as its latest change.
	ls.follow(func(ks *keyShare) *shareHist {
		at := since.UnixNano()
		if last := ks.hist.changes[ks.hist.n-1].at; since.IsZero() || at < last {
			at = last
		}
		return ks.hist.with(at, share, ls.windowPer(), e.guard.Load())
	}, math.MinInt64)
	return nil
}

// SetKeyShare sets the region's share of one hot key (named as KeyString
// names it) from now on. A negative share removes the key's own share, so
// it follows the limit's default again.
func (e *Engine) SetKeyShare(now time.Time, domain, limit, key string, share float64) error {
	return e.SetKeyShares(now, domain, limit, []KeyShare{{Key: key, Share: share}})
}

func (e *Engine) limitFor(domain, limit string, share float64) (*limitState, error) {
	if !(share >= 0 && share <= 1) {
		return nil, fmt.Errorf("%w: %v is outside [0, 1]", ErrBadShare, share)
	}
	ds := e.cfg.Load().domain(domain)
	if ds == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownDomain, domain)
	}
	ls := ds.byName[limit]
	if ls == nil {
		return nil, fmt.Errorf("%w %q in domain %q", ErrUnknownLimit, limit, domain)
	}
	return ls, nil
}

// Share returns the region's share of a key of a limit: the key's own, or
// the limit's default. It returns 0 for an unknown domain or limit.
func (e *Engine) Share(domain, limit, key string) float64 {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return 0
	}
	h, err := e.keyOf(ls, key)
	if err != nil {
		return ls.shares.def.Load().current()
	}
	return ls.shares.hist(h).current()
}

// keyOf hashes a key named by KeyString, which must name a key of ls.
func (e *Engine) keyOf(ls *limitState, key string) (uint64, error) {
	name, d, err := ParseKeyString(key)
	if err != nil {
		return 0, err
	}
	h, ok := e.matchKey(ls, d)
	if name != ls.l.Name || len(d) != len(ls.l.Match) || !ok {
		return 0, fmt.Errorf("%w: key %q is not a key of limit %q", ErrBadDescriptor, key, ls.l.Name)
	}
	return h, nil
}

func (sh *limitShares) hist(key uint64) *shareHist {
	if m := sh.keys.Load(); m != nil {
		if ks, ok := (*m)[key]; ok {
			return ks.hist
		}
	}
	return sh.def.Load()
}

// KeyString names one key of a limit: "per-user:user=42" for limit
// per-user matching {user: "*"}. The values come from d, in the limit's
// match order; '%', ',' and '=' in values are escaped as %25, %2C and %3D,
// so that ParseKeyString can take the name apart again.
func KeyString(l *allot.Limit, d allot.Descriptor) string {
	b := make([]byte, 0, 64)
	b = append(b, l.Name...)
	b = append(b, ':')
	for i, m := range l.Match {
		if i > 0 {
			b = append(b, ',')
		}
		v, _ := d.Get(m.Key)
		b = append(b, m.Key...)
		b = append(b, '=')
		for j := range len(v) {
			switch c := v[j]; c {
			case '%', ',', '=':
				b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
			default:
				b = append(b, c)
			}
		}
	}
	return string(b)
}

// ParseKeyString takes apart a name made by KeyString: the limit's name
// and the key's descriptor.
func ParseKeyString(key string) (limit string, d allot.Descriptor, err error) {
	limit, rest, ok := strings.Cut(key, ":")
	if !ok || limit == "" {
		return "", nil, fmt.Errorf("%w: key %q: want LIMIT:k=v,...", ErrBadDescriptor, key)
	}
	if rest == "" {
		return limit, nil, nil
	}
	for part := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return "", nil, fmt.Errorf("%w: key %q: want k=v, got %q", ErrBadDescriptor, key, part)
		}
		uv, err := url.PathUnescape(v)
		if err != nil {
			return "", nil, fmt.Errorf("%w: key %q: %v", ErrBadDescriptor, key, err)
		}
		d = append(d, allot.Entry{Key: k, Value: uv})
	}
	return limit, d, nil
}

// matchKey reports whether ls matches d and, if so, returns its key's
// hash: the limit's salt with the hash of each matched value mixed in, in
// match order. It equals keyOf(ls, KeyString(ls.l, d)).
func (e *Engine) matchKey(ls *limitState, d allot.Descriptor) (uint64, bool) {
	h := ls.salt
	for _, m := range ls.l.Match {
		v, ok := d.Get(m.Key)
		if !ok || !allot.MatchValue(m.Value, v) {
			return 0, false
		}
		h = mix(h ^ maphash.String(e.seed, v))
	}
	return normKey(h), true
}

// mix is a 64-bit finaliser (murmur3's fmix64): every input bit affects
// every output bit, so the shard (top bits) and slot (low bits) of a key
// are both well spread.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Sweep drops every key whose state is back to full at now. It changes no
// decision and returns how many keys it dropped. Call it from time to time
// (every few seconds); inserts also sweep a full shard.
func (e *Engine) Sweep(now time.Time) int {
	n := 0
	for i := range e.table.shards {
		sh := &e.table.shards[i]
		sh.mu.Lock()
		n += sh.sweep(now.UnixNano())
		sh.mu.Unlock()
	}
	return n
}

// Demand drains the traffic counted since the previous call: one entry
// per limit with traffic (Key empty), one per tracked key with traffic
// (NearLimit: it was rejected or left with a tenth of its burst or less
// here since the previous call; see demand.go for which keys are
// tracked), and one, perhaps without traffic, per key the region holds a
// share of its own for. Entries are ordered by domain, limit and key;
// Region and At are left for the caller.
func (e *Engine) Demand() []allot.Demand {
	e.mu.Lock()
	named := e.named
	e.mu.Unlock()
	limits := make([]demand, len(named))
	type keyID struct {
		id   int
		name string
	}
	keys := make(map[keyID]*allot.Demand)
	own := e.ownKeys() // counted in full from now on (demand.go)
	for i := range e.table.shards {
		sh := &e.table.shards[i]
		sh.mu.Lock()
		for id, d := range sh.demand {
			if id < len(limits) {
				limits[id].admitted += d.admitted
				limits[id].rejected += d.rejected
			}
		}
		clear(sh.demand)
		sh.drainHot(func(h *hotKey) {
			if id := h.shares.id; id < len(named) {
				keys[keyID{id, h.name}] = &allot.Demand{Domain: named[id][0], Limit: named[id][1], Key: h.name,
					Admitted: h.admitted, Rejected: h.rejected, NearLimit: h.near}
			}
		}, own[i])
		sh.mu.Unlock()
	}
	var out []allot.Demand
	for id, d := range limits {
		if d.admitted > 0 || d.rejected > 0 {
			out = append(out, allot.Demand{Domain: named[id][0], Limit: named[id][1], Admitted: d.admitted, Rejected: d.rejected})
		}
	}
	for _, ds := range e.cfg.Load().list {
		for _, ls := range ds.limits {
			m := ls.shares.keys.Load()
			if m == nil {
				continue
			}
			for _, ks := range *m {
				if ks.follow {
					continue // retired: the region holds no share of its own
				}
				if k := (keyID{ls.shares.id, ks.name}); keys[k] == nil {
					keys[k] = &allot.Demand{Domain: ds.d.Name, Limit: ls.l.Name, Key: ks.name}
				}
			}
		}
	}
	for _, d := range keys {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b allot.Demand) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// Stats are the engine's counters.
type Stats struct {
	Keys          int    // keys in the table
	EvictedIdle   uint64 // keys dropped because their state was full again
	EvictedActive uint64 // keys dropped to respect MaxKeys while not full
	// Recalled counts keys evicted while active and made again from their
	// own kept state; Conservative those made again as charged as an
	// evicted key that shared their place could be (table.go recall).
	Recalled, Conservative uint64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	var s Stats
	for i := range e.table.shards {
		sh := &e.table.shards[i]
		sh.mu.Lock()
		s.Keys += sh.n
		s.EvictedIdle += sh.stats.evictedIdle
		s.EvictedActive += sh.stats.evictedActive
		s.Recalled += sh.stats.recalled
		s.Conservative += sh.stats.conservative
		sh.mu.Unlock()
	}
	return s
}
