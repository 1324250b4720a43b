package regional

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/crdt"
)

// Shared mode. A shared-mode key is decided as a sliding window over the
// limit's period that admits L, the key's effective amount, where the
// window's counts are this instance's own plus every other region's slot
// of the key's G-counter (and, for a region of several instances, the
// other instances' counts): own_r(w) + Σ_{s≠r} known_s(w) + cost ≤ L,
// estimated over the current and previous windows, where known_s of the
// current window includes what s admitted that has not arrived yet, as
// its pace predicts it (sharedKey.unheard).
//
// The key's slot in the table holds those sums. Its side entry
// (sharedKey) remembers what part of them is the others' (inj), so that
// the own counts are the slot's less inj; before each decision the
// latest known others are put in place of inj.
//
// The bound (allot.SharedBound). A region admits at most a budget
// (allot.SharedBudget: max(rate × 2 × sync_interval, 5 % of L)) beyond
// what its peers have seen, taken as the own count it collected a sync
// interval before it last heard every peer (sharedKey.sent); so each
// peer's view of it lags by at most the budget and a window admits at
// most L + (regions − 1) × budget, bursts included (twice that through a
// partition, which loses the counts in flight).
//
// The staleness fallback. While a peer is stale the peers' counts are
// taken out and the window admits what the region may still spend of its
// split share: in a window that began in fallback, share × L; in the
// window the fallback began, what the region had counted (its own and its
// other instances') plus share × what was left of L (less the peers'
// counts as last known), at most max(that count, share × L), fixed at
// the key's first decision in each fallback. The share is the least in force
// since the window began (shareHist.forCheck). The regions' parts of what is left add up to at
// most what is left, so a partition admits no more than the bound.
//
// Every tick the driver collects the own counts that changed
// (CollectCounts), sets the region's slot in the limit's crdt.Store
// (PublishCounts) and sends the deltas (Outbound) to every peer; what
// peers send comes in through Inbound.

// pair holds a value for a window w and the one before it.
type pair struct {
	w         uint64
	cur, prev float64
}

// at returns the values for windows w and w−1.
func (p pair) at(w uint64) (cur, prev float64) {
	switch {
	case p.w == w:
		return p.cur, p.prev
	case p.w+1 == w:
		return 0, p.cur
	case p.w == w+1:
		return p.prev, 0
	}
	return 0, 0
}

// raise sets the value of window w to at least v; windows older than
// the pair's previous one are dropped.
func (p *pair) raise(w uint64, v float64) {
	switch {
	case w == p.w:
		p.cur = max(p.cur, v)
	case w+1 == p.w:
		p.prev = max(p.prev, v)
	case w == p.w+1:
		p.w, p.prev, p.cur = w, p.cur, v
	case w > p.w:
		p.w, p.prev, p.cur = w, 0, v
	}
}

// roll moves the pair to window w, forgetting what w leaves behind.
func (p *pair) roll(w uint64) {
	switch {
	case w == p.w+1:
		p.w, p.prev, p.cur = w, p.cur, 0
	case w > p.w+1:
		p.w, p.prev, p.cur = w, 0, 0
	}
}

// sharedKey is a shared-mode key's sync state. The lock of its table
// shard guards it.
type sharedKey struct {
	ss     *limitSync
	key    uint64
	name   string  // as wireKey names it: the key on the wire
	limit  float64 // L per window, as last decided
	dirty  bool    // in its side shard's dirty list
	sentAt int64   // unix ns of the last collection
	inj    pair    // the others' counts the slot holds
	pub    pair    // own counts collected
	peers  pair    // Σ of the other regions' slots
	heard  []heard // each expected peer's slot as heard here, for unheard
	sibs   pair    // Σ of the region's other instances
	// sent are own counts of window sentW as collected, oldest first, at
	// least a quarter of a sync interval apart: what the peers have seen
	// (seen). Cleared after a silence.
	sent  [sentKept]sentCount
	nsent int
	sentW uint64
	// fbWin is 1 + the window whose fallback allowance is fbCap: the
	// window the fallback began in; fbAt, the limit's heardAll then,
	// which names the fallback (it stays put while one lasts).
	fbWin uint64
	fbAt  int64
	fbCap float64
}

// sentKept is how many collected counts a shared key keeps: spaced by at
// least a quarter of a sync interval, they span 1.75 or more, enough to
// reach back a sync interval before the last heartbeat.
const sentKept = 8

