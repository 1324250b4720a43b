package regional

import (
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// Moving allowance within a window (docs/adr/0005). A sliding window's
// share raised within a window counts from the next one, because the
// region or instance that gave it up may already have spent its part of
// this window. A quantity can move at once, though: what a giver has not
// admitted in the window and will not admit in it is exactly what a
// receiver may add to that window. MoveShare lowers a share and says what
// it gave up (a Release); AddExtra adds a quantity drawn from releases to
// one window of a receiver's share. Whoever pairs them (the coordinator)
// must hand out no more than was released, per limit and window.

// Release is what a share change gave up of the window holding it: Value,
// a fraction of the limit (of every key's own limit), in the window that
// starts at Window (unix ns, the engine's clock). Zero Value: nothing. Key
// names the hot key (KeyString) whose own share gave it up; empty, the
// limit's default vector and the keys that follow it.
type Release struct {
	Key    string
	Window int64
	Value  float64
}

// Extra is allowance added to one window of a share: Value, a fraction
// of the limit, usable in the window that starts at Window (unix ns) from
// From until Until (unix ns, within the window), never above the share in
// force. A holder whose clock may be off by e uses [Window + 2e, window's
// end − 2e): whatever its clock reads then, true time is within the
// window whose allowance was released. Key names the hot key whose own
// share it adds to (a key that follows the default takes none); empty,
// the default vector and the keys that follow it.
type Extra struct {
	Key         string
	Window      int64
	Value       float64
	From, Until int64
}

// winUse is the most that any key of a limit has counted in one window
// of one shard, as a fraction of the key's own limit (Engine.MoveShare).
type winUse struct {
	start int64 // window start (unix ns); 0: none
	max   float64
}

// noteWindow records that the sliding-window key in s, of ls, with the
// unshared parameters base, counts s.a in the window that starts at s.t.
// A key whose period is not its limit's counts as having spent all: its
// windows are not the ones a release names. The caller holds the shard's
// lock.
func (sh *shard) noteWindow(ls *limitState, base params, s *slot) {
	id := ls.shares.id
	if id < 0 || base.alg != allot.SlidingWindow || ls.l.Mode != allot.Split {
		return
	}
	start, used := s.t, s.a/base.amount
	if base.period != ls.base.period || !(base.amount > 0) {
		start, used = s.t-s.t%ls.base.period, math.Inf(1)
	}
	if id >= len(sh.wins) {
		sh.wins = append(sh.wins, make([]winUse, id+1-len(sh.wins))...)
	}
	switch u := &sh.wins[id]; {
	case start > u.start:
		*u = winUse{start, used}
	case start == u.start:
		u.max = max(u.max, used)
	}
}

// windowUse is the most that any key of the limit with demand counters
// id counted in the window starting at start, as a fraction of its own
// limit: 1 or more when it is not known (a clock stepped back).
func (t *table) windowUse(id int, start int64) float64 {
	u := 0.0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if id < len(sh.wins) {
			switch w := sh.wins[id]; {
			case w.start == start:
				u = max(u, w.max)
			case w.start > start:
				u = math.Inf(1)
			}
		}
		sh.mu.Unlock()
	}
	return u
}

// extraAt is the extra of h usable at now in window w (an index in h.per).
func (h *shareHist) extraAt(w, now int64) float64 {
	if h.xwin != w || now < h.xfrom || now >= h.xuntil {
		return 0
	}
	return h.extra
}

// withExtra returns a copy of h with x added to the window that holds
// it. An extra counts only in a window in which the share changed (a
// raise carries it): otherwise the share has been in force since the
// window began and the window uses it whole.
func (h *shareHist) withExtra(x Extra) *shareHist {
	c := *h
	if c.per <= 0 || x.Window%c.per != 0 || x.Window/c.per != c.win || !(x.Value > 0) {
		return &c
	}
	if c.xwin != c.win || c.extra == 0 {
		c.xwin, c.extra, c.xfrom, c.xuntil = c.win, 0, x.From, x.Until
	}
	// Extras of one window add up over the span they all share.
	c.extra += x.Value
	c.xfrom, c.xuntil = max(c.xfrom, x.From), min(c.xuntil, x.Until, x.Window+c.per)
	return &c
}

