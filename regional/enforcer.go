package regional

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot"
)

// Defaults of EnforcerOptions.
const (
	DefaultStoreTimeout = 5 * time.Millisecond
	DefaultLeaseTTL     = time.Second
	DefaultHeartbeat    = time.Second
)

// closedRetryAfter is the RetryAfter of a rejection by on_failure: closed.
const closedRetryAfter = time.Second

// EnforcerOptions configure an Enforcer.
type EnforcerOptions struct {
	// Region and Instance name this process among the instances that share
	// the store; Instance must be unique in the region.
	Region, Instance string
	// StoreTimeout bounds every store call on the request path; 0 means
	// DefaultStoreTimeout. Background calls (returns, heartbeats) get ten
	// times as long, at least 100ms.
	StoreTimeout time.Duration
	// LeaseTTL is how long a lease's tokens may be spent before the unused
	// ones go back; 0 means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Heartbeat is how often Tick renews this instance's membership; an
	// instance silent for three heartbeats no longer counts. 0 means
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// FallbackMaxKeys bounds the in-process buckets of on_failure: local;
	// 0 means DefaultMaxKeys.
	FallbackMaxKeys int
	// Logger receives fallback transitions and membership changes; nil
	// discards.
	Logger *slog.Logger
}

// Enforcer decides requests whose limits are leased or exact with a Store
// that the instances of the region share, and their local limits with the
// Engine. A domain without leased or exact limits goes straight to the
// Engine.
//
// A request is charged on all of its limits or none. The Enforcer charges
// the cheapest first: local limits in the engine, then leased limits from
// this instance's leases, then exact limits in one Store.Take (which is
// all-or-nothing across its keys). When a later one rejects, the earlier
// charges, all in memory, are given back.
//
// When the store fails (an error, its deadline, an open breaker), each
// limit follows its on_failure policy: open admits, closed rejects, local
// decides in an in-process bucket of share ÷ instances. A sliding window
// in local fallback spends only what the store may have left: nothing
// more in the window the fallback began in (the store's count of it is
// not known here), and once the fallback admitted in a window, the store
// is not asked again before the window ends (its count does not hold
// what the fallback admitted). A token bucket or GCRA key in fallback
// is empty when the fallback began and refills from there (the store's
// bucket may have been empty), and when the store decides the key again,
// it is first charged what the fallback bucket owes (the least of what
// it lacked of full and what it may have admitted: the store's bucket
// refilled meanwhile without knowing what the fallback admitted): over
// any interval T, an instance alone in its region admits
// at most B + r·T of its region's share. The fallback is logged when a
// limit enters and leaves it, and counted in Stats.
//
// The driver calls Tick every few hundred milliseconds (it renews
// membership and returns expired leases) and Close at shutdown. An
// Enforcer is safe for concurrent use; the zero value is not usable, call
// NewEnforcer.
type Enforcer struct {
	engine    *Engine
	store     Store
	opts      EnforcerOptions
	log       *slog.Logger
	fallback  *table
	fbUntil   atomic.Int64 // the latest limitStats.fbUntil
	leases    [numShards]leaseShard
	limits    sync.Map // *limitShares → *limitStats
	instances atomic.Int64
	// beatFailed says a heartbeat failed since the last one that reached
	// the store; countHeld, until when a count lower than the one held is
	// not taken (the instances that could not renew during an outage
	// come back within a heartbeat). Guarded by mu.
	beatFailed bool
	countHeld  int64
	// down says a store call failed since the last one that reached it:
	// since downAt; back is when one reached it after a failure (unix ns;
	// a fallback begins at the later of its limit's and downAt; repay).
	down         atomic.Bool
	downAt, back atomic.Int64

	mu       sync.Mutex // serialises Tick and Close
	nextBeat time.Time
}

