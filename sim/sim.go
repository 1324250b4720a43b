package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
)

// Systems compared in one run.
const (
	// Allot is split mode driven by the real coordinator.
	Allot = "allot"
	// Naive gives every instance global ÷ instances, with no coordinator.
	Naive = "naive"
)

// NoFallback is allot in shared mode without the staleness fallback: the
// engine has no switch for it, so the limit's stale_after is set to a day.
const NoFallback = "no-fallback"

// systems lists the systems Run simulates for a limit, in report order:
// allot and the naive even split, and for a shared-mode limit allot
// without fallback.
func systems(l *allot.Limit) []string {
	if l.Mode == allot.Shared {
		return []string{Allot, Naive, NoFallback}
	}
	return []string{Allot, Naive}
}

// T0 is the virtual clock's start: aligned to every window.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// event is one thing due at a virtual instant; seq breaks ties in the
// order events were scheduled, so a run is deterministic.
type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// world is one system's run of a scenario. Not safe for concurrent use:
// everything happens on the caller's goroutine, in virtual time.
type world struct {
	sc     *Scenario
	dom    *allot.Domain
	lim    *allot.Limit
	now    time.Time
	end    time.Time
	q      queue
	seq    uint64
	load   *rand.Rand // arrivals and keys: the same in every system
	net    *rand.Rand // latency, loss, duplication
	ideal  *regional.Engine
	idec   allot.Decision
	dec    allot.Decision
	region []*region
	m      *metrics
	hot    string // the watched key's name

	// The coordinator, nil while down. gen counts coordinators, so that
	// messages sent to a stopped one are lost.
	coord *coordinator.Coordinator
	gen   int
	term  int64
	snap  coordinator.Snapshot // what was persisted
	cut   map[string]bool      // regions partitioned from the coordinator and peers
}

type region struct {
	name string
	link Link
	e    *regional.Engine     // the region's engine (allot)
	inst []*regional.Engine   // one engine per instance (naive)
	app  *coordinator.Applier // nil in the naive system
}

func (w *world) at(t time.Time, fn func()) {
	w.seq++
	heap.Push(&w.q, event{at: t, seq: w.seq, fn: fn})
}

func (w *world) after(d time.Duration, fn func()) { w.at(w.now.Add(d), fn) }

// every runs fn at start and then every d until the end.
func (w *world) every(start time.Time, d time.Duration, fn func()) {
	var loop func()
	loop = func() {
		fn()
		w.after(d, loop)
	}
	w.at(start, loop)
}

// run simulates one system of the scenario.
func run(sc *Scenario, cfg *allot.Config, sys string) (*metrics, error) {
	d := cfg.Domains[0]
	w := &world{sc: sc, dom: d, lim: d.Limit(sc.Limit), now: T0, end: T0.Add(sc.Duration),
		load: rand.New(rand.NewPCG(sc.Seed, 1)), net: rand.New(rand.NewPCG(sc.Seed, 2)),
		ideal: regional.New(cfg, regional.Options{}), cut: map[string]bool{}}
	w.hot = regional.KeyString(w.lim, allot.Descriptor{{Key: w.entry(), Value: sc.Watch}})
	w.m = newMetrics(sc, w.lim, d, w.hot)
	total := 0
	for _, r := range sc.Regions {
		total += r.Instances
	}
	ecfg := cfg
	if sys == NoFallback {
		c, err := allot.ParseConfig(sc.Name, []byte(sc.Config))
		if err != nil {
			return nil, err
		}
		for _, l := range c.Domains[0].Limits {
			l.StaleAfter = 24 * time.Hour
		}
		ecfg = c
	}
	coordinated := sys != Naive
	for _, name := range d.Regions {
		sr := sc.region(name)
		r := &region{name: name, link: *sr.Link}
		if coordinated {
			r.e = regional.New(ecfg, regional.Options{})
		}
		if coordinated && w.peers() {
			if err := r.e.SetPeers(name, slices.DeleteFunc(slices.Clone(d.Regions), func(p string) bool { return p == name })); err != nil {
				return nil, err
			}
		}
		w.region = append(w.region, r)
		if !coordinated { // every instance enforces global ÷ instances
			for range sr.Instances {
				e := regional.New(ecfg, regional.Options{})
				for _, l := range d.Limits {
					if err := e.SetShare(w.now, d.Name, l.Name, 1/float64(total)); err != nil {
						return nil, err
					}
				}
				r.inst = append(r.inst, e)
			}
			continue
		}
		app, err := coordinator.NewApplier(d, name, coordinator.Snapshot{})
		if err != nil {
			return nil, err
		}
		r.app = app
		for _, l := range d.Limits {
			if err := r.e.SetShare(w.now, d.Name, l.Name, app.Share(l.Name, "")); err != nil {
				return nil, err
			}
		}
	}
	if coordinated {
		if err := w.start(); err != nil {
			return nil, err
		}
		w.every(T0.Add(sc.Tick), sc.Tick, func() {
			if w.coord != nil {
				w.ready(w.coord.Tick(w.now))
			}
		})
		for i, r := range w.region {
			phase := sc.ReportEvery * time.Duration(i+1) / time.Duration(len(w.region)+1)
			w.every(T0.Add(phase), sc.ReportEvery, func() { w.report(r) })
		}
		for _, f := range sc.Faults {
			w.fault(f)
		}
		if w.peers() {
			for _, r := range w.region {
				w.every(T0.Add(sc.SyncTick), sc.SyncTick, func() { w.syncTick(r) })
			}
		}
	}
	w.every(T0, sc.Tick, w.sample)
	for i := range sc.Traffic {
		w.traffic(&sc.Traffic[i])
	}
	for w.q.Len() > 0 {
		e := heap.Pop(&w.q).(event)
		if e.at.After(w.end) {
			break
		}
		w.now = e.at
		e.fn()
	}
	return w.m, nil
}

