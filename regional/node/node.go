package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
)

// Options configure a Node.
type Options struct {
	// Region and Instance name the instance; Instance must be unique in
	// the region and kept across reconnects (a restarted process is a new
	// instance).
	Region, Instance string
	Engine           *regional.Engine
	// Counts, when set, is the CountStore the region's instances share:
	// the region's shared-mode slot is the sum over them. nil: this
	// instance is its region's only one.
	Counts regional.CountStore
	// Marks, when set, is where the instance persists the counts of its
	// long windows (regional.PersistOptions): New turns the engine's gate
	// on, Restore takes what an earlier process of the instance saved,
	// Persist saves. Set it only for an instance whose id is stable
	// across restarts (its certificate's): a new id has nothing to
	// restore. nil: no persistence, a restarted instance starts its
	// windows with nothing.
	Marks regional.MarkStore
	// Persist configures the persistence (with Marks).
	Persist regional.PersistOptions
}

// Node is one enforcer instance's core. Safe for concurrent use; the zero
// value is not usable, call New.
type Node struct {
	region, id string
	e          *regional.Engine
	counts     regional.CountStore
	marks      regional.MarkStore
	pmu        sync.Mutex // serialises Persist: snapshots are written in order

	mu    sync.Mutex
	links map[string]*coordinator.Instance // by domain; set by Link
	at    time.Time                        // At of the latest report
	clock coordinator.ClockSync            // the offset from the coordinators' clock
	// wanting are the shares (domain, limit, key) whose latest want acked
	// was above 0: one that wants nothing is acked as such only if it was
	// among them.
	wanting map[[3]string]bool

	// offset and skew are the clock's estimate (ns), read on every request.
	offset, skew atomic.Int64

	// last are, by domain, the latest reports Reports made, which a new
	// stream sends again after its hello (LastReport).
	last map[string]coordinator.Report

	rmu      sync.Mutex
	received []regional.Batch // peers' batches since the last merge (with Counts)
}

// maxWanting bounds Node.wanting.
const maxWanting = 4096

// maxReceived bounds the peers' batches kept for a CountStore that does
// not answer.
const maxReceived = 4096

// New returns the Node of an instance.
func New(o Options) (*Node, error) {
	if o.Engine == nil || o.Region == "" || o.Instance == "" {
		return nil, errors.New("node: Engine, Region and Instance are required")
	}
	if o.Marks != nil {
		o.Engine.EnablePersistence(o.Persist)
	}
	n := &Node{region: o.Region, id: o.Instance, e: o.Engine, counts: o.Counts, marks: o.Marks}
	n.skew.Store(-1)
	return n, nil
}

// Restore takes, before the instance serves (and before Link's first
// grant), the marks an earlier process of this instance persisted for
// the windows in progress at now: their counts are spent, and the share
// the coordinator's first grant puts before its since is the least one
// in force before the restart. It returns how many limits' records it
// found; without Marks it does nothing. When the store fails nothing is
// restored: the windows start with nothing, as without persistence; an
// error of the engine names the keys it left out, the rest restored.
func (n *Node) Restore(ctx context.Context, now time.Time) (int, error) {
	if n.marks == nil {
		return 0, nil
	}
	want := n.e.Persisted(now)
	if len(want) == 0 {
		return 0, nil
	}
	got, err := n.marks.LoadMarks(ctx, n.id, want)
	if err != nil {
		return 0, fmt.Errorf("node: restore: %w", err)
	}
	return len(got), n.e.Restore(now, got) // an error names what it left out
}

// Persist writes the marks the engine asks for at now and, once written,
// raises them (one persistence interval: call it every
// PersistOptions.Interval). It returns how many keys' marks it wrote;
// without Marks it does nothing. A failed write raises nothing: those
// keys stay held at their marks and are written again next time.
func (n *Node) Persist(ctx context.Context, now time.Time) (int, error) {
	if n.marks == nil {
		return 0, nil
	}
	n.pmu.Lock()
	defer n.pmu.Unlock()
	snap := n.e.Snapshot(now)
	if snap == nil {
		return 0, nil
	}
	if err := n.marks.SaveMarks(ctx, now, n.id, snap.Marks); err != nil {
		return 0, fmt.Errorf("node: persist: %w", err)
	}
	n.e.AckSnapshot(snap)
	keys := 0
	for _, m := range snap.Marks {
		keys += len(m.Keys)
	}
	return keys, nil
}

// Engine returns the instance's engine.
func (n *Node) Engine() *regional.Engine { return n.e }

