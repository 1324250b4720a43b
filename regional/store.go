package regional

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot"
)

// Store is a region's shared state for leased and exact limits: one
// bucket per key, shared by every instance of the region. The Enforcer
// uses it; regional/redisstore keeps it in a regional Redis, MemoryStore
// in memory (tests and the simulator).
//
// now is the caller's clock. A store with a clock of its own (Redis TIME)
// uses that instead, so that instances with skewed clocks agree. Every
// method returns by ctx's deadline. An error means the store did not
// answer. A call that changes buckets or slots changes nothing once ctx's
// deadline has passed (regional/redisstore checks it on Redis time), so a
// call that timed out, and that the caller decided by on_failure, is not
// also carried out later; one that ran just in time but whose answer came
// back too late still is (redisstore's package doc bounds it).
// Implementations are safe for concurrent use.
type Store interface {
	// Take charges every op's cost to its bucket if each op that is not
	// Shadow admits, and nothing otherwise: a request matching several
	// exact limits is charged on all or none. A Shadow op is charged only
	// when it admits and the others do. Ops on one key add up, in order.
	// res[i] answers ops[i]; its Remaining is as if the op were charged.
	Take(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error
	// Lease runs each op on its own: it gives op.Return tokens back to the
	// bucket, then takes as many tokens as are there, up to op.Want, or
	// none if fewer than op.Min are.
	Lease(ctx context.Context, now time.Time, ops []LeaseOp, res []LeaseResult) error
	// Heartbeat records instance as live in region until now+ttl, or
	// removes it when ttl is 0, and returns how many instances of region
	// are live.
	Heartbeat(ctx context.Context, now time.Time, region, instance string, ttl time.Duration) (int, error)
}

// MarkStore keeps the marks of an instance's persisted long windows
// (Engine.Snapshot, Engine.Restore): one record per instance, domain,
// limit and window, which expires at the window's end. It is how a
// restarted process of the same instance knows what it spent.
// Implementations are safe for concurrent use.
type MarkStore interface {
	// SaveMarks writes each record of marks: its Low, Floor and each key's
	// mark replace those saved before (the engine only raises marks and
	// floors, and only lowers Low, within a window); keys not listed keep
	// theirs. An error means some records may not have been written.
	SaveMarks(ctx context.Context, now time.Time, instance string, marks []Marks) error
	// LoadMarks returns the record saved for each of want that has one,
	// with every key saved in it; want names the domain, limit, period
	// and window (as Engine.Persisted returns them).
	LoadMarks(ctx context.Context, instance string, want []Marks) ([]Marks, error)
}

// Bucket is one key's budget in the region: the key's effective limit
// scaled by the region's share. Key names it identically in every
// instance ("domain/limit:k=v").
type Bucket struct {
	Key       string
	Algorithm allot.Algorithm
	Amount    float64 // per Period
	Burst     float64 // capacity; sliding_window ignores it
	Period    time.Duration
}

// TakeOp charges one bucket for one decision.
type TakeOp struct {
	Bucket
	Cost   float64
	Shadow bool // never rejects; charged only when it admits
}

// TakeResult is one bucket's answer to a TakeOp.
type TakeResult struct {
	Allowed    bool
	Remaining  float64       // whole tokens
	ResetAfter time.Duration // until the bucket is full again
	RetryAfter time.Duration // until the cost would pass; 0 when allowed
}

// LeaseOp returns the unused tokens of an earlier lease, then takes a new
// one: between Min and Want tokens, or none.
type LeaseOp struct {
	Bucket
	Return float64
	// Window is, for sliding_window, the start (unix ns) of the window
	// that Return was taken from, 0 for the current one; tokens of an
	// older window are not given back, they no longer count.
	Window    int64
	Min, Want float64
	// Ahead is, for sliding_window, how far ahead of now (within the
	// window) the grant may reach: it takes from what the window will
	// hold then.
	Ahead time.Duration
}

// LeaseResult is one bucket's answer to a LeaseOp.
type LeaseResult struct {
	Granted   float64
	Available float64 // whole tokens the bucket holds after the grant
	// RetryAfter is, when nothing was granted, how long until Min tokens
	// are there.
	RetryAfter time.Duration
	// Window and WindowLeft are, for sliding_window, the start (unix ns)
	// of the window the grant was taken from and the time it has left: a
	// lease must not outlive its window.
	Window     int64
	WindowLeft time.Duration
}

func (b *Bucket) params() params {
	return params{alg: b.Algorithm, amount: b.Amount, burst: b.Burst, period: int64(b.Period)}
}

// MemoryStore is a Store in memory, on the caller's clock. It keeps every
// key it has seen, so it suits tests and the simulator, not production.
// The zero value is ready to use; it is safe for concurrent use.
type MemoryStore struct {
	mu      sync.Mutex
	slots   map[string]*slot
	members map[string]map[string]int64 // region → instance → expiry (unix ns)
	sets    map[string]map[string]int64 // concurrency slots: key → holder → expiry (unix ns)
	marks   map[string]*storedMarks     // by markKey
	err     error
}

var (
	_ Store     = (*MemoryStore)(nil)
	_ MarkStore = (*MemoryStore)(nil)
)

// storedMarks is a record of MarkStore in memory.
type storedMarks struct {
	m    Marks
	keys map[string]float64
	end  int64 // unix ns: it expires then
}

func markKey(instance string, m *Marks) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%d\x00%d", instance, m.Domain, m.Limit, m.Period, m.Window)
}