func (sc *Scenario) region(name string) *Region {
	for i := range sc.Regions {
		if sc.Regions[i].Name == name {
			return &sc.Regions[i]
		}
	}
	return nil
}

// start starts a coordinator from the persisted snapshot, under a new term.
func (w *world) start() error {
	w.term++
	c, err := coordinator.New(w.now, coordinator.Config{Domain: w.dom, Term: w.term,
		Period: w.sc.Period, HalfLife: w.sc.HalfLife}, w.snap)
	if err != nil {
		return fmt.Errorf("start the coordinator of term %d: %w", w.term, err)
	}
	w.coord = c
	w.gen++
	return nil
}

func (w *world) fault(f Fault) {
	switch f.Kind {
	case "partition":
		w.at(T0.Add(f.At), func() { w.cut[f.Region] = true })
		w.at(T0.Add(f.At+f.For), func() { delete(w.cut, f.Region) })
	case "failover":
		w.at(T0.Add(f.At), func() { w.coord = nil })
		w.at(T0.Add(f.At+f.For), func() {
			if err := w.start(); err != nil {
				panic(err) // the snapshot is the coordinator's own: a bug
			}
		})
	}
}

// send schedules deliver over link l between regions a and b (b is ""
// for the coordinator), unless the message is lost; it is also lost if a
// or b is partitioned when it is sent or delivered.
func (w *world) send(l Link, a, b string, deliver func()) {
	w.m.messages++
	if w.cut[a] || w.cut[b] || w.net.Float64() < l.Loss {
		return
	}
	copies := 1
	if w.net.Float64() < l.Dup {
		copies = 2
	}
	for range copies {
		d := l.RTT / 2
		if l.Jitter > 0 {
			d += time.Duration(w.net.Int64N(int64(l.Jitter)))
		}
		w.after(d, func() {
			if !w.cut[a] && !w.cut[b] {
				deliver()
			}
		})
	}
}

// toCoord sends m from r to the coordinator running now.
func (w *world) toCoord(r *region, m coordinator.Message) {
	gen := w.gen
	w.send(r.link, r.name, "", func() {
		if w.coord == nil || w.gen != gen {
			return // that coordinator is gone
		}
		rd, err := w.coord.Step(w.now, m)
		if err != nil {
			w.m.refused++ // stale or duplicated: counted by the coordinator too
			return
		}
		w.ready(rd)
	})
}

// ready persists, then sends, as coordinator.Ready asks.
func (w *world) ready(rd coordinator.Ready) {
	if len(rd.Persist) > 0 {
		w.persist(rd)
	}
	for _, a := range rd.Send {
		r := w.byName(a.Region)
		w.send(r.link, r.name, "", func() { w.apply(r, a) })
	}
}

