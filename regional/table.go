package regional

import (
	"sync"
	"sync/atomic"

	"github.com/allot-dev/allot"
)

// slot is one key's state: 40 bytes. The meaning of t, a and b depends on
// the limit's algorithm (see algo.go). key 0 marks an empty slot; hashes of
// 0 are stored as 1.
type slot struct {
	key    uint64
	idleAt int64 // unix ns from which the state equals a fresh key's
	t      int64
	a      float64
	b      float64
}

// shard is one lock's part of the key table: an open-addressing hash table
// with linear probing and backward-shift deletion.
type shard struct {
	mu    sync.Mutex
	slots []slot // len is a power of two, or 0 before the first insert
	n     int    // occupied slots
	max   int    // occupied slots allowed before eviction
	stats tableStats
	// demand counts cost per limit (by limitShares.id) since the last
	// Engine.Demand; hot counts it per hot key.
	demand []demand
	hot    map[uint64]*hotKey
	// marks are the persisted keys' marks (persist.go), dirty those
	// checked since the last acknowledged snapshot; marksNext is when the
	// earliest of marks' windows ends.
	marks     map[uint64]*keyMark
	dirty     map[uint64]*keyMark
	marksNext int64
	// wins is, per limit (by limitShares.id), the most any of its
	// sliding-window keys counted in its latest window (noteWindow).
	wins []winUse
	// victims keeps keys evicted while active (remember, recall).
	victims []slot

	_ [64]byte // keep neighbouring shards' locks off one cache line
}

type demand struct{ admitted, rejected float64 }

// hotKey is a key whose traffic is counted on its own (see tallyKey): one
// that was rejected or near its allowance, from that request on, or one
// the region holds a share of its own for.
type hotKey struct {
	shares             *limitShares
	name               string // as KeyString names it
	admitted, rejected float64
	near               bool // rejected or near its allowance since the last Engine.Demand
	own                bool // scratch of drainHot: the region holds a share of its own for it
}

// maxHotPerShard bounds the hot keys one shard counts between two drains.
const maxHotPerShard = 256

func (s *shard) demandOf(id int) *demand {
	if id >= len(s.demand) {
		s.demand = append(s.demand, make([]demand, id+1-len(s.demand))...)
	}
	return &s.demand[id]
}

type tableStats struct {
	evictedIdle   uint64
	evictedActive uint64
	// recalled counts keys made again from their evicted state,
	// conservative those made again as charged as an evicted key that
	// shared their place in victims.
	recalled, conservative uint64
}

const (
	shardBits   = 6
	numShards   = 1 << shardBits
	minShardCap = 16
)

// table maps key hashes to slots. It is safe for concurrent use: each shard
// has its own lock, and a caller that needs several keys at once locks their
// shards in ascending order (lockOrder).
type table struct {
	shards  [numShards]shard
	persist atomic.Pointer[persistCfg] // nil: long windows are not persisted (persist.go)
}

func newTable(maxKeys int) *table {
	t := &table{}
	per := max(maxKeys/numShards, 1)
	for i := range t.shards {
		t.shards[i].max = per
	}
	return t
}

func shardOf(key uint64) int { return int(key >> (64 - shardBits)) }

func normKey(key uint64) uint64 {
	if key == 0 {
		return 1
	}
	return key
}

// find returns the index of key's slot in s, or -1. The caller holds s.mu.
func (s *shard) find(key uint64) int {
	if len(s.slots) == 0 {
		return -1
	}
	mask := len(s.slots) - 1
	for i := int(key) & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case key:
			return i
		case 0:
			return -1
		}
	}
}

// insert adds key with a zero state and returns its index, growing the
// shard when needed. The caller holds s.mu, has checked that key is absent
// and has made room with makeRoom.
func (s *shard) insert(key uint64) int {
	if (s.n+1)*4 > len(s.slots)*3 { // load factor ≤ 3/4
		s.resize(max(len(s.slots)*2, minShardCap))
	}
	mask := len(s.slots) - 1
	i := int(key) & mask
	for s.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = slot{key: key}
	s.n++
	return i
}

func (s *shard) resize(n int) {
	old := s.slots
	s.slots = make([]slot, n)
	mask := n - 1
	for _, sl := range old {
		if sl.key == 0 {
			continue
		}
		i := int(sl.key) & mask
		for s.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = sl
	}
}

