package regional

import (
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// Item is one descriptor of a request and what it costs. A request made of
// several items (Envoy's descriptors) is decided as one: admitted only if
// every limit of every item admits it.
type Item struct {
	Descriptor allot.Descriptor
	Hits       int64 // 0 checks without charging
	// Limit, when set, replaces the limit of the limits the descriptor
	// matches (Envoy's per-descriptor limit). A descriptor that matches no
	// limit is then counted on its own key under that limit, as a sliding
	// window.
	Limit *allot.Rate
	// OnlyUnit restricts the item to the matching limits that count Unit:
	// a reservation charges its request limits one hit and its token
	// limits the tokens it holds. false applies it to every matching limit.
	OnlyUnit bool
	Unit     allot.Unit
}

// adhocName is the limit name reported for descriptors counted under the
// limit they bring.
const adhocName = "descriptor-limit"

// work is one key touched by one request: an item's matching limit.
type work struct {
	ls  *limitState
	key uint64
	p   params // the key's effective limit, before the share
	// base is p before apply scales it by the share (apply sets it):
	// what a key the table does not hold starts from (shareHist.fresh).
	base params
	cost float64
	same int // index of an earlier work on the same key, or -1
	item int // index of the item it comes from
	// skip leaves the work out of table.run: an unlimited limit, or a key
	// decided elsewhere (the regional store, see Enforcer).
	skip bool
}

// op is what a request does to its keys.
type op uint8

const (
	opCheck  op = iota // charge only if every limit admits
	opTrial            // opCheck that keeps no demand: the Enforcer counts it
	opForce            // charge every limit, even below zero
	opRefund           // give back, up to full
)

// Check decides whether a request of cost hits passes every limit of
// domain that matches desc, and charges it only if so. The answer goes in
// dec (its Statuses are reused). A request that matches no limit is
// allowed. Shadow limits are charged when they would admit and never
// reject. hits 0 charges nothing and reports the state.
func (e *Engine) Check(now time.Time, domain string, desc allot.Descriptor, hits int64, dec *allot.Decision) error {
	items := [1]Item{{Descriptor: desc, Hits: hits}}
	return e.do(now, domain, items[:], opCheck, dec)
}

// CheckItems decides a request made of several descriptors as one: it is
// admitted, and charged, only if every limit of every item admits it. Two
// items on the same key add up. Statuses come in item order, each with its
// item's index.
func (e *Engine) CheckItems(now time.Time, domain string, items []Item, dec *allot.Decision) error {
	return e.do(now, domain, items, opCheck, dec)
}

// Charge charges cost to every limit of domain that matches desc, even if
// that takes a balance below zero: the later requests wait until it has
// refilled. It settles real usage above what a check admitted.
func (e *Engine) Charge(now time.Time, domain string, desc allot.Descriptor, cost int64) error {
	var dec allot.Decision
	items := [1]Item{{Descriptor: desc, Hits: cost}}
	return e.do(now, domain, items[:], opForce, &dec)
}

// Refund gives cost back to every limit of domain that matches desc, never
// above a full bucket.
func (e *Engine) Refund(now time.Time, domain string, desc allot.Descriptor, cost int64) error {
	var dec allot.Decision
	items := [1]Item{{Descriptor: desc, Hits: cost}}
	return e.do(now, domain, items[:], opRefund, &dec)
}

// RefundItems gives each item's hits back to its limits (Envoy's negative
// hits) and reports their state in dec.
func (e *Engine) RefundItems(now time.Time, domain string, items []Item, dec *allot.Decision) error {
	return e.do(now, domain, items, opRefund, dec)
}

// MaxItems bounds the items of one request.
const MaxItems = 64

// validate checks a request before anything is charged.
func validate(items []Item) error {
	if len(items) > MaxItems {
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrBadDescriptor, len(items), MaxItems)
	}
	for i, it := range items {
		if it.Hits < 0 || it.Hits > allot.MaxAmount {
			return fmt.Errorf("%w: descriptor %d: %d is outside [0, %d]", ErrBadCost, i, it.Hits, int64(allot.MaxAmount))
		}
		if len(it.Descriptor) > MaxEntries {
			return fmt.Errorf("%w: descriptor %d: %d entries, at most %d", ErrBadDescriptor, i, len(it.Descriptor), MaxEntries)
		}
		for _, en := range it.Descriptor {
			if en.Key == "" {
				return fmt.Errorf("%w: descriptor %d: empty key", ErrBadDescriptor, i)
			}
		}
		if it.Limit != nil {
			if err := it.Limit.Validate(); err != nil {
				return fmt.Errorf("%w: descriptor %d: limit: %v", ErrBadDescriptor, i, err)
			}
		}
	}
	return nil
}