// Region returns the instance's region.
func (n *Node) Region() string { return n.region }

// WindowGuard is the engine's window guard (regional.Engine.SetWindowGuard)
// of an instance whose clock is measured within half of it of the
// coordinator's: a sliding window's share changes made past its first
// 500 ms count from the next window, so that share moving between
// regions mid-window is neither lost nor spent twice. An instance whose
// error is unknown (no echo yet, or none for 5 minutes) or larger keeps
// the guard at 0: its windows use the least share in force since they
// began.
const WindowGuard = 500 * time.Millisecond

// Now converts a reading of the instance's clock into the coordinator's
// time, which the engine runs on: its windows are cut on it, so that
// every instance of every region cuts them at the same instants (within
// Skew). Until an assignment echoes its hello or a report, it returns
// local as it is. Every engine call of the instance takes it: the peer
// sync, the servers, SyncOut and Inbound. Link, Assign, Expire, Leave,
// Reconfigure and Reports take the instance's own clock and convert it
// themselves.
func (n *Node) Now(local time.Time) time.Time {
	return local.Add(time.Duration(n.offset.Load()))
}

// Clock returns the instance's clock converted by Now.
func (n *Node) Clock() func() time.Time { return func() time.Time { return n.Now(time.Now()) } }

// Skew is the most that Now may be off the coordinator's time, from the
// latest estimate (ClockSync); -1 before any.
func (n *Node) Skew() time.Duration { return time.Duration(n.skew.Load()) }

// Instance returns the instance's id.
func (n *Node) Instance() string { return n.id }

// Link makes every domain of the engine's configuration that lists the
// region coordinated: every share of it is 0 until the coordinator's
// first full grant, and so is every limit a later configuration adds (a
// domain that does not list the region is enforced whole). Call it once,
// before the instance serves traffic.
func (n *Node) Link(local time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.Now(local)
	if n.links != nil {
		return errors.New("node: Link called twice")
	}
	n.e.SetInitialShare(func(d *allot.Domain, l *allot.Limit) float64 {
		if slices.Contains(d.Regions, n.region) {
			return 0
		}
		return 1
	})
	n.links = map[string]*coordinator.Instance{}
	var errs []error
	for _, d := range n.e.Config().Domains {
		if !slices.Contains(d.Regions, n.region) {
			continue
		}
		x, err := coordinator.NewInstance(d, n.region, n.id)
		if err != nil {
			return err
		}
		n.links[d.Name] = x
		_, err = n.set(now, d.Name, x.Shares(), nil, nil) // every share to 0
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Domains returns the coordinated domains, sorted.
func (n *Node) Domains() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.links))
}

func (n *Node) link(domain string) (*coordinator.Instance, error) {
	x := n.links[domain]
	if x == nil {
		return nil, fmt.Errorf("node: domain %q is not coordinated here", domain)
	}
	return x, nil
}

// Connect says a new stream to domain's coordinator begins: until a full
// grant arrives, other assignments are refused. It returns the hello to
// send at local (the instance's clock): the latest assignment and grant
// applied, and the weights held.
func (n *Node) Connect(local time.Time, domain string) (coordinator.Ack, []coordinator.Weight, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	x, err := n.link(domain)
	if err != nil {
		return coordinator.Ack{}, nil, err
	}
	x.Reconnect()
	ack, ws := x.Hello()
	ack.SentAt = local
	return ack, ws, nil
}

// Behind reports that Reconfigure added a limit of domain since its
// latest full grant: a new stream (Connect) brings the limit's shares.
func (n *Node) Behind(domain string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	x := n.links[domain]
	return x != nil && x.Behind()
}

// Applied returns the term and version of the latest assignment applied
// for domain (zeros for none or a domain not coordinated here).
func (n *Node) Applied(domain string) (term int64, version uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	x := n.links[domain]
	if x == nil {
		return 0, 0
	}
	ack, _ := x.Hello()
	return ack.Term, ack.Version
}