// sentCount is an own count as collected at an instant (unix ns).
type sentCount struct {
	at int64
	v  float64
}

// record keeps v, collected at now for window w. After a silence (no
// word from some peer for a sync interval) what was sent may be lost:
// everything is forgotten until the peers are heard again.
func (sk *sharedKey) record(now int64, w uint64, v float64) {
	ss := sk.ss
	switch {
	case now-ss.heardAll.Load() > ss.syncEvery:
		sk.nsent = 0
		return
	case w != sk.sentW:
		sk.nsent, sk.sentW = 0, w
	case sk.nsent > 0 && now-sk.sent[sk.nsent-1].at < ss.syncEvery/4:
		return
	}
	if sk.nsent == sentKept {
		copy(sk.sent[:], sk.sent[1:])
		sk.nsent--
	}
	sk.sent[sk.nsent] = sentCount{at: now, v: v}
	sk.nsent++
}

// seen is the own count of window w that every peer has received by
// now: the latest collected a sync interval (the delay a count may take
// to arrive) before every peer was last heard; 0 if none is known.
func (sk *sharedKey) seen(now int64, w uint64) float64 {
	ss := sk.ss
	if w != sk.sentW {
		return 0
	}
	by := min(now, ss.heardAll.Load()) - ss.syncEvery
	for i := sk.nsent - 1; i >= 0; i-- {
		if sk.sent[i].at <= by {
			return sk.sent[i].v
		}
	}
	return 0
}

// heard is what this region last heard of one peer's slot of a key.
type heard struct {
	p  pair  // the peer's slot, windows w and w−1
	at int64 // unix ns: when its slot of window p.w last rose here
	// lag is how long the peer's count takes to reach this region,
	// measured by the first count of each window heard: it arrived that
	// long after the window began, less the time the peer took to admit
	// it at its previous window's pace. It follows a shorter measure at
	// once and a longer one slowly (a skewed clock, before the node's
	// estimate of the coordinator's time, makes it too long).
	lag int64
}

// hear records a rise of peer i's slot of window w to v, heard at now.
func (sk *sharedKey) hear(i int, w uint64, v float64, now int64) {
	ss := sk.ss
	if i < 0 || i >= len(ss.expected) {
		return
	}
	if len(sk.heard) != len(ss.expected) {
		sk.heard = make([]heard, len(ss.expected))
	}
	h := &sk.heard[i]
	first := w > h.p.w
	before, _ := h.p.at(w)
	h.p.raise(w, v)
	if after, _ := h.p.at(w); after <= before || w != h.p.w {
		return
	}
	h.at = now
	start := int64(w) * ss.period
	if _, prev := h.p.at(w); first && prev > 0 && now > start && now-start < ss.period {
		lag := now - start - int64(v*float64(ss.period)/prev)
		switch {
		case lag < 0:
		case h.lag <= 0 || lag < h.lag:
			h.lag = min(lag, ss.syncEvery)
		default:
			h.lag += (min(lag, ss.syncEvery) - h.lag) / 8
		}
	}
}

// unheard is what the peers admitted of window w that has not reached
// this region by now, as each peer's pace in the previous window (its
// count ÷ the period; for a key new to it, its pace so far) predicts it:
// what is in flight (the pace over its lag), and what it admitted since
// the count heard was collected (the pace over the time since that count
// arrived, or since w began if none has), at most hotFraction of L (past
// that, it sends its count at its next tick). A peer that admits sends
// its count at least every sync interval; one not heard of for longer
// than that and its lag is taken as idle. With only what is known, every
// region admits above L what its peers admitted in the lag, in every
// window of steady state; with this its view keeps up with them. It only
// adds to the peers' counts, so every bound stated (the budget,
// capUnseen; allot.SharedBound) holds as before; a pace that drops is
// over-estimated for a window at most, and the region under-admits
// meanwhile.
func (sk *sharedKey) unheard(w uint64, now int64) float64 {
	ss := sk.ss
	start := int64(w) * ss.period
	var sum float64
	for i := range sk.heard {
		h := &sk.heard[i]
		cur, prev := h.p.at(w)
		since := start
		if h.p.w == w {
			since = max(since, h.at)
		}
		lag := h.lag
		if lag <= 0 {
			lag = ss.syncEvery / 4 // not measured yet
		}
		pace := prev / float64(ss.period)
		if covered := since - lag - start; prev <= 0 && covered >= ss.syncEvery {
			pace = cur / float64(covered) // a key new to the peer: its pace so far
		}
		if age := now - since; pace > 0 && age <= ss.syncEvery+lag {
			// The peer sends its count once it rose by hotFraction of L
			// (at its next tick): what it admitted since the count heard
			// was collected is at most that, and what is in flight.
			sum += min(pace*float64(age), hotFraction*sk.limit) + pace*float64(lag)
		}
	}
	return sum
}

