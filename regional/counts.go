package regional

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CountStore keeps the shared-mode counts of a region's instances where
// all of them see them: the regional Redis (regional/redisstore), or
// MemoryCounts. docs/adr/0002-shared-mode-slots-across-instances.md says
// why it looks like this.
//
// For each key and window the store holds one field per instance of the
// region (its own count) and one per peer region (that region's slot, as
// some instance of this region received it). Every field only grows:
// a write sets it to the maximum of its value and the one written, so
// repeated, late or reordered writes are harmless. The region's own slot
// is the sum of its instances' fields; any instance may publish it.
//
// Implementations are safe for concurrent use; every method returns by
// ctx's deadline.
type CountStore interface {
	// MergeCounts raises, for each op, the field of instance to op.Value
	// (unless instance is empty) and the fields of op.Peers, then reads
	// the key's window back: res[i].Value is instance's field,
	// res[i].Region the sum of the instance fields, res[i].Peers the peer
	// regions' fields. Fields expire two periods after their window ends.
	MergeCounts(ctx context.Context, instance string, ops []CountOp, res []RegionCount) error
}

// CountOp is one key's window to merge: this instance's count (Value)
// and peer regions' slots received since the last merge.
type CountOp struct {
	Count
	Peers []PeerCount
}

// MemoryCounts is a CountStore in memory, for tests and the simulator. The
// zero value is ready to use; it is safe for concurrent use.
type MemoryCounts struct {
	// Now is the clock cells expire on (the simulator's); nil: the wall
	// clock. Set it before the first call.
	Now func() time.Time

	mu    sync.Mutex
	cells map[string]*slotCell
	err   error
}

var _ CountStore = (*MemoryCounts)(nil)

type slotCell struct {
	expires   time.Time
	instances map[string]uint64
	peers     map[string]uint64
}

// SetErr makes every later call fail with err, as an unreachable store
// would; nil heals it.
func (m *MemoryCounts) SetErr(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// CountKey names a key's window in a CountStore:
// "domain/limit:key@window". A Redis store wraps it in braces, a hash tag
// that keeps one window's fields in one Cluster slot.
func CountKey(c Count) string {
	var b strings.Builder
	b.WriteString(c.Domain)
	b.WriteString("/")
	b.WriteString(c.Limit)
	b.WriteString(":")
	b.WriteString(c.Key)
	b.WriteString("@")
	b.WriteString(strconv.FormatUint(c.Window, 10))
	return b.String()
}

// MergeCounts implements CountStore; cells expire on m.Now.
func (m *MemoryCounts) MergeCounts(ctx context.Context, instance string, ops []CountOp, res []RegionCount) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	now := time.Now()
	if m.Now != nil {
		now = m.Now()
	}
	for k, c := range m.cells {
		if now.After(c.expires) {
			delete(m.cells, k)
		}
	}
	if m.cells == nil {
		m.cells = make(map[string]*slotCell)
	}
	for i := range ops {
		op := &ops[i]
		k := CountKey(op.Count)
		c := m.cells[k]
		if c == nil {
			c = &slotCell{instances: map[string]uint64{}, peers: map[string]uint64{}}
			m.cells[k] = c
		}
		if op.Period > 0 {
			end := time.UnixMilli(int64(op.Window+1) * op.Period.Milliseconds())
			c.expires = end.Add(2 * op.Period)
		}
		if instance != "" {
			c.instances[instance] = max(c.instances[instance], op.Value)
		}
		for _, p := range op.Peers {
			c.peers[p.Region] = max(c.peers[p.Region], p.Value)
		}
		r := RegionCount{Count: op.Count}
		r.Value = c.instances[instance]
		for _, v := range c.instances {
			r.Region += v
		}
		for p, v := range c.peers {
			r.Peers = append(r.Peers, PeerCount{Region: p, Value: v})
		}
		slices.SortFunc(r.Peers, func(a, b PeerCount) int { return strings.Compare(a.Region, b.Region) })
		res[i] = r
	}
	return nil
}

// CountOps makes the ops of one MergeCounts call: this instance's counts
// (from CollectCounts) and the peers' slots in the batches it received
// since its previous merge, one op per key and window.
func (e *Engine) CountOps(own []Count, received []Batch) []CountOp {
	type id struct {
		domain, limit, key string
		window             uint64
	}
	index := make(map[id]int, len(own))
	var ops []CountOp
	for _, c := range own {
		k := id{c.Domain, c.Limit, c.Key, c.Window}
		if i, ok := index[k]; ok {
			ops[i].Value = max(ops[i].Value, c.Value)
			continue
		}
		index[k] = len(ops)
		ops = append(ops, CountOp{Count: c})
	}
	for _, b := range received {
		_, ss, err := e.syncOf(b.Domain, b.Limit)
		if err != nil || ss == nil || !ss.shared {
			continue
		}
		for _, d := range b.Deltas {
			k := id{b.Domain, b.Limit, d.Key, d.Window}
			i, ok := index[k]
			if !ok {
				i = len(ops)
				index[k] = i
				ops = append(ops, CountOp{Count: Count{Domain: b.Domain, Limit: b.Limit, Key: d.Key, Window: d.Window, Period: time.Duration(ss.period)}})
			}
			op := &ops[i]
			j := slices.IndexFunc(op.Peers, func(p PeerCount) bool { return p.Region == d.Origin })
			if j < 0 {
				op.Peers = append(op.Peers, PeerCount{Region: d.Origin, Value: d.Value})
			} else {
				op.Peers[j].Value = max(op.Peers[j].Value, d.Value)
			}
		}
	}
	return ops
}

// Alone turns this instance's counts into the region's, for a region of
// one instance, or when the CountStore does not answer (the other
// instances' counts stay as last merged).
func Alone(own []Count) []RegionCount {
	rs := make([]RegionCount, len(own))
	for i, c := range own {
		rs[i] = RegionCount{Count: c, Region: c.Value}
	}
	return rs
}