func (e *Engine) do(now time.Time, domain string, items []Item, o op, dec *allot.Decision) error {
	var inline [maxInline]work
	ws, err := e.plan(now, domain, items, o, dec, inline[:0])
	if err != nil || len(ws) == 0 {
		return err
	}
	e.table.run(now.UnixNano(), items, ws, dec.Statuses, o)
	fold(dec)
	return nil
}

// fold sets a decision's verdict from its statuses: allowed unless a
// non-shadow limit rejected, retry after the longest wait.
func fold(dec *allot.Decision) {
	dec.Allowed, dec.RetryAfter = true, 0
	for i := range dec.Statuses {
		if st := &dec.Statuses[i]; !st.Allowed && !st.Shadow {
			dec.Allowed = false
			dec.RetryAfter = max(dec.RetryAfter, st.RetryAfter)
		}
	}
}

// run locks the shards of the works that are not skipped and applies o to
// them.
func (t *table) run(now int64, items []Item, ws []work, sts []allot.LimitStatus, o op) {
	var ks [maxInline]uint64
	keys := ks[:0]
	for i := range ws {
		if !ws[i].skip {
			keys = append(keys, ws[i].key)
		}
	}
	switch len(keys) {
	case 0:
	case 1:
		sh := &t.shards[shardOf(keys[0])]
		sh.mu.Lock()
		t.apply(now, items, ws, sts, o)
		sh.mu.Unlock()
	default:
		var locks lockSet
		locks.lock(t, keys)
		t.apply(now, items, ws, sts, o)
		locks.unlock(t)
	}
}

// Validate reports the error CheckItems would return for a request,
// without charging or touching any key. A server deciding a batch of
// requests validates them all first, so that a bad one charges nothing.
func (e *Engine) Validate(now time.Time, domain string, items []Item) error {
	var inline [maxInline]work
	var dec allot.Decision
	_, err := e.plan(now, domain, items, opCheck, &dec, inline[:0])
	return err
}

// plan validates a request and appends a work for every key it touches to
// ws, with its status (verdict to come) in dec.
func (e *Engine) plan(now time.Time, domain string, items []Item, o op, dec *allot.Decision, ws []work) ([]work, error) {
	if err := validate(items); err != nil {
		return nil, err
	}
	ds := e.cfg.Load().domain(domain)
	if ds == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownDomain, domain)
	}
	dec.Allowed, dec.RetryAfter, dec.Statuses = true, 0, dec.Statuses[:0]
	for i := range items {
		it := &items[i]
		n := len(ws)
		if ds.d.EnvoyPaths {
			ws = e.matchEnvoy(ds, it, ws)
		} else {
			ws = e.matchAll(ds, it, ws)
		}
		if it.OnlyUnit {
			ws = keepUnit(ws, n, it.Unit)
		}
		if len(ws) == n && it.Limit != nil {
			ws = append(ws, work{ls: ds.adhoc, key: e.adhocKey(ds.adhoc, it.Descriptor)})
		}
		for j := n; j < len(ws); j++ {
			w := &ws[j]
			l := w.ls.l
			eff := allot.Effective{Rate: l.Rate, Burst: l.Burst}
			switch {
			case it.Limit != nil:
				eff = allot.Effective{Rate: *it.Limit, Burst: it.Limit.Amount}
				if !w.ls.shares.ownRates.Load() {
					w.ls.shares.ownRates.Store(true)
				}
			case !l.Unlimited:
				eff = ds.d.Effective(l, it.Descriptor, now)
			}
			w.p, w.cost, w.same, w.item, w.skip = w.ls.base, float64(it.Hits), -1, i, l.Unlimited
			if eff.Rate != l.Rate || eff.Burst != l.Burst {
				w.p = baseParams(l, eff)
			}
			if o == opCheck && !l.Unlimited && !l.Shadow && w.cost > w.p.burst {
				dec.Statuses = dec.Statuses[:0]
				return nil, fmt.Errorf("%w: descriptor %d costs %d, limit %s admits at most %d at once",
					ErrCostAboveBurst, i, it.Hits, l.Name, int64(w.p.burst))
			}
			for k := range j {
				if ws[k].key == w.key {
					w.same = k // the latest earlier one: trials chain
				}
			}
			dec.Statuses = append(dec.Statuses, allot.LimitStatus{Descriptor: i, Name: l.Name, Shadow: l.Shadow, Allowed: true, Limit: eff.Rate.Amount, Window: eff.Rate.Period})
		}
	}
	return ws, nil
}