// capUnseen lowers the amount of a shared work so that the own count of
// the window stays within the budget (allot.SharedBudget) beyond what
// the peers have seen; with nothing unseen, a request of any cost may
// pass. s is the key's slot, with the others' counts injected; own is
// the instance's count of window w. The caller holds the shard's lock.
func (sk *sharedKey) capUnseen(s *slot, w *work, own float64, win uint64, now int64) {
	ss := sk.ss
	if len(ss.expected) == 0 {
		return
	}
	unseen := own - sk.seen(now, win)
	if unseen <= 0 {
		return
	}
	room := max(0, allot.SharedBudget(w.p.amount, time.Duration(ss.period), time.Duration(ss.syncEvery))-unseen)
	period := float64(w.p.period)
	left := float64(s.t + w.p.period - max(now, s.t))
	est := s.b*left/period + s.a // the window's estimate, as takeWindow makes it
	if a := est + room; a < w.p.amount {
		w.p.amount, w.p.burst = a, a
	}
}

// fallbackCap sets the amount of a shared work decided in fallback in
// window win: share × L (as sharedWork set it) in a window that began in
// fallback; in the window the fallback began, region (the region's count
// of the window) plus share × what was left of L, less the peers' counts
// as last known, and at most max(region, share × L), fixed at the key's
// first decision in this fallback: a later fallback in the same window
// starts again from what is left then (before, it took up the first
// one's allowance, which the regions had since spent in shared mode:
// 2,154 in a window of L = 1,837, above L + the partition bound = 2,021).
// The caller holds the shard's lock.
func (sk *sharedKey) fallbackCap(w *work, win uint64, region float64) {
	ss := sk.ss
	heardAll := ss.heardAll.Load()
	if heardAll+ss.staleAfter < int64(win)*ss.period {
		return // stale since before the window began
	}
	if sk.fbWin != win+1 || sk.fbAt != heardAll {
		l := ss.perWindow(w.base)
		known, _ := sk.peers.at(win)
		share := 0.0
		if l > 0 {
			share = w.p.amount / l
		}
		// Never more than share × L, the split allowance, unless the
		// region had counted more already.
		sk.fbWin, sk.fbAt, sk.fbCap = win+1, heardAll, min(region+share*max(0, l-region-known), max(region, w.p.amount))
	}
	w.p.amount, w.p.burst = sk.fbCap, sk.fbCap
}

// sharedWork returns the link of a work decided in shared mode, with its
// params set: a sliding window over the limit's period that admits L, or
// share × L while a peer is stale, where share is the least in force
// since the window began (shareHist.forCheck; the current share, the
// third argument, is not used: a share raised in the window may have
// been spent by the region that gave it up). inject lowers the amount
// further (capUnseen, fallbackCap). It returns nil for every other work,
// and for a table other than the engine's; a split-mode work gets the
// loans its key was credited in the window. The caller holds the key's
// shard lock.
func (t *table) sharedWork(w *work, base params, _ float64, now int64) (*limitSync, bool) {
	ss := w.ls.shares.sync.Load()
	if ss == nil || ss.ps.table != t {
		return nil, false
	}
	if !ss.shared {
		ss.borrowed(w, now) // split mode: loans credited in this window (borrow.go)
		return nil, false
	}
	amount := ss.perWindow(base)
	stale := ss.stale(now)
	if stale {
		amount *= w.ls.shares.hist(w.key).forCheck(params{alg: allot.SlidingWindow, period: ss.period}, now)
	}
	w.p = params{alg: allot.SlidingWindow, amount: amount, burst: amount, period: ss.period}
	return ss, stale
}

// perWindow is L of a shared-mode key per window of the limit's period:
// an override with a period of its own is converted.
func (ss *limitSync) perWindow(base params) float64 {
	if base.period != ss.period && base.period > 0 {
		return base.amount * float64(ss.period) / float64(base.period)
	}
	return base.amount
}