// SaveMarks implements MarkStore.
func (m *MemoryStore) SaveMarks(ctx context.Context, now time.Time, instance string, marks []Marks) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	t := now.UnixNano()
	for k, r := range m.marks {
		if r.end <= t {
			delete(m.marks, k)
		}
	}
	for i := range marks {
		mk := &marks[i]
		if mk.Period <= 0 {
			continue
		}
		end := (mk.Window + 1) * int64(mk.Period)
		if end <= t {
			continue // expired already
		}
		if m.marks == nil {
			m.marks = make(map[string]*storedMarks)
		}
		k := markKey(instance, mk)
		r := m.marks[k]
		if r == nil {
			r = &storedMarks{keys: map[string]float64{}, end: end}
			m.marks[k] = r
		}
		r.m = Marks{Domain: mk.Domain, Limit: mk.Limit, Period: mk.Period, Window: mk.Window, Low: mk.Low, Floor: mk.Floor}
		for _, km := range mk.Keys {
			r.keys[km.Key] = km.Mark
		}
	}
	return nil
}

// LoadMarks implements MarkStore.
func (m *MemoryStore) LoadMarks(ctx context.Context, instance string, want []Marks) ([]Marks, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	var out []Marks
	for i := range want {
		r := m.marks[markKey(instance, &want[i])]
		if r == nil {
			continue
		}
		mk := r.m
		for k, v := range r.keys {
			mk.Keys = append(mk.Keys, KeyMark{Key: k, Mark: v})
		}
		slices.SortFunc(mk.Keys, func(a, b KeyMark) int { return cmp.Compare(a.Key, b.Key) })
		out = append(out, mk)
	}
	return out, nil
}

// SetErr makes every later call fail with err, as an unreachable store
// would; nil heals it.
func (m *MemoryStore) SetErr(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// get returns key's slot, created full at now. The caller holds m.mu.
func (m *MemoryStore) get(key string, now int64, p params) *slot {
	s := m.slots[key]
	if s == nil {
		if m.slots == nil {
			m.slots = make(map[string]*slot)
		}
		s = &slot{}
		fresh(s, now, p)
		m.slots[key] = s
	}
	return s
}

// Take implements Store.
func (m *MemoryStore) Take(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	t := now.UnixNano()
	trials := make(map[string]slot, len(ops))
	admit := true
	for i := range ops {
		op := &ops[i]
		p := op.params()
		s, ok := trials[op.Key]
		if !ok {
			s = *m.get(op.Key, t, p)
		}
		o := take(&s, t, p, op.Cost, false)
		trials[op.Key] = s // charged only if allowed
		res[i] = TakeResult{Allowed: o.allowed, Remaining: math.Floor(o.remaining),
			ResetAfter: time.Duration(o.resetAfter), RetryAfter: time.Duration(o.retryAfter)}
		admit = admit && (o.allowed || op.Shadow)
	}
	if admit {
		for k, s := range trials {
			*m.slots[k] = s
		}
	}
	return nil
}

// Lease implements Store.
func (m *MemoryStore) Lease(ctx context.Context, now time.Time, ops []LeaseOp, res []LeaseResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	t := now.UnixNano()
	for i := range ops {
		op := &ops[i]
		p := op.params()
		s := m.get(op.Key, t, p)
		giveBack(s, t, p, op.Return, op.Window)
		r := LeaseResult{}
		at := t
		if p.alg == allot.SlidingWindow && op.Ahead > 0 {
			roll(s, t, p)
			at = min(t+int64(op.Ahead), s.t+p.period-1)
		}
		if g := math.Min(op.Want, math.Floor(available(s, at, p))); g >= op.Min && g > 0 && take(s, at, p, g, false).allowed {
			r.Granted = g
		} else {
			trial := *s
			r.RetryAfter = time.Duration(take(&trial, t, p, math.Max(op.Min, 0), false).retryAfter)
		}
		r.Available = math.Floor(available(s, t, p))
		if p.alg == allot.SlidingWindow {
			r.Window, r.WindowLeft = s.t, time.Duration(s.t+p.period-t)
		}
		res[i] = r
	}
	return nil
}

// Heartbeat implements Store.
func (m *MemoryStore) Heartbeat(ctx context.Context, now time.Time, region, instance string, ttl time.Duration) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return 0, m.err
	}
	if m.members == nil {
		m.members = make(map[string]map[string]int64)
	}
	live := m.members[region]
	if live == nil {
		live = make(map[string]int64)
		m.members[region] = live
	}
	t := now.UnixNano()
	for id, exp := range live {
		if exp <= t {
			delete(live, id)
		}
	}
	if ttl > 0 {
		live[instance] = t + int64(ttl)
	} else {
		delete(live, instance)
	}
	return len(live), nil
}

// available is what a bucket holds at now.
func available(s *slot, now int64, p params) float64 {
	if p.alg == allot.SlidingWindow {
		roll(s, now, p)
		left := float64(max(s.t+p.period-now, 0))
		return math.Max(0, p.amount-(s.b*left/float64(p.period)+s.a))
	}
	return tokensAt(s, max(now, lastUpdate(s, p.alg)), p)
}

// giveBack returns n unused tokens, never above a full bucket. Sliding
// window tokens go back to the window they came from, if it still counts.
func giveBack(s *slot, now int64, p params, n float64, window int64) {
	if n <= 0 {
		return
	}
	if p.alg != allot.SlidingWindow {
		refund(s, now, p, n)
		return
	}
	roll(s, now, p)
	switch window {
	case 0, s.t:
		s.a = math.Max(0, s.a-n)
	case s.t - p.period:
		s.b = math.Max(0, s.b-n)
	}
}