// NewEnforcer returns an Enforcer deciding with engine and store.
func NewEnforcer(engine *Engine, store Store, opts EnforcerOptions) *Enforcer {
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = DefaultStoreTimeout
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.FallbackMaxKeys <= 0 {
		opts.FallbackMaxKeys = DefaultMaxKeys
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Enforcer{engine: engine, store: store, opts: opts, log: opts.Logger.With("region", opts.Region), fallback: newTable(opts.FallbackMaxKeys)}
	f.instances.Store(1)
	return f
}

// Engine returns the engine the Enforcer decides local limits with.
func (f *Enforcer) Engine() *Engine { return f.engine }

// Instances is the number of live instances of the region at the last
// heartbeat that reached the store (1 before the first). After heartbeats
// failed, a lower count is taken only once the others have had a
// membership's lifetime to renew: right after an outage the store holds
// only the instances that renewed first, and a fallback dividing the
// share by that count would give each of them too much.
func (f *Enforcer) Instances() int { return int(f.instances.Load()) }

// lost records that a store call failed at now (unix ns).
func (f *Enforcer) lost(now int64) {
	if !f.down.Load() && f.down.CompareAndSwap(false, true) {
		f.downAt.Store(now)
	}
}

// found records that a store call reached the store at now (unix ns).
func (f *Enforcer) found(now int64) {
	if f.down.Load() && f.down.CompareAndSwap(true, false) {
		f.back.Store(now)
	}
}

// CheckItems decides a request as Engine.CheckItems does, with leased and
// exact limits kept in the store. Store calls are bounded by
// StoreTimeout within ctx. Statuses of store-backed limits that were not
// consulted, because an earlier limit rejected, say Allowed with no state.
func (f *Enforcer) CheckItems(ctx context.Context, now time.Time, domain string, items []Item, dec *allot.Decision) error {
	ds := f.engine.cfg.Load().domain(domain)
	if ds == nil || !ds.stored {
		return f.engine.CheckItems(now, domain, items, dec)
	}
	var inline [maxInline]work
	ws, err := f.engine.plan(now, domain, items, opCheck, dec, inline[:0])
	if err != nil || len(ws) == 0 {
		return err
	}
	var steps [maxInline]step
	r := request{f: f, parent: ctx, now: now, domain: domain, items: items}
	defer r.release()
	d := decision{r: &r, t: now.UnixNano(), ws: ws, sts: dec.Statuses, steps: route(ws, steps[:0], now.UnixNano())}
	d.run()
	fold(dec)
	return nil
}

// RefundItems gives each item's hits back to its limits, as
// Engine.RefundItems does: local limits in the engine, leased and exact
// ones in the store (in one call), and reports their state in dec. A
// refund the store does not take is lost, as a refund of a check that
// fell back: it only under-admits.
func (f *Enforcer) RefundItems(ctx context.Context, now time.Time, domain string, items []Item, dec *allot.Decision) error {
	ds := f.engine.cfg.Load().domain(domain)
	if ds == nil || !ds.stored {
		return f.engine.RefundItems(now, domain, items, dec)
	}
	ws, err := f.engine.plan(now, domain, items, opRefund, dec, nil)
	if err != nil || len(ws) == 0 {
		return err
	}
	r := request{f: f, parent: ctx, now: now, domain: domain, items: items}
	defer r.release()
	d := decision{r: &r, t: now.UnixNano(), ws: ws, sts: dec.Statuses, steps: route(ws, nil, now.UnixNano())}
	if d.only(byEngine, false) > 0 {
		f.engine.table.run(d.t, items, ws, dec.Statuses, opRefund)
	}
	var ops []LeaseOp
	for i := range ws {
		if d.steps[i].kind != byEngine {
			ops = append(ops, LeaseOp{Bucket: d.bucket(i), Return: ws[i].cost})
		}
	}
	if len(ops) > 0 {
		res := make([]LeaseResult, len(ops))
		err := f.store.Lease(d.deadline(), now, ops, res)
		j := 0
		for i := range ws {
			if d.steps[i].kind == byEngine {
				continue
			}
			if st := f.stats(domain, ws[i].ls); err != nil {
				st.failed(f.log, ws[i].ls.l, err, d.t)
				f.lost(d.t)
			} else {
				st.reached(f.log)
				f.found(d.t)
				dec.Statuses[i].Remaining = int64(res[j].Available)
			}
			j++
		}
	}
	fold(dec)
	return nil
}

// kind is where one work of a request is decided.
type kind uint8

const (
	byEngine   kind = iota // a local limit: the engine's table
	byLease                // leased: this instance's lease
	byStore                // exact (and a leased check of 0 hits): one Store.Take
	byFallback             // store failed, on_failure local: still to decide
	fellBack               // decided in the fallback table
	byPolicy               // store failed, on_failure open or closed
)

// step is the Enforcer's part of a work.
type step struct {
	kind    kind
	charged bool   // holds its cost: give it back if the request is rejected
	base    params // the key's limit before the share (table.run scales w.p)
	p       params // after the share
}

// decision is one request on its way through the Enforcer.
type decision struct {
	r     *request
	t     int64 // r.now in unix ns
	ws    []work
	sts   []allot.LimitStatus
	steps []step
}

// request is what the store calls of a decision need, in a struct of its
// own so that what escapes with them (the context, the domain) does not
// take the decision's inline arrays along: a decision from memory does
// not allocate.
type request struct {
	f      *Enforcer
	parent context.Context
	ctx    context.Context // parent with StoreTimeout, made on first use
	cancel context.CancelFunc
	now    time.Time
	domain string
	items  []Item
}

func (d *decision) deadline() context.Context {
	r := d.r
	if r.ctx == nil {
		r.ctx, r.cancel = context.WithTimeout(r.parent, r.f.opts.StoreTimeout)
	}
	return r.ctx
}

func (r *request) release() {
	if r.cancel != nil {
		r.cancel()
	}
}

// route says where each work is decided, at now (unix ns). A work of
// the store gets the share a check may use (shareHist.forCheck): a
// sliding window's share raised within a window counts from the next
// one, as in the engine, since the region that gave it up may already
// have spent its part of this window in its own store.
func route(ws []work, steps []step, now int64) []step {
	for i := range ws {
		w := &ws[i]
		s := step{base: w.p}
		switch l := w.ls.l; {
		case l.Unlimited || l.Enforcement == allot.Local || decidedInEngine(w):
		case l.Enforcement == allot.Leased && w.cost > 0:
			s.kind = byLease
		default:
			s.kind = byStore
		}
		if s.kind != byEngine {
			s.p = w.p.scaled(w.ls.shares.hist(w.key).forCheck(w.p, now))
		}
		steps = append(steps, s)
	}
	return steps
}

func (d *decision) run() {
	d.stayInFallback()
	admit := d.inEngine() && d.repay() && d.fromLeases() && d.inFallback() && d.inStore() && d.inFallback()
	if !admit {
		d.undo()
	}
	d.count(admit)
}

// raiseTo raises v to at least x.
func raiseTo(v *atomic.Int64, x int64) {
	for old := v.Load(); old < x && !v.CompareAndSwap(old, x); old = v.Load() {
	}
}

// stayInFallback decides in the fallback table the works of the store
// whose limit's fallback admitted in this window of a sliding window:
// the store's count of the window does not hold what it admitted.
func (d *decision) stayInFallback() {
	if d.t >= d.r.f.fbUntil.Load() {
		return // no limit's fallback admitted in a window still open
	}
	for i := range d.ws {
		s := &d.steps[i]
		if s.kind != byStore && s.kind != byLease {
			continue
		}
		w := &d.ws[i]
		if ls := d.r.f.stats(d.r.domain, w.ls); d.t < ls.fbUntil.Load() && w.ls.l.OnFailure == allot.FailLocal && w.p.alg == allot.SlidingWindow {
			s.kind = byFallback
		}
	}
}

// repay charges the store, for each token bucket or GCRA key about to be
// decided there again, what its fallback bucket owes (table.owes: the
// least of what it lacked of full and what it may have admitted): the
// store's bucket refilled during the fallback without knowing what the
// fallback admitted. A
// ReservationStore is charged even below empty (what the others spent
// meanwhile is then waited for); another Store gives what it holds, as a
// lease that is not spent. The key's fallback state goes once the charge is made
// (what a concurrent fallback decision of the key charged meanwhile goes
// with it); when the call fails, the works fall back again.
func (d *decision) repay() bool {
	if d.t >= d.r.f.fbUntil.Load() {
		return true
	}
	var ops []LeaseOp
	var at []int
	var ps []params
	for i := range d.ws {
		w, s := &d.ws[i], &d.steps[i]
		if s.kind != byStore && s.kind != byLease || w.p.alg == allot.SlidingWindow || w.ls.l.OnFailure != allot.FailLocal {
			continue
		}
		ls := d.r.f.stats(d.r.domain, w.ls)
		if d.t >= ls.fbUntil.Load() {
			continue // its fallback buckets are full again
		}
		p := d.fallbackParams(i)
		p = p.scaled(w.ls.shares.hist(w.key).forCheck(p, d.t)) // as the fallback table runs it
		if owed := d.r.f.fallback.owes(w.key, d.t, p, false); owed > 0 {
			ops, at, ps = append(ops, LeaseOp{Bucket: d.bucket(i), Want: owed}), append(at, i), append(ps, p)
		}
	}
	if len(ops) == 0 {
		return true
	}
	var err error
	if cs, ok := d.r.f.store.(interface {
		Charge(context.Context, time.Time, []TakeOp, []TakeResult) error
	}); ok { // ReservationStore's Charge
		charges := make([]TakeOp, len(ops))
		for j, op := range ops {
			charges[j] = TakeOp{Bucket: op.Bucket, Cost: op.Want}
		}
		err = cs.Charge(d.deadline(), d.r.now, charges, make([]TakeResult, len(ops)))
	} else {
		err = d.r.f.store.Lease(d.deadline(), d.r.now, ops, make([]LeaseResult, len(ops)))
	}
	if err == nil {
		d.r.f.found(d.t)
	}
	for j, i := range at {
		if err != nil {
			d.failed(i, err)
		} else {
			d.r.f.fallback.owes(d.ws[i].key, d.t, ps[j], true)
		}
	}
	return true
}

// only leaves in the works of kind k (with charged, only those holding
// their cost) for a table.run, each with its limit before the share (÷
// instances in the fallback table), and returns how many there are.
func (d *decision) only(k kind, charged bool) int {
	n := 0
	for i := range d.ws {
		w, s := &d.ws[i], &d.steps[i]
		w.skip = s.kind != k || w.ls.l.Unlimited || charged && !s.charged
		if w.skip {
			continue
		}
		n++
		w.p = s.base
		if k == byFallback || k == fellBack {
			w.p = d.fallbackParams(i)
		}
		for w.same >= 0 && d.ws[w.same].skip { // chain only the works of this run
			w.same = d.ws[w.same].same
		}
	}
	return n
}

// fallbackParams is work i's limit in the fallback table, before the
// share: the instance's part of it, and when the latest fallback began
// and the store was last back.
func (d *decision) fallbackParams(i int) params {
	f := d.r.f
	p := d.steps[i].base.scaled(1 / float64(f.Instances()))
	p.spentAt = max(f.stats(d.r.domain, d.ws[i].ls).fbSince.Load(), f.downAt.Load())
	p.backAt = f.back.Load()
	return p
}

// rejects reports whether a non-shadow work of kind k rejected.
func (d *decision) rejects(k kind) bool {
	for i := range d.sts {
		if d.steps[i].kind == k && !d.sts[i].Allowed && !d.sts[i].Shadow {
			return true
		}
	}
	return false
}

func (d *decision) inEngine() bool {
	if d.only(byEngine, false) == 0 {
		return true
	}
	d.r.f.engine.table.run(d.t, d.r.items, d.ws, d.sts, opTrial)
	if d.rejects(byEngine) {
		return false
	}
	for i := range d.ws {
		d.steps[i].charged = !d.ws[i].skip && d.sts[i].Allowed
	}
	return true
}

func (d *decision) fromLeases() bool {
	for i := range d.ws {
		if d.steps[i].kind != byLease {
			continue
		}
		o, err := d.spend(i)
		if err != nil {
			d.failed(i, err)
			continue
		}
		d.r.f.stats(d.r.domain, d.ws[i].ls).reached(d.r.f.log)
		d.r.f.found(d.t)
		report(&d.sts[i], o)
		d.steps[i].charged = o.allowed
		if !o.allowed && !d.ws[i].ls.l.Shadow {
			return false
		}
	}
	return true
}

// inStore charges the exact limits in one Store.Take.
func (d *decision) inStore() bool {
	var ops []TakeOp
	for i := range d.ws {
		if d.steps[i].kind == byStore {
			w := &d.ws[i]
			ops = append(ops, TakeOp{Bucket: d.bucket(i), Cost: w.cost, Shadow: w.ls.l.Shadow})
		}
	}
	if len(ops) == 0 {
		return true
	}
	res := make([]TakeResult, len(ops))
	err := d.r.f.store.Take(d.deadline(), d.r.now, ops, res)
	j := 0
	for i := range d.ws {
		if d.steps[i].kind != byStore {
			continue
		}
		if err != nil {
			d.failed(i, err)
			continue
		}
		d.r.f.stats(d.r.domain, d.ws[i].ls).reached(d.r.f.log)
		d.r.f.found(d.t)
		r, st := &res[j], &d.sts[i]
		j++
		st.Allowed, st.Remaining = r.Allowed, int64(math.Floor(r.Remaining))
		st.ResetAfter, st.RetryAfter = r.ResetAfter, r.RetryAfter
	}
	return !d.rejects(byStore) && !d.rejects(byPolicy)
}

// failed applies the on_failure policy of work i, whose store call failed.
func (d *decision) failed(i int, err error) {
	w, s, st := &d.ws[i], &d.steps[i], &d.sts[i]
	ls := d.r.f.stats(d.r.domain, w.ls)
	ls.failed(d.r.f.log, w.ls.l, err, d.t)
	d.r.f.lost(d.t)
	switch w.ls.l.OnFailure {
	case allot.FailOpen:
		s.kind, st.Allowed = byPolicy, true
		ls.decided(true)
	case allot.FailClosed:
		s.kind, st.Allowed, st.RetryAfter = byPolicy, false, closedRetryAfter
		ls.decided(false)
	default:
		s.kind = byFallback
	}
}

// inFallback decides, together, the works whose store call failed under
// on_failure: local, in the fallback table, and applies the rejections of
// on_failure: closed.
func (d *decision) inFallback() bool {
	if d.only(byFallback, false) > 0 {
		d.r.f.fallback.run(d.t, d.r.items, d.ws, d.sts, opTrial)
		admit := !d.rejects(byFallback)
		for i := range d.ws {
			if s := &d.steps[i]; s.kind == byFallback {
				s.kind, s.charged = fellBack, admit && d.sts[i].Allowed
				ls := d.r.f.stats(d.r.domain, d.ws[i].ls)
				ls.decided(d.sts[i].Allowed)
				if !s.charged {
					continue
				}
				// A sliding window: the store may not be asked before the
				// window ends (stayInFallback). A bucket: until it is full
				// again, the store is charged what it lacks (repay).
				end := d.t + int64(d.sts[i].ResetAfter)
				if p := d.ws[i].p; p.alg == allot.SlidingWindow {
					end = d.t - d.t%p.period + p.period
				}
				raiseTo(&ls.fbUntil, end)
				raiseTo(&d.r.f.fbUntil, end)
			}
		}
		if !admit {
			return false
		}
	}
	return !d.rejects(byPolicy)
}

// undo gives back what a rejected request holds: lease tokens, and the
// charges of the engine's and the fallback table's buckets.
func (d *decision) undo() {
	for i := range d.ws {
		if s := &d.steps[i]; s.kind == byLease && s.charged {
			d.r.f.unspend(d.ws[i].key, d.ws[i].cost)
		}
	}
	if d.only(byEngine, true) > 0 {
		d.r.f.engine.table.run(d.t, d.r.items, d.ws, d.sts, opRefund)
	}
	if d.only(fellBack, true) > 0 {
		d.r.f.fallback.run(d.t, d.r.items, d.ws, d.sts, opRefund)
	}
}

// count adds the request to the engine's demand, for the coordinator.
func (d *decision) count(admitted bool) {
	t := d.r.f.engine.table
	for i := range d.ws {
		w, s := &d.ws[i], &d.steps[i]
		if w.ls.l.Unlimited || s.kind == byPolicy && !d.sts[i].Allowed {
			continue
		}
		w.p = s.p
		if s.kind == byEngine {
			w.p = s.base.scaled(w.ls.shares.hist(w.key).current())
		}
		sh := &t.shards[shardOf(w.key)]
		sh.mu.Lock()
		t.count(d.r.items, w, &d.sts[i], admitted)
		sh.mu.Unlock()
	}
}

// bucket is work i's bucket in the store.
func (d *decision) bucket(i int) Bucket {
	w, p := &d.ws[i], d.steps[i].p
	return Bucket{
		Key:       d.r.domain + "/" + KeyString(w.ls.l, d.r.items[w.item].Descriptor),
		Algorithm: p.alg, Amount: p.amount, Burst: p.burst, Period: time.Duration(p.period),
	}
}

// background bounds the store calls of Tick and Close.
func (f *Enforcer) background() time.Duration {
	return max(10*f.opts.StoreTimeout, 100*time.Millisecond)
}

// Tick renews this instance's membership when a heartbeat is due, gives
// back the unused tokens of expired leases and drops idle fallback
// buckets. The driver calls it every few hundred milliseconds.
func (f *Enforcer) Tick(ctx context.Context, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !now.Before(f.nextBeat) {
		f.nextBeat = now.Add(f.opts.Heartbeat)
		f.heartbeat(ctx, now, 3*f.opts.Heartbeat)
	}
	f.returnLeases(ctx, now, false)
	// A bucket that was not full when the store was back is kept until
	// its key repays (repay), even once full again: what it lacked then
	// is owed. While the store is down, a full one owes nothing.
	owedFrom := f.back.Load()
	if f.down.Load() {
		owedFrom = math.MaxInt64
	}
	for i := range f.fallback.shards {
		sh := &f.fallback.shards[i]
		sh.mu.Lock()
		sh.sweepOwed(now.UnixNano(), owedFrom)
		sh.mu.Unlock()
	}
}

// Close gives back every lease's unused tokens and leaves the region's
// membership. Call it at shutdown, after the last check.
func (f *Enforcer) Close(ctx context.Context, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.returnLeases(ctx, now, true), f.heartbeat(ctx, now, 0))
}