// matchAll appends a work for every limit of ds that matches the item,
// less those replaced by another matching limit.
func (e *Engine) matchAll(ds *domainState, it *Item, ws []work) []work {
	n := len(ws)
	replacing := false
	for _, ls := range ds.limits {
		if key, ok := e.matchKey(ls, it.Descriptor); ok {
			ws = append(ws, work{ls: ls, key: key})
			replacing = replacing || len(ls.l.Replaces) > 0
		}
	}
	if !replacing {
		return ws
	}
	kept := ws[:n]
	for _, w := range ws[n:] {
		if !replaced(w.ls.l.Name, ws[n:]) {
			kept = append(kept, w)
		}
	}
	return kept
}

func replaced(name string, ws []work) bool {
	for _, w := range ws {
		for _, r := range w.ls.l.Replaces {
			if r == name {
				return true
			}
		}
	}
	return false
}

// matchEnvoy appends the one limit of ds that Envoy's rate limit service
// would pick for the item: its match is exactly the descriptor's entries,
// in order, and at the first entry where two candidates differ, an exact
// value beats a prefix, which beats any value.
func (e *Engine) matchEnvoy(ds *domainState, it *Item, ws []work) []work {
	d := it.Descriptor
	var best *limitState
	for _, ls := range ds.limits {
		m := ls.l.Match
		if len(m) != len(d) {
			continue
		}
		ok := true
		for i := range m {
			if m[i].Key != d[i].Key || !allot.MatchValue(m[i].Value, d[i].Value) {
				ok = false
				break
			}
		}
		if ok && (best == nil || moreSpecific(m, best.l.Match)) {
			best = ls
		}
	}
	if best == nil {
		return ws
	}
	h := best.salt
	for _, en := range d {
		h = mix(h ^ maphash.String(e.seed, en.Value))
	}
	return append(ws, work{ls: best, key: normKey(h)})
}

func moreSpecific(a, b allot.Match) bool {
	rank := func(v string) int {
		switch {
		case v == allot.Wildcard:
			return 0
		case len(v) > 0 && v[len(v)-1] == '*':
			return 1
		}
		return 2
	}
	for i := range a {
		if ra, rb := rank(a[i].Value), rank(b[i].Value); ra != rb {
			return ra > rb
		}
	}
	return false
}

// adhocKey hashes every entry of a descriptor that brings its own limit.
func (e *Engine) adhocKey(ls *limitState, d allot.Descriptor) uint64 {
	h := ls.salt
	for _, en := range d {
		h = mix(h ^ maphash.String(e.seed, en.Key))
		h = mix(h ^ maphash.String(e.seed, en.Value))
	}
	return normKey(h)
}