// inject puts the latest known others' counts in the slot of a shared
// work (at index i of sh, created says just now): the region's other
// instances' always, the peers' only while none is stale. It marks the
// key for collection. The caller holds sh.mu.
func (t *table) inject(sh *shard, i int, w *work, ss *limitSync, items []Item, now int64, created, stale bool) {
	side := &ss.ps.side[shardOf(w.key)]
	sk := side.shared[w.key]
	if sk == nil || sk.ss != ss {
		if w.item >= len(items) {
			return
		}
		if side.shared == nil {
			side.shared = make(map[uint64]*sharedKey)
		}
		sk = &sharedKey{ss: ss, key: w.key, name: wireKey(w.ls.l, items[w.item].Descriptor), limit: ss.amount}
		side.shared[w.key] = sk
	}
	s := &sh.slots[i]
	roll(s, now, w.p)
	win := uint64(s.t / w.p.period)
	if created { // evicted and made again: the own counts come back from what was collected
		s.a, s.b = sk.pub.at(win)
		sk.inj = pair{w: win}
	}
	sk.inj.roll(win)
	// The region's other instances count in fallback too: the split
	// share is the region's, not each instance's. Only the peers' slots
	// are left out while one is stale.
	cur, prev := sk.sibs.at(win)
	own := s.a - sk.inj.cur
	if stale {
		ss.fallbackDec.Add(1)
		sk.fallbackCap(w, win, own+cur)
	} else {
		pc, pp := sk.peers.at(win)
		un := sk.unheard(win, now)
		cur, prev = cur+pc+un, prev+pp
		sk.limit = w.p.amount
	}
	s.a += cur - sk.inj.cur
	s.b += prev - sk.inj.prev
	sk.inj.cur, sk.inj.prev = cur, prev
	if !stale {
		sk.capUnseen(s, w, own, win, now)
	}
	if !sk.dirty {
		sk.dirty = true
		side.dirty = append(side.dirty, sk)
	}
}

// decidedInEngine reports whether a work of a store-backed limit is
// decided by the engine anyway: shared mode syncs the instances of a
// region through their slots, not through the store's buckets.
func decidedInEngine(w *work) bool {
	ss := w.ls.shares.sync.Load()
	return ss != nil && ss.shared
}

// Count is this instance's own count of a shared-mode key in one window.
type Count struct {
	Domain, Limit string
	Key           string // as KeyString names it, less "limit:" (the key on the wire)
	Window        uint64 // floor(unix_ms / period_ms)
	Period        time.Duration
	Value         uint64
}

// PeerCount is another region's slot of a key in a window.
type PeerCount struct {
	Region string
	Value  uint64
}

// RegionCount is a key's window as the region's instances share it (see
// CountStore): Value is this instance's count as merged, Region the sum
// over the region's instances, Value included, and Peers the other
// regions' slots the region has received.
type RegionCount struct {
	Count
	Region uint64
	Peers  []PeerCount
}

// CollectCounts returns the own counts of the shared-mode keys that are
// due for publication: changed, and either not published for their
// limit's sync interval, or changed by 1% of their limit or more (hot
// keys go out at every tick), or in a window that has just ended. With
// touched, it also returns keys decided but unchanged since their sync
// interval, so that a region of several instances refreshes what the
// others counted. Idle keys are not returned.
func (e *Engine) CollectCounts(now time.Time, touched bool) []Count {
	ps := e.peer.Load()
	if ps == nil {
		return nil
	}
	t := now.UnixNano()
	var out []Count
	for i := range ps.side {
		side, sh := &ps.side[i], &e.table.shards[i]
		sh.mu.Lock()
		if len(side.dirty) == 0 {
			sh.mu.Unlock()
			continue
		}
		kept := side.dirty[:0]
		for _, sk := range side.dirty {
			if sk.collect(sh, t, touched, &out) {
				kept = append(kept, sk)
			} else {
				sk.dirty = false
			}
		}
		clear(side.dirty[len(kept):])
		side.dirty = kept
		sh.mu.Unlock()
	}
	return out
}