// Assign applies an assignment at now, lowerings first, and returns the
// shares applied (in order) and the ack to send. A refused assignment
// changes nothing and returns a zero ack; an error with a non-zero ack
// says the engine refused some of its shares (named in the error) and
// applied the rest: the ack is still to be sent.
func (n *Node) Assign(local time.Time, a coordinator.Assignment) ([]coordinator.Share, coordinator.Ack, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a.Clock != nil && a.Instance == n.id {
		n.clock.Sample(local, *a.Clock)
	}
	off, skew, ok := n.clock.Offset(local)
	g := time.Duration(0)
	if ok {
		n.offset.Store(int64(off))
		n.skew.Store(int64(skew))
		if skew <= WindowGuard/2 {
			g = WindowGuard
		}
	}
	n.e.SetWindowGuard(g)
	now := n.Now(local)
	x, err := n.link(a.Domain)
	if err != nil {
		return nil, coordinator.Ack{}, err
	}
	shares, ack, err := x.Apply(now, a)
	if err != nil {
		return nil, coordinator.Ack{}, err
	}
	// Under mu: the next assignment applies after this one. Allowance
	// moves within a window only while the clock's error is known and
	// within the guard's tolerance: the window a release or an extra
	// names is then the window of true time, 2e from its edges.
	moves := ok && skew <= WindowGuard/2
	var pooled *coordinator.Instance
	if moves {
		pooled = x
	}
	applied, err := n.set(now, a.Domain, shares, pooled, &ack)
	extras := x.TakeExtras()
	if e := x.TakeEarly(); e != nil {
		// A grant that came before this full grant, which it follows
		// (the coordinator sent it later): it applies now, as it would
		// have right after it, and its ack says both were applied.
		// One that the Instance refuses now (expired) is as late as any.
		if shares, later, aerr := x.Apply(now, *e); aerr == nil {
			more, serr := n.set(now, a.Domain, shares, pooled, &later)
			later.Released = append(ack.Released, later.Released...)
			applied, ack, err = append(applied, more...), later, errors.Join(err, serr)
			extras = append(extras, x.TakeExtras()...)
		}
	}
	if moves {
		n.addExtras(now, a.Domain, extras, skew)
		n.wants(now, a.Domain, applied, x, &ack)
	}
	return applied, ack, err
}

// addExtras adds a grant's extras to the current window of their limits
// (Engine.AddExtra), usable from 2e after the window's start until 2e
// before its end, e the clock's error bound.
func (n *Node) addExtras(now time.Time, domain string, extras []coordinator.Moved, e time.Duration) {
	d := n.e.Config().Domain(domain)
	for _, x := range extras {
		l := d.Limit(x.Limit)
		if l == nil {
			continue
		}
		w := x.Window.UnixNano()
		// An extra the engine does not take (another window) is lost,
		// never spent twice: nothing to report.
		_ = n.e.AddExtra(now, domain, x.Limit, regional.Extra{Key: x.Key, Window: w, Value: x.Value,
			From: w + int64(2*e), Until: w + int64(l.Rate.Period-2*e)})
	}
}

// Expires returns when domain's grant in force expires (zero: none, or
// one that does not expire).
func (n *Node) Expires(domain string) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	if x := n.links[domain]; x != nil {
		return x.Expires()
	}
	return time.Time{}
}

// Expire drops every share of every domain whose grant has expired at now
// without a renewal to nothing, until the coordinator grants again; it
// returns the domains it dropped and the shares applied.
func (n *Node) Expire(local time.Time) ([]string, []coordinator.Share) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.Now(local)
	var doms []string
	var all []coordinator.Share
	for _, d := range slices.Sorted(maps.Keys(n.links)) {
		shares := n.links[d].Expire(now)
		if len(shares) == 0 {
			continue
		}
		doms = append(doms, d)
		applied, _ := n.set(now, d, shares, nil, nil) // the Instance's own shares: valid
		all = append(all, applied...)
	}
	return doms, all
}

// Leave drops every share of every domain to nothing for good (a graceful
// stop, once no request is served any more) and returns, by domain, the
// ack that tells the coordinator so: what the instance held is then
// reclaimable at once instead of after its grants expire.
func (n *Node) Leave(local time.Time) map[string]coordinator.Ack {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.Now(local)
	acks := map[string]coordinator.Ack{}
	for d, x := range n.links {
		shares, ack := x.Leave()
		n.set(now, d, shares, nil, nil) // the Instance's own shares: valid
		acks[d] = ack
	}
	return acks
}