// MoveShare sets the region's default share of a limit from now on, as
// SetShare does, and returns what a lowering of a split-mode sliding
// window gave up of the window holding now: what its keys might still
// have admitted in it at the share before, less what they may admit at
// the share after and less what the busiest of them has admitted
// already. A receiver may add that much to the same window (AddExtra)
// without any window of true time holding more than the limit. Other
// changes give up nothing.
func (e *Engine) MoveShare(now time.Time, domain, limit string, share float64) (Release, error) {
	ls, err := e.limitFor(domain, limit, share)
	if err != nil {
		return Release{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := now.UnixNano()
	per := ls.windowPer()
	split := ls.moves()
	var before map[uint64]float64
	if split {
		before = ls.allowances(t)
	}
	ls.setDefault(t, share, e.guard.Load())
	if !split {
		return Release{}, nil
	}
	// What is released is given up at once, past the window guard too
	// (which would otherwise keep the window at its early share).
	ls.shares.def.Store(ls.shares.def.Load().givenUp(t))
	ls.follow(func(ks *keyShare) *shareHist { return ks.hist.givenUp(t) }, t)
	// The new share is stored: a check that still uses the old one holds
	// its shard's lock, which windowUse waits for.
	after := ls.allowances(t)
	start := t - t%per
	u := e.table.windowUse(ls.shares.id, start)
	r := math.Inf(1)
	for h, b := range before {
		if a, ok := after[h]; ok {
			r = min(r, b-max(a, u))
		}
	}
	if !(r > 0) || math.IsInf(r, 1) {
		return Release{}, nil
	}
	return Release{Window: start, Value: r}, nil
}

// moves reports whether ls's allowance may move within a window: a
// split-mode sliding window. A persisted long window may hold restored
// counts of keys not touched since (persist.go), which windowUse does not
// see: it releases nothing.
func (ls *limitState) moves() bool {
	return ls.windowPer() > 0 && ls.l.Mode == allot.Split && ls.shares.id >= 0 && ls.shares.persist.Load() == nil
}

// MoveKeyShares sets the shares of hot keys of one limit, as SetKeyShares
// does, and returns what their lowerings gave up of the window holding
// now in a split-mode sliding window, one Release per key: what the key
// might still have admitted in it at its share before, less what it may
// admit at its share after and less what it has admitted already. A key
// that goes back to the default releases what its own share gave up.
// Nothing is set when an error is returned.
func (e *Engine) MoveKeyShares(now time.Time, domain, limit string, shares []KeyShare) ([]Release, error) {
	ls, hs, err := e.keyShares(domain, limit, shares)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t, g := now.UnixNano(), e.guard.Load()
	if !ls.moves() {
		ls.setKeyShares(t, g, hs, shares, nil)
		return nil, nil
	}
	before := make([]float64, len(hs))
	for i, h := range hs {
		before[i] = ls.shares.hist(h).forCheck(ls.base, t)
	}
	// What is released is given up at once, past the window guard too.
	ls.setKeyShares(t, g, hs, shares, func(h *shareHist) *shareHist { return h.givenUp(t) })
	start := t - t%ls.windowPer()
	var out []Release
	u := math.NaN()
	for i, h := range hs {
		after := ls.shares.hist(h).forCheck(ls.base, t)
		if !(before[i] > after) {
			continue
		}
		if math.IsNaN(u) { // the new shares are stored: see MoveShare
			u = e.table.windowUse(ls.shares.id, start)
		}
		if r := before[i] - max(after, e.keyUse(domain, ls, h, shares[i].Key, start, now, u)); r > 0 && !math.IsInf(r, 0) {
			out = append(out, Release{Key: shares[i].Key, Window: start, Value: r})
		}
	}
	return out, nil
}

// keyUse is what the key of ls named key (hash h) has admitted in the
// window that starts at start, as a fraction of its own limit; u, the
// most any key of the limit has (windowUse), where that is not known: the
// key is not in the table (evicted), a request brought its own rate for
// the limit, or its period is not the limit's.
func (e *Engine) keyUse(domain string, ls *limitState, h uint64, key string, start int64, now time.Time, u float64) float64 {
	ds := e.cfg.Load().domain(domain)
	_, d, err := ParseKeyString(key)
	if err != nil || ds == nil || ls.shares.ownRates.Load() {
		return u
	}
	base := ls.base
	if eff := ds.d.Effective(ls.l, d, now); eff.Rate != ls.l.Rate || eff.Burst != ls.l.Burst {
		base = baseParams(ls.l, eff)
	}
	if base.period != ls.base.period || !(base.amount > 0) {
		return u
	}
	sh := &e.table.shards[shardOf(h)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h)
	if i < 0 {
		return u
	}
	switch s := sh.slots[i]; {
	case s.t == start:
		return s.a / base.amount
	case s.t < start:
		return 0 // not counted in this window yet
	}
	return u
}

// Wants returns what the share in force of a split-mode sliding window
// (key empty: the limit's default; otherwise the hot key's own) may not
// use of the window holding now, because a raise counts from the next
// window: the share less what the window allows. Allowance released of
// the same window elsewhere may make it up (AddExtra). Zero Value: none.
func (e *Engine) Wants(now time.Time, domain, limit, key string) (Release, error) {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil || !ls.moves() {
		return Release{}, err
	}
	h := ls.shares.def.Load()
	if key != "" {
		kh, err := e.keyOf(ls, key)
		if err != nil {
			return Release{}, err
		}
		ks := ls.ownShare(kh)
		if ks == nil {
			return Release{}, nil // it follows the default
		}
		h = ks.hist
	}
	t := now.UnixNano()
	per := ls.windowPer()
	v := h.current() - h.forCheck(ls.base, t)
	if h.xwin == t/per && t < h.xfrom {
		v -= h.extra // added already, usable from xfrom
	}
	if !(v > 1e-12) {
		return Release{}, nil
	}
	return Release{Key: key, Window: t - t%per, Value: v}, nil
}

// ownShare returns the hot key h's own share in ls, or nil if it has none
// (it follows the default).
func (ls *limitState) ownShare(h uint64) *keyShare {
	if m := ls.shares.keys.Load(); m != nil {
		if ks := (*m)[h]; ks != nil && !ks.follow {
			return ks
		}
	}
	return nil
}

// allowances is what the default vector (at 0, which no key hashes to)
// and each key following it may use at now (shareHist.forCheck). The
// caller holds the engine's mu.
func (ls *limitState) allowances(now int64) map[uint64]float64 {
	m := map[uint64]float64{0: ls.shares.def.Load().forCheck(ls.base, now)}
	if ls.shares.following == 0 {
		return m
	}
	for h, ks := range *ls.shares.keys.Load() {
		if ks.follow && ks.until > now {
			m[h] = ks.hist.forCheck(ls.base, now)
		}
	}
	return m
}

// givenUp returns a copy of h whose window at now uses at most the share
// in force from now on, even past the window guard: a lowering by
// MoveShare gives up its part of the window at once.
func (h *shareHist) givenUp(now int64) *shareHist {
	c := *h
	if c.per > 0 && now/c.per == c.win {
		c.early = min(c.early, c.current())
	}
	return &c
}

// AddExtra adds x to the window of the region's default share of a limit
// that x names, for the keys that follow it: drawn from releases
// (MoveShare) of the same window, it is usable from x.From until
// x.Until, never above the share in force. It adds nothing to a window in which the share did
// not change, to a limit that is not a split-mode sliding window, or
// once the window has ended.
func (e *Engine) AddExtra(now time.Time, domain, limit string, x Extra) error {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return err
	}
	if !(x.Value >= 0 && x.Value <= 1) {
		return fmt.Errorf("%w: an extra of %v is outside [0, 1]", ErrBadShare, x.Value)
	}
	per := ls.windowPer()
	if per <= 0 || ls.l.Mode != allot.Split || now.UnixNano() >= min(x.Until, x.Window+per) {
		return nil
	}
	var kh uint64
	if x.Key != "" {
		if kh, err = e.keyOf(ls, x.Key); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if x.Key != "" {
		ks := ls.ownShare(kh)
		if ks == nil {
			return nil // it follows the default: it takes none
		}
		m := maps.Clone(*ls.shares.keys.Load())
		m[kh] = &keyShare{name: ks.name, hist: ks.hist.withExtra(x)}
		ls.shares.keys.Store(&m)
		return nil
	}
	ls.shares.def.Store(ls.shares.def.Load().withExtra(x))
	ls.follow(func(ks *keyShare) *shareHist { return ks.hist.withExtra(x) }, now.UnixNano())
	return nil
}