// persist replaces (or, for a Record without Cells, deletes) the records
// of rd, and keeps its Term and Version: the fenced etcd write.
func (w *world) persist(rd coordinator.Ready) {
	for _, rec := range rd.Persist {
		i := 0
		for i < len(w.snap.Records) && (w.snap.Records[i].Limit != rec.Limit || w.snap.Records[i].Key != rec.Key) {
			i++
		}
		switch {
		case rec.Cells == nil && i < len(w.snap.Records):
			w.snap.Records = append(w.snap.Records[:i], w.snap.Records[i+1:]...)
		case rec.Cells == nil:
		case i < len(w.snap.Records):
			w.snap.Records[i] = rec
		default:
			w.snap.Records = append(w.snap.Records, rec)
		}
	}
	w.snap.Term, w.snap.Version = rd.Term, rd.Version
}

// apply is a region's driver: lowerings first, then the ack.
func (w *world) apply(r *region, a coordinator.Assignment) {
	shares, ack, err := r.app.Apply(a)
	if err != nil {
		w.m.refused++
		return
	}
	for _, s := range shares {
		if s.Key == "" {
			err = r.e.SetShare(w.now, w.dom.Name, s.Limit, s.Value)
		} else {
			err = r.e.SetKeyShare(w.now, w.dom.Name, s.Limit, s.Key, s.Value)
		}
		if err != nil {
			panic(fmt.Sprintf("%s: apply %+v: %v", r.name, s, err)) // the Applier validated it
		}
		w.checkShares(s)
	}
	w.toCoord(r, ack)
}

// report sends the region's demand since its previous report, as
// regional/coordclient does.
func (w *world) report(r *region) {
	rep := coordinator.Report{Domain: w.dom.Name, Region: r.name, At: w.now}
	for _, d := range r.e.Demand() {
		if n := len(rep.Limits); n == 0 || rep.Limits[n-1].Limit != d.Limit {
			rep.Limits = append(rep.Limits, coordinator.LimitDemand{Limit: d.Limit})
		}
		ld := &rep.Limits[len(rep.Limits)-1]
		if d.Key == "" {
			ld.Admitted, ld.Rejected = d.Admitted, d.Rejected
		} else {
			ld.Keys = append(ld.Keys, coordinator.KeyDemand{Key: d.Key, Admitted: d.Admitted, Rejected: d.Rejected, NearLimit: d.NearLimit})
		}
	}
	w.toCoord(r, rep)
}

func (w *world) byName(name string) *region {
	for _, r := range w.region {
		if r.name == name {
			return r
		}
	}
	panic("sim: unknown region " + name)
}

// traffic schedules the Poisson arrivals of t.
func (w *world) traffic(t *Traffic) {
	r := w.byName(t.Region)
	var zipf *rand.Zipf
	if t.Keys > 1 {
		zipf = rand.NewZipf(w.load, t.Zipf, 1, uint64(t.Keys-1))
	}
	end := T0.Add(t.Until)
	reach := w.sc.region(t.Region).Instances
	if t.Reach > 0 {
		reach = min(t.Reach, reach)
	}
	var next func()
	gap := func() time.Duration { return time.Duration(w.load.ExpFloat64() / t.Rate * float64(time.Second)) }
	next = func() {
		k := uint64(0)
		if zipf != nil {
			k = zipf.Uint64()
		}
		inst := w.load.IntN(reach) // drawn in every system, so arrivals stay the same
		w.request(r, inst, allot.Descriptor{{Key: t.Entry, Value: fmt.Sprint("k", k)}}, t.Cost)
		if at := w.now.Add(gap()); at.Before(end) {
			w.at(at, next)
		}
	}
	if at := T0.Add(t.From).Add(gap()); at.Before(end) {
		w.at(at, next)
	}
}

// request decides a request that reached instance inst of region r.
func (w *world) request(r *region, inst int, desc allot.Descriptor, cost int64) {
	e := r.e
	if r.inst != nil {
		e = r.inst[inst]
	}
	if err := e.Check(w.now, w.dom.Name, desc, cost, &w.dec); err != nil {
		panic(fmt.Sprintf("%s: check %v: %v", r.name, desc, err))
	}
	if err := w.ideal.Check(w.now, w.dom.Name, desc, cost, &w.idec); err != nil {
		panic(err)
	}
	w.m.request(w.now, r.name, regional.KeyString(w.lim, desc), float64(cost), w.dec.Allowed, w.idec.Allowed)
}