// heartbeat records this instance as live for ttl (leaves with 0) and
// takes the region's instance count from the answer. When the store does
// not answer, the last count stays: it is what on_failure: local divides
// by while the store is down.
func (f *Enforcer) heartbeat(ctx context.Context, now time.Time, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, f.background())
	defer cancel()
	n, err := f.store.Heartbeat(ctx, now, f.opts.Region, f.opts.Instance, ttl)
	if err != nil {
		f.log.Debug("heartbeat failed; keeping the last instance count", "instances", f.Instances(), "err", err)
		f.beatFailed = true
		f.lost(now.UnixNano())
		return err
	}
	f.found(now.UnixNano())
	if f.beatFailed { // the store is back: the others renew within a heartbeat
		f.beatFailed, f.countHeld = false, now.UnixNano()+int64(ttl)
	}
	c := int64(max(n, 1))
	if ttl > 0 && c < f.instances.Load() && now.UnixNano() < f.countHeld {
		return nil // fewer only because the others could not renew yet: a fallback would count them out
	}
	if ttl > 0 && c != f.instances.Swap(c) {
		f.log.Info("instances of the region changed", "instances", n)
	}
	return nil
}

// EnforcerStats are an Enforcer's counters.
type EnforcerStats struct {
	Instances int          // live instances of the region, as last seen
	Limits    []LimitStats // one per store-backed limit that saw traffic, by domain and name
}

