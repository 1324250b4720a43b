package regional

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot"
)

// Persistence of long windows (ADR 0004, "Restarts of long windows").
//
// A split-mode local sliding window longer than PersistOptions.Above is
// counted by this instance alone, in memory: a restarted process would
// start it from nothing and, holding its share again, spend it twice.
// With persistence on, the engine keeps, per key of such a limit and for
// the current window, a mark: a count the instance's store is known to
// hold (acknowledged with AckSnapshot). A key is admitted only while its
// count stays within its mark (the gate, in table.apply), and the limit's
// floor is the mark of every key the store does not list. Snapshot
// returns, as data, the marks to raise (count + slack for every key
// whose count reached its mark's reach since); the caller writes them
// (MarkStore) and acknowledges. At any instant the instance's count of a
// key is at most what its store holds for it, so a process that restarts
// with the same identity restores the stored marks as spent (Restore)
// and spends nothing twice; it loses at most the slack of each key.

// Defaults of PersistOptions.
const (
	DefaultPersistAbove    = time.Minute
	DefaultPersistSlack    = 0.05
	DefaultPersistInterval = time.Second
)

// PersistOptions configure the persistence of long windows.
type PersistOptions struct {
	// Above: split-mode local sliding windows longer than it are
	// persisted; 0 means DefaultPersistAbove. Shorter windows start with
	// nothing after a restart, as without persistence.
	Above time.Duration
	// Slack is the fraction f of a key's allowance in the window that a
	// mark runs ahead of its count: a key may be admitted max(1, ⌈f ×
	// allowance⌉) beyond what its store holds (its slack), and that much
	// is lost when the instance restarts. 0 means DefaultPersistSlack.
	Slack float64
	// Interval is how often the caller snapshots: a key held at its mark
	// is told to retry after it. 0 means DefaultPersistInterval.
	Interval time.Duration
}

type persistCfg struct {
	above    int64
	slack    float64
	interval int64
}

func (c *persistCfg) slackOf(allowance float64) float64 {
	return math.Max(1, math.Ceil(c.slack*allowance))
}

// gated reports whether w is a key of a persisted limit.
func (c *persistCfg) gated(w *work) bool {
	l := w.ls.l
	return w.ls.shares.id >= 0 && l.Enforcement == allot.Local && l.Mode == allot.Split && !l.Shadow && !l.Unlimited &&
		l.Algorithm == allot.SlidingWindow && w.ls.base.period > c.above
}

// limitPersist is a persisted limit's state; its mu guards every field
// but cur, which publishes win and floor to checks without the lock.
type limitPersist struct {
	cur   atomic.Pointer[floorState] // win and floor, replaced under mu
	mu    sync.Mutex
	win   int64   // the window floor counts in
	floor float64 // the mark of a key without one of its own, in win: never lowered within it
	saved bool    // a record of win was acknowledged (savedLow is its low)
	low   float64 // the low of win last acknowledged
	// restored is the window Restore loaded (rwin), with the least share
	// in force in it before the restart (rlow): ResetShare uses it as the
	// share before its since.
	restored bool
	rwin     int64
	rlow     float64
}

type floorState struct {
	win   int64
	floor float64
}

// publish makes win and floor those checks see. The caller holds mu.
func (lp *limitPersist) publish() { lp.cur.Store(&floorState{win: lp.win, floor: lp.floor}) }

// floorFor is the floor of window win, started at first at slack.
func (lp *limitPersist) floorFor(win int64, slack float64) float64 {
	if f := lp.cur.Load(); f != nil && f.win == win {
		return f.floor
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.win != win {
		lp.win, lp.floor, lp.saved = win, slack, false
		lp.publish()
	}
	return lp.floor
}

// restoredIn reports whether Restore loaded window win, and its floor.
func (lp *limitPersist) restoredIn(win int64) (float64, bool) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if !lp.restored || lp.rwin != win {
		return 0, false
	}
	return lp.floor, true
}

// persistOf returns sh's persistence state, made on first use.
func (sh *limitShares) persistOf() *limitPersist {
	if lp := sh.persist.Load(); lp != nil {
		return lp
	}
	sh.persist.CompareAndSwap(nil, &limitPersist{win: math.MinInt64})
	return sh.persist.Load()
}

