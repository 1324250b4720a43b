package regional

import (
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// DefaultMaxTenantEstimates bounds the keys whose own output estimate
// Reservations keep: about 340 bytes each, 11 MB in all.
const DefaultMaxTenantEstimates = 1 << 15

// tenantBand is 1/x of a key's own estimate: the limit's shared estimate
// is held within its own ± 1/tenantBand (10 %).
const tenantBand = 10

// tenantSamples is how many of its latest settled outputs a key's own
// estimate keeps.
const tenantSamples = 128

// tenantEstimates learns, per key of a token limit and model (a tenant),
// the quantile of its own latest settled outputs (the latest 128, however
// old), so that other tenants' settles cannot move a tenant's estimate
// far once it has data of its own: Reserve holds the limit's shared
// estimate within ±10 % of it.
// The table holds at most max keys: past it, the key least recently
// used is forgotten (it falls back to its limit's shared estimate). Each
// key costs about 340 bytes: 128 samples of 2 bytes (a 16-bit float:
// exact to 2047, then within 0.1 %), the key, the cached quantile, two
// list links, and about 40 bytes of the map's. Safe for concurrent use.
type tenantEstimates struct {
	q    float64
	minN int // samples before the key's own quantile is used
	max  int
	seed maphash.Seed

	mu         sync.Mutex // guards what follows
	byKey      map[uint64]*tenantEntry
	head, tail *tenantEntry // most and least recently used
}

// tenantEntry is one key and model's latest outputs. tenantEstimates.mu
// guards it.
type tenantEntry struct {
	key        uint64
	buf        [tenantSamples]uint16 // ring of the latest outputs, packed
	next, n    uint8
	value      uint32 // the q-quantile of buf[:n]
	prev, succ *tenantEntry
}

func newTenantEstimates(q float64, minSamples, max int) *tenantEstimates {
	return &tenantEstimates{q: q, minN: min(minSamples, tenantSamples), max: max,
		seed: maphash.MakeSeed(), byKey: make(map[uint64]*tenantEntry)}
}

// tenantKey names a key of a limit (the engine's key, which tells limits
// and domains apart) and a model.
func (ts *tenantEstimates) tenantKey(key uint64, model string) uint64 {
	return key ^ (maphash.String(ts.seed, model) * 0x9e3779b97f4a7c15)
}

// estimate returns the key's own q-quantile, if it has minN samples.
func (ts *tenantEstimates) estimate(key uint64, model string) (int64, bool) {
	k := ts.tenantKey(key, model)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e := ts.byKey[k]
	if e == nil || int(e.n) < ts.minN {
		return 0, false
	}
	ts.touch(e)
	return int64(e.value), true
}

// observe records one settled output of the key.
func (ts *tenantEstimates) observe(key uint64, model string, output int64) {
	k := ts.tenantKey(key, model)
	v := pack(output)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e := ts.byKey[k]
	if e == nil {
		if len(ts.byKey) >= ts.max && ts.tail != nil {
			old := ts.tail
			ts.unlink(old)
			delete(ts.byKey, old.key)
		}
		e = &tenantEntry{key: k}
		ts.byKey[k] = e
	} else {
		ts.unlink(e)
	}
	ts.pushFront(e)
	e.buf[e.next] = v
	e.next = (e.next + 1) % tenantSamples
	e.n = min(e.n+1, tenantSamples)
	var sorted [tenantSamples]uint16
	s := sorted[:e.n]
	copy(s, e.buf[:e.n])
	slices.Sort(s) // packing keeps the order
	i := int(math.Ceil(ts.q*float64(e.n))) - 1
	e.value = unpack(s[min(max(i, 0), int(e.n)-1)])
}

// pack stores an output in 16 bits: exact below 2048, then 11
// significant bits and an exponent (within 0.1 %), up to 2^32; it keeps
// the order.
func pack(v int64) uint16 {
	u := uint32(min(max(v, 0), math.MaxUint32))
	if u < 1<<11 {
		return uint16(u)
	}
	e := bits.Len32(u) - 11 // ≥ 1
	return uint16(1<<11 + (e-1)<<10 + int(u>>e) - 1<<10)
}

// unpack is the inverse of pack, to the middle of what it rounded.
func unpack(c uint16) uint32 {
	if c < 1<<11 {
		return uint32(c)
	}
	x := int(c) - 1<<11
	e := x>>10 + 1
	m := uint32(x&(1<<10-1) + 1<<10)
	return m<<e + 1<<(e-1)
}

// len is how many keys the table holds.
func (ts *tenantEstimates) len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byKey)
}

func (ts *tenantEstimates) touch(e *tenantEntry) {
	if ts.head != e {
		ts.unlink(e)
		ts.pushFront(e)
	}
}

func (ts *tenantEstimates) pushFront(e *tenantEntry) {
	e.prev, e.succ = nil, ts.head
	if ts.head != nil {
		ts.head.prev = e
	}
	ts.head = e
	if ts.tail == nil {
		ts.tail = e
	}
}

func (ts *tenantEstimates) unlink(e *tenantEntry) {
	if e.prev != nil {
		e.prev.succ = e.succ
	} else if ts.head == e {
		ts.head = e.succ
	}
	if e.succ != nil {
		e.succ.prev = e.prev
	} else if ts.tail == e {
		ts.tail = e.prev
	}
	e.prev, e.succ = nil, nil
}