// LimitStats count one store-backed limit's dealings with the store.
type LimitStats struct {
	Domain, Limit string
	// Fallback says the limit's last store call failed: it follows its
	// on_failure policy until a call succeeds.
	Fallback                          bool
	FallbackAllowed, FallbackRejected uint64 // decisions made by on_failure
	// LeaseGrants counts leases taken; LeaseExpirations, leases whose
	// unused tokens went back when they expired; LeaseReturns, every
	// give-back (expiry or shutdown).
	LeaseGrants, LeaseReturns, LeaseExpirations uint64
	TokensGranted, TokensReturned               uint64
}

// Stats returns the Enforcer's counters.
func (f *Enforcer) Stats() EnforcerStats {
	s := EnforcerStats{Instances: f.Instances()}
	f.limits.Range(func(_, v any) bool {
		l := v.(*limitStats)
		s.Limits = append(s.Limits, LimitStats{
			Domain: l.domain, Limit: l.limit, Fallback: l.fallback.Load(),
			FallbackAllowed: l.fallbackAllowed.Load(), FallbackRejected: l.fallbackRejected.Load(),
			LeaseGrants: l.grants.Load(), LeaseReturns: l.returns.Load(), LeaseExpirations: l.expirations.Load(),
			TokensGranted: l.granted.Load(), TokensReturned: l.returned.Load(),
		})
		return true
	})
	slices.SortFunc(s.Limits, func(a, b LimitStats) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Limit, b.Limit))
	})
	return s
}