// restoredLow is the share ResetShare puts before a since at since: the
// least share in force before the restart if since falls in the window
// Restore loaded, else 0 (an instance that held nothing).
func (sh *limitShares) restoredLow(since int64, per int64) float64 {
	lp := sh.persist.Load()
	if lp == nil || per <= 0 {
		return 0
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if !lp.restored || since/per != lp.rwin {
		return 0
	}
	return lp.rlow
}

// keyMark is a persisted key's mark, in its shard's marks; the shard's
// lock guards it.
type keyMark struct {
	shares *limitShares
	name   string  // as KeyString names it
	win    int64   // the window mark counts in
	period int64   // ns
	mark   float64 // acknowledged: the store holds at least this
	allow  float64 // the key's allowance in the window when last checked: its slack
	gen    uint32  // counts checks that may have charged it, for AckSnapshot
}

// EnablePersistence turns the gate of long windows on (see
// PersistOptions). Call it before the engine decides anything, and
// Restore before it serves; it cannot be turned off.
func (e *Engine) EnablePersistence(o PersistOptions) {
	c := &persistCfg{above: int64(cmp.Or(o.Above, DefaultPersistAbove)), slack: cmp.Or(o.Slack, DefaultPersistSlack),
		interval: int64(cmp.Or(o.Interval, DefaultPersistInterval))}
	e.table.persist.Store(c)
}

// gate holds a check of a persisted key within its mark: it sets w.p.cap
// (the most the key's window may count) and notes the key as changed
// when the check may charge it. Keys of other limits are left alone.
// The caller holds the key's shard lock, after apply set w.p.
func (t *table) gate(w *work, items []Item, now int64, o op) {
	c := t.persist.Load()
	if c == nil || !c.gated(w) {
		return
	}
	lp := w.ls.shares.persistOf()
	per := w.ls.base.period
	win := now / per
	if w.p.period != per {
		// A plan or override with a window of its own is not persisted:
		// in a restored window it is spent (freshSlot), else ungated.
		return
	}
	limitAllow := w.ls.base.amount
	if w.base.amount > 0 {
		limitAllow *= w.p.amount / w.base.amount
	}
	ceil := lp.floorFor(win, c.slackOf(limitAllow))
	sh := &t.shards[shardOf(w.key)]
	km := sh.marks[w.key]
	charges := w.cost > 0 && o != opRefund
	if km == nil && charges && len(sh.marks) >= sh.max {
		sh.evictMark()
	}
	if km == nil && charges && len(sh.marks) < sh.max {
		if sh.marks == nil {
			sh.marks, sh.dirty = make(map[uint64]*keyMark), make(map[uint64]*keyMark)
		}
		km = &keyMark{shares: w.ls.shares, name: KeyString(w.ls.l, items[w.item].Descriptor), win: win, period: per}
		sh.marks[w.key] = km
		sh.marksNext = min(sh.marksNext, (win+1)*per)
	}
	if km != nil {
		if km.win != win {
			km.win, km.mark, km.period = win, 0, per
			sh.marksNext = min(sh.marksNext, (win+1)*per)
		}
		ceil = max(ceil, km.mark)
		km.allow = w.p.amount
		if charges {
			km.gen++
			sh.dirty[w.key] = km
		}
	}
	w.p.cap, w.p.capRetry = ceil, c.interval
}

// evictMark drops, from a shard whose marks are at its bound, a mark
// that nothing needs in memory: written (not dirty) and whose key's count
// is in the table. The store keeps it; the key is held at the floor until
// its next snapshot writes it again, at its count + slack. It looks at a
// few marks at most; the caller holds the shard's lock.
func (sh *shard) evictMark() {
	n := 0
	for k := range sh.marks {
		if sh.dirty[k] == nil && sh.find(k) >= 0 {
			delete(sh.marks, k)
			return
		}
		if n++; n == 8 {
			return
		}
	}
}

// restoreSlot charges a persisted key the table does not hold with what
// it may have counted before: its mark (a key evicted, or restored), and
// in a window Restore loaded at least the limit's floor (a key the store
// does not list may have been admitted up to it). A key whose plan gives
// it a window of its own is spent in a restored window. The caller holds
// the key's shard lock; s was just made fresh.
//
// A key recalled as conservatively as an evicted key that shared its
// place (table.go recall: its count unknownCount) is counted at its mark
// when it has one in this window, which bounds what it may have admitted.
func (t *table) restoreSlot(s *slot, w *work, now int64) {
	c := t.persist.Load()
	if c == nil || !c.gated(w) {
		return
	}
	lp := w.ls.shares.persist.Load()
	if lp == nil {
		return
	}
	per := w.ls.base.period
	win := now / per
	floor, restored := lp.restoredIn(win)
	if w.base.period != per {
		if restored {
			s.a = w.base.amount
		}
		return
	}
	init := 0.0
	if km := t.shards[shardOf(w.key)].marks[w.key]; km != nil && km.win == win {
		init = km.mark
		if s.a == unknownCount {
			s.a = 0 // the mark bounds it
		}
	}
	if restored {
		init = max(init, floor)
	}
	s.a = max(s.a, math.Min(init, w.base.amount))
}

// Marks are one instance's persisted marks of one limit in one window:
// what MarkStore saves and loads.
type Marks struct {
	Domain, Limit string
	Period        time.Duration
	Window        int64 // the window's index: its start / Period
	// Low is the least share of the limit in force in the window, up to
	// the snapshot (the share a check used).
	Low float64
	// Floor is the mark of every key Keys does not list.
	Floor float64
	// Keys are the marks of keys: in a snapshot those raised since the
	// last one, in a load every key saved in the window.
	Keys []KeyMark
}

// KeyMark is one key's mark: its window's count may have reached it, and
// no more.
type KeyMark struct {
	Key  string // as KeyString names it
	Mark float64
}

// Snapshot is what the engine asks to persist at one instant (Marks) and
// what acknowledging it raises.
type Snapshot struct {
	Marks  []Marks
	keys   []markWrite
	limits []limitWrite
}

type markWrite struct {
	key   uint64
	km    *keyMark
	win   int64
	value float64
	gen   uint32
}

type limitWrite struct {
	lp         *limitPersist
	win        int64
	floor, low float64
}

// Snapshot returns the marks to persist at now: for every key of a
// persisted limit checked since the last acknowledged snapshot whose
// count + slack is above its mark, count + slack; with, for each limit
// concerned, its floor and its least share in force in the window. It
// returns nil when nothing is to be written. Write the marks, then call
// AckSnapshot; a snapshot not acknowledged raises nothing and its keys
// come again in the next one. Call it from one goroutine (snapshots are
// written in order).
func (e *Engine) Snapshot(now time.Time) *Snapshot {
	c := e.table.persist.Load()
	if c == nil {
		return nil
	}
	t := now.UnixNano()
	snap := &Snapshot{}
	byLimit := map[*limitShares][]KeyMark{}
	for i := range e.table.shards {
		sh := &e.table.shards[i]
		sh.mu.Lock()
		if t >= sh.marksNext && len(sh.marks) > 0 {
			sh.marksNext = math.MaxInt64
			for k, km := range sh.marks {
				if end := (km.win + 1) * km.period; t >= end {
					delete(sh.marks, k)
					delete(sh.dirty, k)
				} else {
					sh.marksNext = min(sh.marksNext, end)
				}
			}
		}
		for k, km := range sh.dirty {
			win := t / km.period
			if km.win != win {
				delete(sh.dirty, k)
				continue
			}
			count := 0.0
			if j := sh.find(k); j >= 0 && sh.slots[j].t == win*km.period {
				count = sh.slots[j].a
			} else if j < 0 {
				delete(sh.dirty, k) // evicted: it comes back at its mark
				continue
			}
			v := count + c.slackOf(km.allow)
			if v <= km.mark {
				delete(sh.dirty, k)
				continue
			}
			snap.keys = append(snap.keys, markWrite{key: k, km: km, win: win, value: v, gen: km.gen})
			byLimit[km.shares] = append(byLimit[km.shares], KeyMark{Key: km.name, Mark: v})
		}
		sh.mu.Unlock()
	}
	e.mu.Lock()
	named := e.named
	e.mu.Unlock()
	for _, ds := range e.cfg.Load().list {
		for _, ls := range ds.limits {
			lp := ls.shares.persist.Load()
			if lp == nil || ls.base.period <= 0 || ls.shares.id >= len(named) {
				continue
			}
			per := ls.base.period
			win := t / per
			low := ls.shares.def.Load().forCheck(ls.base, t)
			keys := byLimit[ls.shares]
			lp.mu.Lock()
			floor := c.slackOf(ls.base.amount * low)
			if lp.win == win {
				floor = max(floor, lp.floor) // never lowered within a window
			}
			lowered := lp.win == win && lp.saved && low < lp.low
			lp.mu.Unlock()
			if len(keys) == 0 && !lowered {
				continue
			}
			slices.SortFunc(keys, func(a, b KeyMark) int { return cmp.Compare(a.Key, b.Key) })
			snap.Marks = append(snap.Marks, Marks{Domain: ds.d.Name, Limit: ls.l.Name, Period: time.Duration(per), Window: win,
				Low: low, Floor: floor, Keys: keys})
			snap.limits = append(snap.limits, limitWrite{lp: lp, win: win, floor: floor, low: low})
		}
	}
	if len(snap.Marks) == 0 {
		return nil
	}
	return snap
}

// AckSnapshot says snap was written: every mark and floor it holds is
// raised to what was stored, and the keys not checked since leave the
// next snapshot.
func (e *Engine) AckSnapshot(snap *Snapshot) {
	if snap == nil {
		return
	}
	for _, w := range snap.keys {
		sh := &e.table.shards[shardOf(w.key)]
		sh.mu.Lock()
		if w.km.win == w.win {
			w.km.mark = max(w.km.mark, w.value)
			if w.km.gen == w.gen && sh.dirty[w.key] == w.km {
				delete(sh.dirty, w.key)
			}
		}
		sh.mu.Unlock()
	}
	for _, l := range snap.limits {
		l.lp.mu.Lock()
		if l.lp.win == l.win {
			l.lp.floor = max(l.lp.floor, l.floor)
			l.lp.publish()
			l.lp.saved, l.lp.low = true, l.low
		}
		l.lp.mu.Unlock()
	}
}

// Persisted returns, for now, the limits whose marks Restore takes: one
// Marks per persisted limit of the configuration, naming its window (Low,
// Floor and Keys empty). It returns nil when persistence is off.
func (e *Engine) Persisted(now time.Time) []Marks {
	c := e.table.persist.Load()
	if c == nil {
		return nil
	}
	var out []Marks
	for _, ds := range e.cfg.Load().list {
		for _, ls := range ds.limits {
			if !c.gated(&work{ls: ls}) {
				continue
			}
			out = append(out, Marks{Domain: ds.d.Name, Limit: ls.l.Name, Period: time.Duration(ls.base.period), Window: now.UnixNano() / ls.base.period})
		}
	}
	return out
}

// Restore takes the marks an earlier process of this instance persisted
// as spent: at now, before the engine has decided anything, each key
// listed counts its mark in its window (at most its allowance), every
// other key the limit's floor, and the limit's share before the
// coordinator's first grant (ResetShare's since) is the least share in
// force in the window before the restart (Low) instead of 0. Marks of
// another window than now's, of unknown limits or of limits not
// persisted are ignored, and so is a key that names no key of its limit
// (it returns an error naming them, having restored the rest).
func (e *Engine) Restore(now time.Time, marks []Marks) error {
	c := e.table.persist.Load()
	if c == nil {
		return errors.New("regional: Restore without EnablePersistence")
	}
	t := now.UnixNano()
	var errs []error
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range marks {
		ls, err := e.limitFor(m.Domain, m.Limit, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		per := ls.base.period
		if !c.gated(&work{ls: ls}) || int64(m.Period) != per || m.Window != t/per {
			continue
		}
		lp := ls.shares.persistOf()
		lp.mu.Lock()
		lp.win, lp.floor, lp.saved, lp.low = m.Window, max(1, m.Floor), true, m.Low
		lp.publish()
		lp.restored, lp.rwin, lp.rlow = true, m.Window, min(max(m.Low, 0), 1)
		lp.mu.Unlock()
		for _, k := range m.Keys {
			h, err := e.keyOf(ls, k.Key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			sh := &e.table.shards[shardOf(h)]
			sh.mu.Lock()
			if sh.marks == nil {
				sh.marks, sh.dirty = make(map[uint64]*keyMark), make(map[uint64]*keyMark)
			}
			// Restored keys may exceed the shard's bound: the earlier
			// process kept them within it.
			sh.marks[h] = &keyMark{shares: ls.shares, name: k.Key, win: m.Window, period: per, mark: k.Mark}
			sh.marksNext = min(sh.marksNext, (m.Window+1)*per)
			sh.mu.Unlock()
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("regional: restore: %w", errors.Join(errs...))
	}
	return nil
}
