package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot"
)

// ReservationStore is what reservations need of a regional Store beyond
// Take and Lease: charges that may take a bucket below zero (usage settled
// above what a reservation held) and concurrency slots, so that every
// instance of the region counts a key's reservations in flight together.
// MemoryStore and regional/redisstore implement it. With a Store that
// does not, concurrency caps of leased and exact limits are counted per
// instance, in memory, and extra usage is charged with Take (lost when
// the bucket is short).
type ReservationStore interface {
	// Charge charges every op's cost to its bucket even when that takes it
	// below zero; Shadow is ignored. res[i] answers ops[i].
	Charge(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error
	// Acquire adds op.Holder to every op's slot set if each set holds
	// fewer than op.Cap live holders, and to none otherwise. An entry
	// lives op.TTL unless Free removes it first.
	Acquire(ctx context.Context, now time.Time, ops []SlotOp, res []SlotResult) error
	// Free removes each op's holder from its set.
	Free(ctx context.Context, now time.Time, ops []SlotOp) error
}

// SlotOp is one key's concurrency slot for one reservation.
type SlotOp struct {
	Key    string // the key's name, as Bucket.Key
	Cap    int64
	Holder string // the reservation id
	TTL    time.Duration
}

// SlotResult answers a SlotOp of Acquire.
type SlotResult struct {
	Allowed  bool
	InFlight int64 // live holders, this one included when allowed
	// RetryAfter is, when rejected, how long until the earliest holder
	// expires.
	RetryAfter time.Duration
}

var _ ReservationStore = (*MemoryStore)(nil)

// Charge implements ReservationStore.
func (m *MemoryStore) Charge(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	t := now.UnixNano()
	for i := range ops {
		op := &ops[i]
		p := op.params()
		o := take(m.get(op.Key, t, p), t, p, op.Cost, true)
		res[i] = TakeResult{Allowed: true, Remaining: math.Floor(o.remaining), ResetAfter: time.Duration(o.resetAfter)}
	}
	return nil
}

// Acquire implements ReservationStore.
func (m *MemoryStore) Acquire(ctx context.Context, now time.Time, ops []SlotOp, res []SlotResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	t := now.UnixNano()
	if m.sets == nil {
		m.sets = make(map[string]map[string]int64)
	}
	admit := true
	for i, op := range ops {
		set := m.sets[op.Key]
		first := int64(math.MaxInt64)
		for h, exp := range set {
			if exp <= t {
				delete(set, h)
			} else {
				first = min(first, exp)
			}
		}
		n := int64(len(set))
		_, held := set[op.Holder]
		res[i] = SlotResult{Allowed: held || n < op.Cap, InFlight: n}
		if !res[i].Allowed {
			res[i].RetryAfter = time.Duration(first - t)
			admit = false
		}
	}
	if !admit {
		return nil
	}
	for i, op := range ops {
		set := m.sets[op.Key]
		if set == nil {
			set = make(map[string]int64)
			m.sets[op.Key] = set
		}
		set[op.Holder] = t + int64(op.TTL)
		res[i].InFlight = int64(len(set))
	}
	return nil
}

// Free implements ReservationStore.
func (m *MemoryStore) Free(ctx context.Context, now time.Time, ops []SlotOp) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	for _, op := range ops {
		if set := m.sets[op.Key]; set != nil {
			delete(set, op.Holder)
			if len(set) == 0 {
				delete(m.sets, op.Key)
			}
		}
	}
	return nil
}

// errNoCharge is returned when the store cannot charge below zero.
var errNoCharge = errors.New("regional: the store cannot charge below zero")

// chargeItems charges each item's hits to its limits even below zero:
// local limits in the engine, leased and exact ones in the store's
// buckets (ReservationStore.Charge). It reports their state in dec. A
// charge the store does not take is lost, and returned as an error after
// the rest is charged: it only over-admits, by that charge.
func (f *Enforcer) chargeItems(ctx context.Context, now time.Time, domain string, items []Item, dec *allot.Decision) error {
	ds := f.engine.cfg.Load().domain(domain)
	if ds == nil || !ds.stored {
		return f.engine.do(now, domain, items, opForce, dec)
	}
	ws, err := f.engine.plan(now, domain, items, opForce, dec, nil)
	if err != nil || len(ws) == 0 {
		return err
	}
	r := request{f: f, parent: ctx, now: now, domain: domain, items: items}
	r.ctx, r.cancel = context.WithTimeout(ctx, f.background())
	defer r.release()
	d := decision{r: &r, t: now.UnixNano(), ws: ws, sts: dec.Statuses, steps: route(ws, nil, now.UnixNano())}
	if d.only(byEngine, false) > 0 {
		f.engine.table.run(d.t, items, ws, dec.Statuses, opForce)
	}
	var ops []TakeOp
	for i := range ws {
		if d.steps[i].kind != byEngine && !ws[i].ls.l.Unlimited {
			ops = append(ops, TakeOp{Bucket: d.bucket(i), Cost: ws[i].cost})
		}
	}
	if len(ops) > 0 {
		res := make([]TakeResult, len(ops))
		cs, ok := f.store.(ReservationStore)
		if ok {
			err = cs.Charge(d.deadline(), now, ops, res)
		} else {
			err = f.store.Take(d.deadline(), now, ops, res) // charged only if it fits
			for j := range res {
				if err == nil && !res[j].Allowed {
					err = errNoCharge
				}
			}
		}
		j := 0
		for i := range ws {
			if d.steps[i].kind == byEngine || ws[i].ls.l.Unlimited {
				continue
			}
			if st := f.stats(domain, ws[i].ls); err != nil {
				st.failed(f.log, ws[i].ls.l, err, d.t)
				f.lost(d.t)
			} else {
				st.reached(f.log)
				f.found(d.t)
				dec.Statuses[i].Remaining = int64(res[j].Remaining)
				dec.Statuses[i].ResetAfter = res[j].ResetAfter
			}
			j++
		}
	}
	fold(dec)
	if err != nil {
		return fmt.Errorf("charge in the regional store: %w", err)
	}
	return nil
}