// limitStats are LimitStats as they are counted.
type limitStats struct {
	domain, limit string
	fallback      atomic.Bool
	// fbSince is when the latest fallback began (params.spentAt); fbUntil,
	// the end of the latest window of a sliding window in which the
	// fallback admitted: the store, which does not know what it admitted,
	// is not asked again before then.
	fbSince, fbUntil                  atomic.Int64
	logged                            atomic.Bool  // a warning was logged, its all-clear not yet
	loggedAt                          atomic.Int64 // unix ns of the last warning
	fallbackAllowed, fallbackRejected atomic.Uint64
	grants, returns, expirations      atomic.Uint64
	granted, returned                 atomic.Uint64
}

func (f *Enforcer) stats(domain string, ls *limitState) *limitStats {
	if v, ok := f.limits.Load(ls.shares); ok {
		return v.(*limitStats)
	}
	v, _ := f.limits.LoadOrStore(ls.shares, &limitStats{domain: domain, limit: ls.l.Name})
	return v.(*limitStats)
}

// logEvery spaces the fallback logs of one limit, so that a flapping store
// does not flood the log: at most a warning and its all-clear per period.
const logEvery = 10 * time.Second

// failed marks the limit as falling back, and logs it when it starts.
func (s *limitStats) failed(log *slog.Logger, l *allot.Limit, err error, now int64) {
	if s.fallback.Load() {
		return
	}
	s.fbSince.Store(now) // before the flag: a fallback decision never takes an earlier start
	if !s.fallback.CompareAndSwap(false, true) {
		return
	}
	if now-s.loggedAt.Load() >= int64(logEvery) && s.logged.CompareAndSwap(false, true) {
		s.loggedAt.Store(now)
		log.Warn("regional store unreachable: the limit follows its on_failure policy",
			"domain", s.domain, "limit", s.limit, "on_failure", l.OnFailure.String(), "err", err)
	}
}

// reached ends the limit's fallback, and logs it if its start was.
func (s *limitStats) reached(log *slog.Logger) {
	if s.fallback.Load() && s.fallback.CompareAndSwap(true, false) && s.logged.CompareAndSwap(true, false) {
		log.Info("regional store reachable again: the limit is enforced with it", "domain", s.domain, "limit", s.limit)
	}
}

func (s *limitStats) decided(allowed bool) {
	if allowed {
		s.fallbackAllowed.Add(1)
	} else {
		s.fallbackRejected.Add(1)
	}
}