// sample records every region's share of the watched key.
func (w *world) sample() {
	shares := make([]float64, len(w.region))
	for i, r := range w.region {
		if r.e != nil {
			shares[i] = r.e.Share(w.dom.Name, w.lim.Name, w.hot)
		} else {
			shares[i] = float64(len(r.inst)) * r.inst[0].Share(w.dom.Name, w.lim.Name, w.hot)
		}
	}
	w.m.sample(w.now, shares)
}

func (w *world) entry() string {
	if len(w.sc.Traffic) > 0 {
		return w.sc.Traffic[0].Entry
	}
	return "user"
}

// syncTick is a region's peer sync tick, as regional/peersync does it:
// deltas to every peer, a heartbeat, and resync requests for lost deltas.
func (w *world) syncTick(r *region) {
	batches := r.e.SyncOut(w.now)
	for _, p := range w.region {
		if p == r {
			continue
		}
		for _, b := range batches {
			w.send(w.sc.PeerLink, r.name, p.name, func() { w.inbound(p, r, b) })
		}
		w.send(w.sc.PeerLink, r.name, p.name, func() { p.e.Heard(w.now, r.name) })
		for _, b := range r.e.PendingResyncs(w.now, p.name+">"+r.name) {
			w.resync(r, p, b)
		}
	}
	for _, a := range r.e.LoanAsks(w.now) {
		w.borrow(r, a)
	}
}

// errLendTimeout is what a borrower's driver gives Credit when no answer
// came within LendTimeout.
var errLendTimeout = errors.New("sim: lend timed out")

// borrow sends a loan ask to its peer, as a Lend call with a timeout: the
// lender deducts, then grants; a grant that comes too late is lost
// (stranded at the lender for the window, never created).
func (w *world) borrow(r *region, a regional.LoanAsk) {
	w.m.loanAsks++
	peer, done := w.byName(a.Peer), false
	w.send(w.sc.PeerLink, r.name, peer.name, func() {
		g, err := peer.e.Lend(w.now, regional.LoanRequest{From: r.name, Domain: a.Domain, Limit: a.Limit,
			Key: a.Key, Window: a.Window, Amount: a.Amount, ID: a.ID})
		w.send(w.sc.PeerLink, peer.name, r.name, func() {
			if !done {
				done = true
				w.m.loaned += float64(g.Granted)
				r.e.Credit(w.now, a, g, err)
			}
		})
	})
	w.after(w.sc.LendTimeout, func() {
		if !done {
			done = true
			r.e.Credit(w.now, a, regional.LoanGrant{}, errLendTimeout)
		}
	})
}

// peers says whether regions sync with their peers: always for a
// shared-mode limit, and in split mode when the scenario says so (then
// they borrow).
func (w *world) peers() bool { return w.lim.Mode == allot.Shared || w.sc.Peers }

// inbound delivers batch b from peer from to region to.
func (w *world) inbound(to, from *region, b regional.Batch) {
	to.e.Heard(w.now, from.name)
	resync, err := to.e.Inbound(w.now, regional.Source{Region: from.name, Stream: from.name + ">" + to.name}, b)
	if err != nil {
		panic(fmt.Sprintf("%s: inbound from %s: %v", to.name, from.name, err))
	}
	if resync {
		w.resync(to, from, b)
	}
}

// resync asks peer for the full state of b's limit, on r's behalf.
func (w *world) resync(r, peer *region, b regional.Batch) {
	w.send(w.sc.PeerLink, r.name, peer.name, func() {
		full, err := peer.e.FullState(b.Domain, b.Limit)
		if err != nil {
			panic(err)
		}
		w.send(w.sc.PeerLink, peer.name, r.name, func() { w.inbound(r, peer, full) })
	})
}

// checkShares records the sum over regions of the shares in force for
// the vector s changed: the coordinator's invariant says it is at most 1
// at every instant, and shares change only here.
func (w *world) checkShares(s coordinator.Share) {
	key := s.Key
	if key == "" {
		key = w.hot // the default vector, as the watched key sees it
	}
	sum := 0.0
	for _, r := range w.region {
		sum += r.e.Share(w.dom.Name, s.Limit, key)
	}
	w.m.shareSum = max(w.m.shareSum, sum)
}