// slotStore is the store that keeps the concurrency slots of limit l, or
// nil when they are kept in memory.
func (rs *Reservations) slotStore(l *allot.Limit) ReservationStore {
	if rs.enf == nil || l.Enforcement == allot.Local {
		return nil
	}
	cs, _ := rs.enf.store.(ReservationStore)
	return cs
}

// acquire takes a concurrency slot on every key of ws whose limit has a
// concurrency cap, for reservation id: all or none. It returns the slots
// held, or the index in ws of a limit that rejected (-1 if none) and when
// to retry.
func (rs *Reservations) acquire(ctx context.Context, now time.Time, domain string, items []Item, ws []work, id string, ttl time.Duration) (held []heldSlot, rejected int, retry time.Duration, err error) {
	var mem, stored []int
	seen := make(map[uint64]bool)
	for i, w := range ws {
		if l := w.ls.l; l.Concurrency <= 0 || l.Unlimited || l.Shadow || seen[w.key] {
			continue
		}
		seen[w.key] = true
		if rs.slotStore(w.ls.l) != nil {
			stored = append(stored, i)
		} else {
			mem = append(mem, i)
		}
	}
	if len(mem) == 0 && len(stored) == 0 {
		return nil, -1, 0, nil
	}
	caps := make(map[int]int64, len(mem))
	for _, i := range mem {
		caps[i] = ws[i].ls.l.Concurrency
	}
	if len(stored) > 0 {
		ops := make([]SlotOp, len(stored))
		for j, i := range stored {
			ops[j] = SlotOp{Key: domain + "/" + KeyString(ws[i].ls.l, items[ws[i].item].Descriptor),
				Cap: ws[i].ls.l.Concurrency, Holder: id, TTL: ttl}
		}
		res := make([]SlotResult, len(ops))
		cctx, cancel := context.WithTimeout(ctx, rs.enf.opts.StoreTimeout)
		err := rs.slotStore(ws[stored[0]].ls.l).Acquire(cctx, now, ops, res)
		cancel()
		if err == nil {
			for j, i := range stored {
				rs.enf.stats(domain, ws[i].ls).reached(rs.enf.log)
				if !res[j].Allowed {
					return nil, i, min(max(res[j].RetryAfter, time.Millisecond), DefaultConcurrencyRetry), nil
				}
			}
			for j := range stored {
				held = append(held, heldSlot{store: ops[j].Key})
			}
		} else {
			// The store did not answer: each limit's on_failure decides.
			for _, i := range stored {
				l := ws[i].ls.l
				rs.enf.stats(domain, ws[i].ls).failed(rs.enf.log, l, err, now.UnixNano())
				switch l.OnFailure {
				case allot.FailOpen:
				case allot.FailClosed:
					return nil, i, closedRetryAfter, nil
				default: // local: this instance's part of the cap, in memory
					mem = append(mem, i)
					caps[i] = max(1, int64(math.Ceil(float64(l.Concurrency)/float64(rs.enf.Instances()))))
				}
			}
		}
	}
	if len(mem) > 0 {
		rs.slotMu.Lock()
		for _, i := range mem {
			if rs.slots[ws[i].key] >= caps[i] {
				rs.slotMu.Unlock()
				rs.free(ctx, now, id, held) // the store's, if any
				return nil, i, DefaultConcurrencyRetry, nil
			}
		}
		for _, i := range mem {
			rs.slots[ws[i].key]++
			held = append(held, heldSlot{key: ws[i].key})
		}
		rs.slotMu.Unlock()
	}
	return held, -1, 0, nil
}

// free gives concurrency slots back. Slots the store does not free
// expire with their reservation's TTL.
func (rs *Reservations) free(ctx context.Context, now time.Time, id string, slots []heldSlot) {
	var ops []SlotOp
	rs.slotMu.Lock()
	for _, s := range slots {
		if s.store != "" {
			ops = append(ops, SlotOp{Key: s.store, Holder: id})
			continue
		}
		if rs.slots[s.key] <= 1 {
			delete(rs.slots, s.key)
		} else {
			rs.slots[s.key]--
		}
	}
	rs.slotMu.Unlock()
	if len(ops) == 0 {
		return
	}
	cs, _ := rs.enf.store.(ReservationStore)
	cctx, cancel := context.WithTimeout(ctx, rs.enf.background())
	defer cancel()
	if err := cs.Free(cctx, now, ops); err != nil {
		rs.stats.storeFailures.Add(1)
	}
}