// collect appends sk's own counts to out when they are due, and reports
// whether sk stays dirty (changed, not due yet). The caller holds sh.mu.
func (sk *sharedKey) collect(sh *shard, now int64, touched bool, out *[]Count) bool {
	ss := sk.ss
	idx := sh.find(sk.key)
	if idx < 0 {
		return false
	}
	s := &sh.slots[idx]
	win := uint64(s.t / ss.period)
	if sk.inj.w != win {
		return false // not a slot inject prepared
	}
	own, ownPrev := max(0, s.a-sk.inj.cur), max(0, s.b-sk.inj.prev)
	pub, pubPrev := sk.pub.at(win)
	changed, ended := own > pub, ownPrev > pubPrev
	interval := now-sk.sentAt >= ss.syncEvery
	if !changed && !ended && !(touched && interval) {
		return false
	}
	if !ended && !interval && own-pub < hotFraction*sk.limit {
		return true
	}
	slot := func(w uint64, v float64) Count {
		return Count{Domain: ss.domain, Limit: ss.limit, Key: sk.name, Window: w, Period: time.Duration(ss.period), Value: uint64(v)}
	}
	if ended {
		*out = append(*out, slot(win-1, ownPrev))
		sk.pub.raise(win-1, ownPrev)
	}
	*out = append(*out, slot(win, max(own, pub)))
	sk.pub.raise(win, own)
	sk.record(now, win, max(own, pub))
	sk.sentAt = now
	return false
}

// PublishCounts sets the region's slot of each key and window to the sum
// over its instances, and takes the other instances' counts and the
// peers' slots into account for the next decisions. A region of one
// instance passes its collected slots with Region equal to Value (see
// SyncOut); a region of several merges them in a CountStore first.
func (e *Engine) PublishCounts(now time.Time, slots []RegionCount) {
	ps := e.peer.Load()
	if ps == nil {
		return
	}
	for _, rs := range slots {
		ls, ss, err := e.syncOf(rs.Domain, rs.Limit)
		if err != nil || ss == nil || !ss.shared {
			continue
		}
		h, err := e.wireKeyOf(ls, rs.Key)
		if err != nil {
			continue
		}
		ss.mu.Lock()
		if ss.store.Apply(crdt.Delta{Key: rs.Key, Window: rs.Window, Origin: ps.region, Value: rs.Region}) != nil {
			ss.mu.Unlock()
			continue // an old window
		}
		for _, p := range rs.Peers {
			if slices.Contains(ss.expected, p.Region) {
				ss.store.Apply(crdt.Delta{Key: rs.Key, Window: rs.Window, Origin: p.Region, Value: p.Value})
			}
		}
		peers := ss.othersAt(rs.Key, rs.Window)
		ss.mu.Unlock()
		sibs := float64(rs.Region - min(rs.Value, rs.Region))
		e.withSharedKey(ss, ls, h, rs.Key, func(sk *sharedKey) {
			sk.sibs.raise(rs.Window, sibs)
			sk.peers.raise(rs.Window, peers)
		})
	}
}

// othersAt is the sum of the other regions' slots of key in window w.
// The caller holds ss.mu.
func (ss *limitSync) othersAt(key string, w uint64) float64 {
	return float64(ss.store.Value(key, w) - ss.store.Slot(key, w, ss.ps.region))
}