// remove deletes the slot at i with backward-shift deletion, so lookups
// never need tombstones.
func (s *shard) remove(i int) {
	mask := len(s.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		if s.slots[j].key == 0 {
			break
		}
		home := int(s.slots[j].key) & mask
		// Move j back to i if its home is not in the cyclic range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = slot{}
	s.n--
}

// sweep removes every slot whose state equals a fresh key's at now. Such an
// eviction changes no decision. It returns how many slots it removed.
func (s *shard) sweep(now int64) int {
	removed := 0
	for i := 0; i < len(s.slots); {
		if sl := &s.slots[i]; sl.key != 0 && sl.idleAt <= now {
			s.remove(i) // the slot at i now holds a shifted entry: look again
			removed++
			continue
		}
		i++
	}
	s.stats.evictedIdle += uint64(removed)
	return removed
}

// sweepOwed is sweep for the fallback table: it keeps a slot full at
// now that was not full at back, which still owes the store what it
// lacked then (Enforcer's repay).
func (s *shard) sweepOwed(now, back int64) {
	for i := 0; i < len(s.slots); {
		if sl := &s.slots[i]; sl.key != 0 && sl.idleAt <= now && sl.idleAt <= back {
			s.remove(i)
			s.stats.evictedIdle++
			continue
		}
		i++
	}
}

// makeRoom evicts a key when the shard is full: idle keys first; if none,
// the key closest to being idle, whose loss forgets the least charge.
func (s *shard) makeRoom(now int64) {
	if s.n < s.max || s.sweep(now) > 0 {
		return
	}
	best, bestAt := -1, int64(0)
	for i := range s.slots {
		if sl := &s.slots[i]; sl.key != 0 && (best < 0 || sl.idleAt < bestAt) {
			best, bestAt = i, sl.idleAt
		}
	}
	if best >= 0 {
		s.remember(s.slots[best], now)
		s.remove(best)
		s.stats.evictedActive++
	}
}

// unknownCount is the count of a window in which a key may have been
// charged by an unknown amount (recall): more than any limit, so that
// the key admits nothing more in the window (nor, as the previous
// window, in the next).
const unknownCount = 1e15

// merged marks a victim entry that stands for several evicted keys: its
// idleAt is the latest of theirs, and its state is none of them.
const merged = ^uint64(0)

// remember keeps the state of a key evicted while active, so that the key
// made again is not fresh: what it spent stays spent. victims is a
// two-way table made at the first such eviction (an eighth of the
// shard's keys, at least 16): each key has two places. When both hold
// other active keys, the key merges into the one idle sooner: a merged
// entry keeps the later idleAt, and a key of either place made again
// from it is as charged as any state with that idleAt can be (recall),
// never less charged than it was.
func (s *shard) remember(sl slot, now int64) {
	if s.victims == nil {
		n := minShardCap
		for n < s.max/8 {
			n *= 2
		}
		s.victims = make([]slot, n)
	}
	i, j := s.places(sl.key)
	vi, vj := &s.victims[i], &s.victims[j]
	switch {
	case vi.key == sl.key:
		*vi = sl
	case vj.key == sl.key:
		*vj = sl
	case vi.key == 0 || vi.idleAt <= now:
		*vi = sl
	case vj.key == 0 || vj.idleAt <= now:
		*vj = sl
	default:
		v := vi
		if vj.idleAt < vi.idleAt {
			v = vj
		}
		*v = slot{key: merged, idleAt: max(v.idleAt, sl.idleAt)}
	}
}

// remake initialises s, the slot of a key just inserted at now, as its
// share history and configuration changes c make a fresh key
// (shareHist.fresh), or, when the key was evicted while active, from its
// kept state (recall), brought through the changes since.
func (s *shard) remake(sl *slot, now int64, hist *shareHist, base, p params, c *reconf) {
	hist.fresh(sl, now, base, c)
	if s.recall(sl, now, p) {
		hist.catchUp(sl, base, c)
	}
}

// places are key's two places in victims.
func (s *shard) places(key uint64) (int, int) {
	mask := uint64(len(s.victims) - 1)
	return int(key & mask), int(mix(key) & mask)
}

// recall makes s, the fresh slot of key just inserted at now, what it was
// when evicted: exactly when its own state is kept (it reports true: the
// caller brings it through the changes since), or, when one of its places
// holds a merged entry not idle yet, as charged as any key it stands for
// can be under p (Stats.Conservative): an empty bucket (a share raised since
// the eviction would make a bucket refilling to full at the entry's
// idleAt hold more than the key did), a window closed for the rest of
// this window and the next when the idleAt says the key may have been
// charged in it (the limit in force then may have been above today's),
// else a fresh window (a persisted key is counted at its mark instead:
// restoreSlot).
func (s *shard) recall(sl *slot, now int64, p params) (exact bool) {
	if s.victims == nil {
		return false
	}
	i, j := s.places(sl.key)
	var m *slot
	for _, k := range [2]int{i, j} {
		v := &s.victims[k]
		if v.idleAt <= now {
			continue
		}
		if v.key == sl.key {
			*sl, *v = *v, slot{}
			s.stats.recalled++
			return true
		}
		if v.key == merged && (m == nil || v.idleAt > m.idleAt) {
			m = v
		}
	}
	if m == nil {
		return false
	}
	s.stats.conservative++
	switch p.alg {
	case allot.TokenBucket, allot.GCRA:
		setTokens(sl, now, 0, p)
	case allot.SlidingWindow: // what a window of true time may hold is its count: the previous one only smooths
		ws := now - now%p.period
		sl.t, sl.a, sl.b = ws, 0, 0
		if m.idleAt > ws+p.period { // may have been charged in this window, up to any limit in force in it
			sl.a = unknownCount
		}
	}
	sl.idleAt = max(m.idleAt, now+p.wait(p.burst))
	return false
}

// lockSet locks the shards of up to len(keys) keys in ascending shard
// order, each once, and unlocks them together.
type lockSet struct {
	n   int
	ids [numShards]uint8 // every shard at most once
}

func (l *lockSet) lock(t *table, keys []uint64) {
	l.n = 0
	var seen [numShards / 64]uint64
	for _, k := range keys {
		id := shardOf(k)
		if seen[id/64]&(1<<(id%64)) != 0 {
			continue
		}
		seen[id/64] |= 1 << (id % 64)
		// insertion sort: n is small
		j := l.n
		for j > 0 && l.ids[j-1] > uint8(id) {
			l.ids[j] = l.ids[j-1]
			j--
		}
		l.ids[j] = uint8(id)
		l.n++
	}
	for _, id := range l.ids[:l.n] {
		t.shards[id].mu.Lock()
	}
}

func (l *lockSet) unlock(t *table) {
	for _, id := range l.ids[:l.n] {
		t.shards[id].mu.Unlock()
	}
}