// apply runs one operation on the works' keys; the caller holds their
// shards' locks. sts[i] answers ws[i]; apply fills in the verdict and
// the numbers.
func (t *table) apply(now int64, items []Item, ws []work, sts []allot.LimitStatus, o op) {
	// Make room first: an eviction may move or drop slots, so no slot is
	// held across it, nor across an insert, which may grow a shard. A
	// work that leaves an absent key fresh (readOnly) neither makes room
	// nor inserts.
	for i := range ws {
		w := &ws[i]
		if sh := &t.shards[shardOf(w.key)]; !w.skip && sh.n >= sh.max && sh.find(w.key) < 0 && !t.readOnly(w, o) {
			sh.makeRoom(now)
		}
	}
	for i := range ws {
		w := &ws[i]
		if w.skip {
			continue
		}
		sh := &t.shards[shardOf(w.key)]
		hist := w.ls.shares.hist(w.key)
		base := w.p
		w.base = base
		w.p = base.scaled(hist.forCheck(base, now))
		// persisted long windows: the mark bounds w.p (persist.go)
		t.gate(w, items, now, o)
		ss, stale := t.sharedWork(w, base, hist.current(), now) // shared mode (shared.go)
		idx, created := sh.find(w.key), false
		if idx < 0 && t.readOnly(w, o) {
			continue // decided on a fresh state (slotOf)
		}
		if idx < 0 {
			idx, created = sh.insert(w.key), true
			t.freshSlot(&sh.slots[idx], w, ss != nil, now)
		} else if w.same < 0 && ss == nil {
			hist.catchUp(&sh.slots[idx], base, w.ls.changeFor(base))
		}
		if sy := w.ls.shares.sync.Load(); ss == nil && !created && sy != nil && sy.ps.table == t && !sy.shared {
			sy.unweigh(w.key, &sh.slots[idx], w.p, now) // a split key's loans of the window before (borrow.go)
		}
		if ss != nil && w.same < 0 {
			t.inject(sh, idx, w, ss, items, now, created, stale)
		}
	}
	// slotOf is a work's slot; a key left absent (readOnly) is read from
	// a fresh state in scratch, which is used before the next call.
	var scratch slot
	slotOf := func(w *work) *slot {
		sh := &t.shards[shardOf(w.key)]
		if i := sh.find(w.key); i >= 0 {
			return &sh.slots[i]
		}
		scratch = slot{key: w.key}
		t.freshSlot(&scratch, w, t.sharedOf(w) != nil, now)
		return &scratch
	}

	switch o {
	case opForce:
		for i := range ws {
			if w := &ws[i]; !w.skip {
				s := slotOf(w)
				report(&sts[i], take(s, now, w.p, w.cost, true))
				t.noteWindow(w, s)
			}
		}
		return
	case opRefund:
		for i := range ws {
			if w := &ws[i]; !w.skip {
				s := slotOf(w)
				refund(s, now, w.p, w.cost)
				report(&sts[i], take(s, now, w.p, 0, false))
			}
		}
		return
	}
	if len(ws) == 1 { // nothing else can reject: charge in place
		if w := &ws[0]; !w.skip {
			s := slotOf(w)
			report(&sts[0], take(s, now, w.p, w.cost, false))
			t.noteWindow(w, s)
			if o == opCheck {
				t.count(items, w, &sts[0], sts[0].Allowed || w.ls.l.Shadow)
			}
		}
		return
	}
	// Try every charge on a copy; a key touched twice chains its copies.
	var inline [maxInline]slot
	trials := inline[:0]
	admit := true
	for i := range ws {
		w := &ws[i]
		if w.skip {
			trials = append(trials, slot{})
			continue
		}
		t := *slotOf(w)
		if w.same >= 0 {
			t = trials[w.same]
		}
		out := take(&t, now, w.p, w.cost, false)
		trials = append(trials, t)
		report(&sts[i], out)
		if !out.allowed && !w.ls.l.Shadow {
			admit = false
		}
	}
	for i := range ws {
		w := &ws[i]
		switch st := &sts[i]; {
		case w.skip:
			continue
		case admit && st.Allowed:
			s := slotOf(w)
			*s = trials[i] // a later work on the same key overwrites with its later trial
			t.noteWindow(w, s)
		case st.Allowed: // another limit rejected: report the uncharged state
			report(st, take(slotOf(w), now, w.p, 0, false))
		}
		if o == opCheck {
			t.count(items, w, &sts[i], admit)
		}
	}
}

// noteWindow records a work's count in its shard (shard.noteWindow).
func (t *table) noteWindow(w *work, s *slot) { t.shards[shardOf(w.key)].noteWindow(w.ls, w.base, s) }

// freshSlot initialises the slot of a key the table does not hold: a
// split-mode key through its share's history (shareHist.fresh), a
// shared-mode one at w.p (its counts come from inject).
func (t *table) freshSlot(s *slot, w *work, shared bool, now int64) {
	if shared {
		fresh(s, now, w.p)
		return
	}
	t.shards[shardOf(w.key)].remake(s, now, w.ls.shares.hist(w.key), w.base, w.p, w.ls.changeFor(w.base))
	t.restoreSlot(s, w, now) // persisted long windows (persist.go)
	t.noteWindow(w, s)       // a recalled key's count (MoveShare)
	if p := w.p; p.spentAt > 0 && p.alg != allot.SlidingWindow {
		setTokens(s, min(p.spentAt, now), 0, p) // a fallback's new key: empty when it began
	}
}