// withSharedKey runs f on the side entry of key h (named name), made if
// needed, under its shard's lock.
func (e *Engine) withSharedKey(ss *limitSync, ls *limitState, h uint64, name string, f func(*sharedKey)) {
	sh := &e.table.shards[shardOf(h)]
	side := &ss.ps.side[shardOf(h)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sk := side.shared[h]
	if sk == nil || sk.ss != ss {
		if side.shared == nil {
			side.shared = make(map[uint64]*sharedKey)
		}
		sk = &sharedKey{ss: ss, key: h, name: name, limit: ss.amount}
		side.shared[h] = sk
	}
	f(sk)
}

// Batch is the deltas of one shared-mode limit, as they travel between
// regions (encoded with crdt.AppendBatch).
type Batch struct {
	Domain, Limit string
	Deltas        []crdt.Delta
	// Full: the deltas are the origin's whole state as of sequence
	// number Seq, for a peer that must resync. In a batch without
	// deltas that is not Full, Seq is the origin's last sequence number
	// (a mark, sent when a limit has had no deltas for a sync interval):
	// a receiver that saw less lost the last deltas.
	Full bool
	Seq  uint64
}

// SyncOut is a tick of a region of one instance: it collects the due
// counts, publishes them as the region's slots and returns the batches
// to send to every peer. Call it every tick (a fraction of the shortest
// sync interval); it also sweeps idle keys once a second.
func (e *Engine) SyncOut(now time.Time) []Batch {
	e.PublishCounts(now, Alone(e.CollectCounts(now, false)))
	return e.Outbound(now)
}

// Outbound returns the deltas of every region slot that changed since
// the previous call, one batch per limit (more for very many keys), with
// the next sequence numbers. Send every batch to every peer, in order: a
// peer that misses one sees a gap and asks for a resync. It drops the
// windows that no longer count and, once a second, sweeps idle keys.
func (e *Engine) Outbound(now time.Time) []Batch {
	ps := e.peer.Load()
	if ps == nil {
		return nil
	}
	e.maintain(now)
	var out []Batch
	for _, ss := range e.syncs() {
		if !ss.shared {
			continue
		}
		t := now.UnixNano()
		ss.mu.Lock()
		ss.store.Advance(ss.window(t))
		var ds []crdt.Delta
		ds, ss.version = ss.store.DeltasSince(ss.version)
		ss.stats.DeltasOut += uint64(len(ds))
		mark := len(ds) == 0 && ss.lastSeq > 0 && t >= ss.nextMark
		if n := len(ds); n > 0 {
			ss.lastSeq = ds[n-1].Seq
		}
		if n := len(ds); n > 0 || mark {
			ss.nextMark = t + ss.syncEvery
		}
		seq := ss.lastSeq
		ss.mu.Unlock()
		if mark {
			out = append(out, Batch{Domain: ss.domain, Limit: ss.limit, Seq: seq})
		}
		for len(ds) > 0 {
			n := min(len(ds), crdt.MaxBatch)
			out = append(out, Batch{Domain: ss.domain, Limit: ss.limit, Deltas: ds[:n:n]})
			ds = ds[n:]
		}
	}
	return out
}

// FullStates returns the region's whole state of every shared-mode
// limit: what a new stream to a peer starts with.
func (e *Engine) FullStates() []Batch {
	var out []Batch
	for _, ss := range e.syncs() {
		if ss.shared {
			out = append(out, ss.full())
		}
	}
	return out
}

// FullState returns the region's whole state of one shared-mode limit,
// for a peer that asked for a resync. Send it in order with the batches
// of Outbound.
func (e *Engine) FullState(domain, limit string) (Batch, error) {
	_, ss, err := e.syncOf(domain, limit)
	if err != nil {
		return Batch{}, err
	}
	if ss == nil || !ss.shared {
		return Batch{}, fmt.Errorf("%w: %s/%s", ErrNotShared, domain, limit)
	}
	return ss.full(), nil
}

func (ss *limitSync) full() Batch {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ds, seq := ss.store.FullState()
	ss.lastSeq = max(ss.lastSeq, seq)
	return Batch{Domain: ss.domain, Limit: ss.limit, Deltas: ds, Full: true, Seq: seq}
}

// Source says where a batch comes from: the peer region, whose slot
// every delta must be, and the stream, whose sequence numbers are
// tracked on their own (a new stream starts with a full state).
type Source struct {
	Region string
	Stream string
}

// Inbound merges a batch from a peer. It reports resync when the
// batch's sequence numbers show lost deltas: the driver then asks the
// peer for the limit's full state (FullState on its side), and the
// peer's keys of that limit count as stale here until it arrives or
// stale_after passes. Duplicated, late or reordered batches are
// harmless: slots merge by maximum. A batch with an error is not applied
// at all: ErrUnknownPeer, ErrUnknownDomain, ErrUnknownLimit, ErrNotShared,
// ErrBadDescriptor (a key that is not one of the limit's) or ErrBadDelta.
func (e *Engine) Inbound(now time.Time, from Source, b Batch) (resync bool, err error) {
	ps := e.peer.Load()
	if ps == nil {
		return false, ErrNoPeers
	}
	if !ps.isPeer(from.Region) {
		return false, fmt.Errorf("%w %q", ErrUnknownPeer, from.Region)
	}
	ls, ss, err := e.syncOf(b.Domain, b.Limit)
	if err != nil {
		return false, err
	}
	if ss == nil || !ss.shared {
		return false, fmt.Errorf("%w: %s/%s", ErrNotShared, b.Domain, b.Limit)
	}
	t := now.UnixNano()
	horizon := ss.window(t) + maxAhead
	hashes := make([]uint64, len(b.Deltas))
	for i, d := range b.Deltas {
		switch {
		case d.Origin != from.Region:
			return false, fmt.Errorf("%w: a delta of region %q from region %q", ErrBadDelta, d.Origin, from.Region)
		case d.Window > horizon:
			return false, fmt.Errorf("%w: window %d is ahead of this region's clock (window %d)", ErrBadDelta, d.Window, horizon-maxAhead)
		}
		if i > 0 && d.Key == b.Deltas[i-1].Key {
			hashes[i] = hashes[i-1]
			continue
		}
		if hashes[i], err = e.wireKeyOf(ls, d.Key); err != nil {
			return false, err
		}
	}
	type keyWin struct {
		i      int
		others float64
	}
	touched := make([]keyWin, 0, len(b.Deltas))
	ss.mu.Lock()
	tr := ss.trackers[from.Stream]
	if tr == nil {
		tr = new(crdt.Tracker)
		ss.trackers[from.Stream] = tr
	}
	if !b.Full && len(b.Deltas) == 0 && b.Seq > tr.Last(from.Stream) {
		resync = true // a mark: the last deltas were lost
	}
	for i, d := range b.Deltas {
		if !b.Full && tr.Observe(from.Stream, d.Seq) == crdt.Gap {
			resync = true
		}
		if err := ss.store.Apply(d); errors.Is(err, crdt.ErrOldWindow) {
			ss.stats.OldDeltas++
			continue
		}
		touched = append(touched, keyWin{i: i})
	}
	for j := range touched {
		d := &b.Deltas[touched[j].i]
		touched[j].others = ss.othersAt(d.Key, d.Window)
	}
	ss.stats.DeltasIn += uint64(len(b.Deltas))
	switch {
	case b.Full:
		tr.Reset(from.Stream, b.Seq)
		if ss.pending[from.Stream] != nil {
			delete(ss.pending, from.Stream)
			ss.stats.Resyncs++
		}
	case resync:
		ss.stats.Gaps++
		if ss.pending[from.Stream] == nil {
			ss.pending[from.Stream] = &pendingSync{region: from.Region, since: t, asked: t}
		}
	}
	ss.mu.Unlock()
	for _, kw := range touched {
		d := &b.Deltas[kw.i]
		peer := slices.Index(ss.expected, d.Origin)
		e.withSharedKey(ss, ls, hashes[kw.i], d.Key, func(sk *sharedKey) {
			sk.peers.raise(d.Window, kw.others)
			sk.hear(peer, d.Window, float64(d.Value), t)
		})
	}
	return resync, nil
}

// PendingResyncs returns the limits whose full state is still awaited on
// a stream and was last asked for a sync interval ago or more: the
// driver asks again (a request or its answer may have been lost).
func (e *Engine) PendingResyncs(now time.Time, stream string) []Batch {
	t := now.UnixNano()
	var out []Batch
	for _, ss := range e.syncs() {
		ss.mu.Lock()
		if p := ss.pending[stream]; p != nil && t-p.asked >= ss.syncEvery {
			p.asked = t
			out = append(out, Batch{Domain: ss.domain, Limit: ss.limit})
		}
		ss.mu.Unlock()
	}
	return out
}

// Forget drops what is tracked of a stream that ended.
func (e *Engine) Forget(stream string) {
	for _, ss := range e.syncs() {
		ss.mu.Lock()
		delete(ss.trackers, stream)
		delete(ss.pending, stream)
		ss.mu.Unlock()
	}
}

// maintain counts the fallbacks that started and, once a second, sweeps
// the side entries of keys whose windows no longer count and takes the
// top-K estimates of the last complete window.
func (e *Engine) maintain(now time.Time) {
	ps := e.peer.Load()
	t := now.UnixNano()
	syncs := e.syncs()
	for _, ss := range syncs {
		stale := ss.shared && ss.stale(t)
		if stale && !ss.fallbackActive.Load() {
			ss.mu.Lock()
			ss.stats.Fallbacks++
			ss.mu.Unlock()
		}
		ss.fallbackActive.Store(stale)
	}
	ps.mu.Lock()
	due := t >= ps.nextMaintain
	if due {
		ps.nextMaintain = t + maintainEvery
	}
	ps.mu.Unlock()
	if !due {
		return
	}
	top := make(map[*limitSync][]KeyEstimate)
	for i := range ps.side {
		side, sh := &ps.side[i], &e.table.shards[i]
		sh.mu.Lock()
		for h, sk := range side.shared {
			w := sk.ss.window(t)
			if !sk.dirty && max(sk.inj.w, sk.pub.w, sk.peers.w, sk.sibs.w)+2 <= w {
				delete(side.shared, h)
				continue
			}
			if w == 0 {
				continue
			}
			own, _ := sk.pub.at(w - 1)
			sibs, _ := sk.sibs.at(w - 1)
			peers, _ := sk.peers.at(w - 1)
			k := KeyEstimate{Key: sk.ss.limit + ":" + sk.name, Window: w - 1, Total: own + sibs + peers, Limit: sk.limit}
			if k.Total > 0 {
				top[sk.ss] = pushTop(top[sk.ss], k)
			}
		}
		for h, nk := range side.needy {
			// An answer still awaited after a window is not coming.
			if w := nk.ss.window(t); nk.window < w && (nk.loan == 0 || nk.window+1 < w) {
				delete(side.needy, h)
			}
		}
		for h, lk := range side.lent {
			if lk.win+1 < lk.ss.window(t) {
				delete(side.lent, h)
			}
		}
		sh.mu.Unlock()
	}
	for _, ss := range syncs {
		if ss.shared {
			ss.mu.Lock()
			ss.topK = top[ss]
			ss.mu.Unlock()
		}
	}
}

// pushTop keeps the topK heaviest estimates, heaviest first.
func pushTop(ks []KeyEstimate, k KeyEstimate) []KeyEstimate {
	i, _ := slices.BinarySearchFunc(ks, k, func(a, b KeyEstimate) int { return cmp.Compare(b.Total, a.Total) })
	if i >= topK {
		return ks
	}
	ks = slices.Insert(ks, i, k)
	if len(ks) > topK {
		ks = ks[:topK]
	}
	return ks
}

// OvershootBound is the most a shared-mode limit admits above L in a
// window aligned on its period, bursts included (allot.SharedBound):
// (regions − 1) × max(rate × 2 × sync interval, 5 % of L) × max(1,
// ⌈delay / sync interval⌉), where delay is the one-way delay between
// regions. For a key with an override of L, the same with its own L;
// in a region of n instances, n times as much.
func (s SyncStats) OvershootBound(delay time.Duration) float64 {
	return allot.SharedBound(float64(s.Rate.Amount), s.Rate.Period, s.SyncInterval, delay, s.Regions)
}

// PartitionBound is the most a shared-mode limit admits above L in a
// window while a region is cut off (both ways) from the others, for a
// delay within the sync interval: twice the overshoot bound, the counts
// in flight when the cut came being lost. What a region admits after it
// last heard every peer is not taken as seen, and the staleness fallback
// splits only what is left of the window.
func (s SyncStats) PartitionBound() float64 { return s.OvershootBound(2 * s.SyncInterval) }

// SharedView returns every region's slot of a shared-mode key (named as
// KeyString names it) in a window, as this region knows them: its own
// (the sum over its instances, as last published) and its peers'. For
// status pages, tools and tests.
func (e *Engine) SharedView(domain, limit, key string, window uint64) (map[string]uint64, error) {
	_, ss, err := e.syncOf(domain, limit)
	if err != nil {
		return nil, err
	}
	if ss == nil || !ss.shared {
		return nil, fmt.Errorf("%w: %s/%s", ErrNotShared, domain, limit)
	}
	key = strings.TrimPrefix(key, limit+":")
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := map[string]uint64{ss.ps.region: ss.store.Slot(key, window, ss.ps.region)}
	for _, p := range ss.expected {
		out[p] = ss.store.Slot(key, window, p)
	}
	return out, nil
}

// Window returns the window id of now for a limit that syncs with peers:
// floor(unix_ms / period_ms).
func (e *Engine) Window(domain, limit string, now time.Time) (uint64, error) {
	_, ss, err := e.syncOf(domain, limit)
	if err != nil {
		return 0, err
	}
	if ss == nil {
		return 0, fmt.Errorf("%w: %s/%s", ErrNotShared, domain, limit)
	}
	return ss.window(now.UnixNano()), nil
}

// wireKey names a key of limit l on the wire: as KeyString does, less
// the limit's name, which every batch carries once ("user=42").
func wireKey(l *allot.Limit, d allot.Descriptor) string {
	return KeyString(l, d)[len(l.Name)+1:]
}

// wireKeyOf hashes a key named as wireKey names it.
func (e *Engine) wireKeyOf(ls *limitState, key string) (uint64, error) {
	return e.keyOf(ls, ls.l.Name+":"+key)
}