// Reconfigure follows the engine's new configuration (call it after the
// engine's SetConfig): limits it adds are held at nothing until assigned.
// A domain added to the configuration is coordinated from the next start.
func (n *Node) Reconfigure(local time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.Now(local)
	var errs []error
	for _, d := range n.e.Config().Domains {
		x := n.links[d.Name]
		if x == nil {
			continue
		}
		shares, err := x.Reconfigure(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_, err = n.set(now, d.Name, shares, nil, nil)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Ready returns nil once every coordinated domain holds a grant with a
// part of each of its local limits, or an error naming the first that
// does not: an instance that holds nothing rejects every request of it.
func (n *Node) Ready() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, d := range slices.Sorted(maps.Keys(n.links)) {
		if !n.links[d].Serving() {
			return fmt.Errorf("no grant from the coordinator of domain %s yet", d)
		}
	}
	return nil
}

// set applies shares, in order, to the engine: a run of hot keys of one
// limit in one SetKeyShares call (an assignment may carry thousands). It
// returns the shares applied; one the engine refuses is skipped and
// reported in the error, the others are applied.
//
// With pooled not nil, the default share, or the hot keys' own shares,
// of a limit whose releases its coordinator pools (Instance.Pooled: a
// split-mode local long window) move (Engine.MoveShare, MoveKeyShares):
// what a lowering gives up of the current window is appended to
// ack.Released, for the coordinator to hand out.
func (n *Node) set(now time.Time, domain string, shares []coordinator.Share, pooled *coordinator.Instance, ack *coordinator.Ack) ([]coordinator.Share, error) {
	applied := shares[:0:0]
	var errs []error
	moved := func(limit string, rs ...regional.Release) {
		for _, r := range rs {
			if r.Value > 0 {
				ack.Released = append(ack.Released, coordinator.Moved{Limit: limit, Key: r.Key, Window: time.Unix(0, r.Window), Value: r.Value})
			}
		}
	}
	for i := 0; i < len(shares); {
		j := i + 1
		for j < len(shares) && !shares[i].Reset && shares[i].Key != "" && shares[j].Key != "" && !shares[j].Reset && shares[j].Limit == shares[i].Limit {
			j++
		}
		s := shares[i]
		var err error
		switch {
		case s.Reset:
			err = n.e.ResetShare(domain, s.Limit, s.Value, s.Since)
		case s.Key == "" && pooled != nil && pooled.Pooled(s.Limit, false):
			var r regional.Release
			r, err = n.e.MoveShare(now, domain, s.Limit, s.Value)
			moved(s.Limit, r)
		case s.Key == "":
			err = n.e.SetShare(now, domain, s.Limit, s.Value)
		default:
			ks := make([]regional.KeyShare, 0, j-i)
			for _, s := range shares[i:j] {
				ks = append(ks, regional.KeyShare{Key: s.Key, Share: s.Value})
			}
			if pooled != nil && pooled.Pooled(s.Limit, true) {
				var rs []regional.Release
				rs, err = n.e.MoveKeyShares(now, domain, s.Limit, ks)
				moved(s.Limit, rs...)
			} else {
				err = n.e.SetKeyShares(now, domain, s.Limit, ks)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("share of %s/%s key %q not applied: %w", domain, s.Limit, s.Key, err))
		} else {
			applied = append(applied, shares[i:j]...)
		}
		i = j
	}
	return applied, errors.Join(errs...)
}

// wants adds to ack what the shares applied, of limits whose releases the
// coordinator pools, may not use of the current window (Engine.Wants):
// another's release of it may make it up (Grant.Extras).
func (n *Node) wants(now time.Time, domain string, applied []coordinator.Share, pooled *coordinator.Instance, ack *coordinator.Ack) {
	// A share that wanted some and wants nothing now says so: what the
	// coordinator knew it to want is out of date.
	for _, s := range applied {
		if !pooled.Pooled(s.Limit, s.Key != "") {
			continue
		}
		w, err := n.e.Wants(now, domain, s.Limit, s.Key)
		if err != nil {
			continue
		}
		id := [3]string{domain, s.Limit, s.Key}
		switch was := n.wanting[id]; {
		case w.Value > 0:
			if n.wanting == nil || len(n.wanting) >= maxWanting {
				// Forgetting costs only extras that the coordinator may
				// send for a want out of date, which the engine caps.
				n.wanting = map[[3]string]bool{}
			}
			n.wanting[id] = true
		case !was:
			continue
		default:
			delete(n.wanting, id)
		}
		ack.Wanted = append(ack.Wanted, coordinator.Moved{Limit: s.Limit, Key: s.Key, Window: time.Unix(0, w.Window), Value: w.Value})
	}
}

// Reports drains the engine's demand since the previous call and returns
// one report per coordinated domain, sorted by domain: an empty one says
// the instance is alive. Reports are ordered: a clock stepped back gives
// the next report the previous At + 1 ns.
func (n *Node) Reports(now time.Time) []coordinator.Report {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !now.After(n.at) {
		now = n.at.Add(time.Nanosecond)
	}
	n.at = now
	byDomain := map[string]*coordinator.Report{}
	for d := range n.links {
		byDomain[d] = &coordinator.Report{Domain: d, Region: n.region, Instance: n.id, At: now}
	}
	for _, d := range n.e.Demand() {
		r := byDomain[d.Domain]
		if r == nil {
			continue // not coordinated here
		}
		if k := len(r.Limits); k == 0 || r.Limits[k-1].Limit != d.Limit {
			r.Limits = append(r.Limits, coordinator.LimitDemand{Limit: d.Limit})
		}
		ld := &r.Limits[len(r.Limits)-1]
		if d.Key == "" {
			ld.Admitted, ld.Rejected = d.Admitted, d.Rejected
		} else {
			ld.Keys = append(ld.Keys, coordinator.KeyDemand{Key: d.Key, Admitted: d.Admitted, Rejected: d.Rejected, NearLimit: d.NearLimit})
		}
	}
	out := make([]coordinator.Report, 0, len(byDomain))
	if n.last == nil {
		n.last = map[string]coordinator.Report{}
	}
	for _, d := range slices.Sorted(maps.Keys(byDomain)) {
		out = append(out, *byDomain[d])
		n.last[d] = *byDomain[d]
	}
	return out
}

// LastReport returns the latest report Reports made for domain, if it
// was made at most maxAge before local (the instance's clock), for a new
// stream to send right after its hello: a new leader takes it as the
// instance's first report, so that it knows the instance's demand a
// report interval sooner (after a failover, the first rebalance that
// knew every region's demand came up to a report interval late, and
// missed a window); the leader that took it already ignores it.
func (n *Node) LastReport(local time.Time, domain string, maxAge time.Duration) (coordinator.Report, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.last[domain]
	if !ok || local.Sub(r.At) > maxAge || local.Before(r.At) {
		return coordinator.Report{}, false
	}
	return r, true
}

// SyncOut is the instance's side of a peer sync tick: the batches to send
// to every peer, in order. With a CountStore, this instance's counts and
// the peers' batches it received since the last tick are merged in the
// store first (the region's slot is the sum over its instances); a store
// that does not answer leaves the other instances' counts as last merged
// and keeps what was received for the next merge, and its error is
// returned with the batches.
func (n *Node) SyncOut(ctx context.Context, now time.Time) ([]regional.Batch, error) {
	if n.counts == nil {
		return n.e.SyncOut(now), nil
	}
	n.rmu.Lock()
	received := n.received
	n.received = nil
	n.rmu.Unlock()
	own := n.e.CollectCounts(now, true)
	ops := n.e.CountOps(own, received)
	res := make([]regional.RegionCount, len(ops))
	err := n.counts.MergeCounts(ctx, n.id, ops, res)
	if err != nil {
		// The peers' slots received count here already (Inbound) and go
		// to the store at the next merge.
		res = regional.Alone(own)
		n.rmu.Lock()
		if len(n.received) < maxReceived {
			n.received = append(received, n.received...)
		}
		n.rmu.Unlock()
	}
	n.e.PublishCounts(now, res)
	return n.e.Outbound(now), err
}

// Inbound merges batch b of a peer's stream src and reports whether the
// stream lost deltas (ask the peer for the limit's FullState). With a
// CountStore, the batch's deltas go to the store at the next SyncOut, so
// that the region's other instances learn them too.
func (n *Node) Inbound(now time.Time, src regional.Source, b regional.Batch) (bool, error) {
	resync, err := n.e.Inbound(now, src, b)
	if err == nil && n.counts != nil && len(b.Deltas) > 0 {
		n.rmu.Lock()
		n.received = append(n.received, b)
		n.rmu.Unlock()
	}
	return resync, err
}

// minTick and maxTick bound the default peer tick.
const (
	minTick = 10 * time.Millisecond
	maxTick = 250 * time.Millisecond
)

// PeerIntervals returns an instance's default peer sync tick (how often
// due deltas go out and loans are asked: a tenth of the shortest sync
// interval of cfg, within [10ms, 250ms]) and heartbeat (how often a
// message goes each way on a peer stream when no delta does: half that
// interval). A peer's silence is noticed from the heartbeats' absence.
func PeerIntervals(cfg *allot.Config) (tick, heartbeat time.Duration) {
	d := time.Duration(0)
	for _, dom := range cfg.Domains {
		for _, l := range dom.Limits {
			if l.SyncInterval > 0 && (d == 0 || l.SyncInterval < d) {
				d = l.SyncInterval
			}
		}
	}
	if d == 0 {
		d = allot.DefaultSyncInterval
	}
	return min(max(d/10, minTick), maxTick), d / 2
}