// owes is what key's token bucket or GCRA state in the table, of a
// fallback that began at p.spentAt, owes the store (0 when the table does
// not hold the key): the least of what it lacked of full when the store
// was back (at p.backAt, when its last change came before; else at now) and
// what it may have admitted since the fallback began (what refilled
// since then less what it holds; more than it admitted once it was full,
// or when it began owing). With out, the state is removed as well.
//
// Charged either, a store's bucket holds no more than one bucket fed by
// both would (one instance alone in its region): lacking of full, since
// the store's bucket holds at most a burst; admitted, since what the
// store's bucket holds less what was admitted meanwhile is at most what
// the one bucket holds. So is the least of them. A fallback that
// admitted nothing (a store call past its deadline, say) owes nothing.
func (t *table) owes(key uint64, now int64, p params, out bool) float64 {
	sh := &t.shards[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(key)
	if i < 0 {
		return 0
	}
	s := &sh.slots[i]
	last := lastUpdate(s, p.alg)
	at := now
	if back := p.backAt; last <= back && back < now {
		at = back
	} else if at < last {
		at = last
	}
	owed := p.burst - tokensAt(s, at, p)
	if p.spentAt > 0 && last >= p.spentAt {
		owed = min(owed, p.refill(last-p.spentAt)-tokensAt(s, last, p))
	}
	if out {
		sh.remove(i)
	}
	return max(owed, 0)
}

// sharedOf returns w's link to other regions when w is a shared-mode
// work of this table, else nil.
func (t *table) sharedOf(w *work) *limitSync {
	if ss := w.ls.shares.sync.Load(); ss != nil && ss.shared && ss.ps.table == t {
		return ss
	}
	return nil
}

// readOnly reports whether w leaves its key as a fresh key would be if
// the key is absent: it charges nothing (a zero-hit check or charge) or
// it refunds (a fresh key is full already). Such a key is decided on a
// fresh state and not made, so that asking about keys, or refunding to
// them, costs no memory and evicts no key. A shared-mode key whose counts
// this region holds (its own collected, the peers', the instances') is
// not fresh: it is made, and inject puts them in. The caller holds the
// key's shard lock.
func (t *table) readOnly(w *work, o op) bool {
	if w.cost != 0 && o != opRefund {
		return false
	}
	ss := t.sharedOf(w)
	if ss == nil {
		return true
	}
	sk := ss.ps.side[shardOf(w.key)].shared[w.key]
	return sk == nil || sk.ss != ss
}

// count adds a decided work to its shard's demand: to its limit, and to
// its key when the key is tracked (see tallyKey): from the first request
// that left it near its allowance here (rejected, or a tenth of its burst
// or less left), and, once tracked, every request. A work that charges
// nothing (a zero-hit check: a status, a gateway's probe) is no traffic:
// it counts nothing, marks no key hot and asks no loan. The caller holds
// the shard's lock.
func (t *table) count(items []Item, w *work, st *allot.LimitStatus, admitted bool) {
	if w.cost == 0 {
		return
	}
	t.noteRejected(items, w, st) // it may borrow (borrow.go)
	id := w.ls.shares.id
	if id < 0 {
		return // a descriptor's own limit: not coordinated
	}
	sh := &t.shards[shardOf(w.key)]
	d := sh.demandOf(id)
	a, r := w.cost, 0.0
	if !admitted {
		a, r = 0, w.cost
	}
	d.admitted += a
	d.rejected += r
	near := !w.ls.l.Shadow && (!st.Allowed || float64(st.Remaining) <= w.p.burst/10)
	sh.tallyKey(w, items[w.item].Descriptor, a, r, near)
}

func report(st *allot.LimitStatus, o outcome) {
	st.Allowed = o.allowed
	st.Remaining = int64(math.Floor(o.remaining))
	st.ResetAfter = time.Duration(o.resetAfter)
	st.RetryAfter = time.Duration(o.retryAfter)
}
