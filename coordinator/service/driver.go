package service

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/wire"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// driver owns one led domain's Coordinator.
//
// A region runs several enforcer instances, each with its own Connect
// stream; the Coordinator knows only regions. The driver stands between
// them (all of it in run's goroutine):
//
//   - Assignments for a region go to every stream of the region.
//   - Acks: each stream's latest acked version of this term is kept (its
//     Hello counts), and the Coordinator gets a region's Ack only for the
//     version that every stream connected now has acked (the minimum),
//     re-evaluated when a stream acks, attaches or detaches. So one
//     instance's ack never counts as the region's while another instance
//     still enforces an older, higher share.
//   - Demand: each instance reports its own traffic. The driver keeps every
//     stream's latest report as a rate (see streamReport) and forwards one
//     report for the region whose amounts are the sum of the streams'
//     rates over the interval since the region's previous forwarded report.
//
// Remaining gap: an instance whose stream ends (cut off from the
// coordinator, or crashed) is no longer counted. Its ack no longer holds
// the region's back, so the Coordinator may raise other regions out of
// this region's lowering while that instance, if it lives on behind a
// partition, still enforces the older share it last applied. The
// Coordinator itself handles a partitioned region (frozen, its bound kept)
// only when all of its instances are gone, as it sees one region, not
// instances. Conversely, a stream the server has not yet noticed is dead
// holds the region's acks back until gRPC notices (safe, but slower).
type driver struct {
	s      *Server
	domain string
	lead   *etcdstore.Leadership
	co     *coordinator.Coordinator // owned by run's goroutine
	limits []string                 // the domain's limits, in configuration order
	inbox  chan inbound
	done   chan struct{} // closed when the driver stops

	reload     chan struct{} // closed by SetConfig
	reloadOnce sync.Once

	streams map[string][]*regionStream // guarded by s.mu: outbound, by region
	stopped bool                       // guarded by s.mu: run has closed every stream

	regions map[string]*regionState // owned by run's goroutine

	stepped func(coordinator.Message) // if set, sees every message the Coordinator applied (tests)
}

// regionState is what the driver knows of one region, in run's goroutine.
type regionState struct {
	streams []*regionStream // connected, in the order they attached
	sent    uint64          // version of the latest assignment sent to the region
	acked   uint64          // version of the latest Ack forwarded to the Coordinator
	at      time.Time       // At of the latest Report the Coordinator applied
}

// regionStream is one instance's Connect stream of a region.
type regionStream struct {
	region string
	out    chan *allotv1.CoordinatorMessage
	closed chan struct{} // closed when the driver stops

	// Owned by the driver's run goroutine.
	acked  uint64       // latest version of this term the instance acked (0: none)
	lastAt time.Time    // At of its previous report
	rates  streamReport // its latest report, as rates
}

// streamReport is an instance's latest report as rates (cost per second)
// over the interval since its previous report. The first report of a
// stream gives no rate (there is no interval): it only marks keys near
// their limit or with rejections as such.
type streamReport map[string]*limitRate // by limit

type limitRate struct {
	admitted, rejected float64
	keys               map[string]*keyRate
}

type keyRate struct {
	admitted, rejected float64
	near               bool // near its limit or with rejections
}

func (r *regionStream) send(m *allotv1.CoordinatorMessage) bool {
	select {
	case r.out <- m:
		return true
	default:
		return false // a slow instance: it will get the next period's assignment
	}
}

func (r *regionStream) reject(err error) {
	r.send(&allotv1.CoordinatorMessage{Msg: &allotv1.CoordinatorMessage_Rejection{Rejection: &allotv1.Rejection{Message: err.Error()}}})
}

// inbound is what Connect hands to the driver: a stream attaching (with
// its Hello's ack, if any) or detaching, or a message of a stream.
type inbound struct {
	rs   *regionStream
	kind inboundKind
	msg  coordinator.Message // for inMessage, and the Hello's Ack (or nil) for inAttach
}

type inboundKind int

const (
	inMessage inboundKind = iota
	inAttach
	inDetach
)

// attach adds an instance's stream of region and tells run, with the ack
// its Hello carries (term and version; version 0 for none).
func (d *driver) attach(region string, term int64, version uint64) *regionStream {
	rs := &regionStream{region: region, out: make(chan *allotv1.CoordinatorMessage, 16), closed: make(chan struct{})}
	d.s.mu.Lock()
	if d.stopped {
		close(rs.closed)
		d.s.mu.Unlock()
		return rs
	}
	d.streams[region] = append(d.streams[region], rs)
	d.s.mu.Unlock()
	var hello coordinator.Message
	if version > 0 {
		hello = coordinator.Ack{Domain: d.domain, Region: region, Term: term, Version: version}
	}
	d.postIn(inbound{rs: rs, kind: inAttach, msg: hello})
	return rs
}

func (d *driver) detach(rs *regionStream) {
	d.s.mu.Lock()
	if i := slices.Index(d.streams[rs.region], rs); i >= 0 {
		d.streams[rs.region] = slices.Delete(d.streams[rs.region], i, i+1)
		if len(d.streams[rs.region]) == 0 {
			delete(d.streams, rs.region)
		}
	}
	d.s.mu.Unlock()
	d.postIn(inbound{rs: rs, kind: inDetach})
}

// post hands a stream's message to the driver, unless it has stopped.
func (d *driver) post(rs *regionStream, m coordinator.Message) {
	d.postIn(inbound{rs: rs, kind: inMessage, msg: m})
}

func (d *driver) postIn(in inbound) {
	select {
	case d.inbox <- in:
	case <-d.done:
	}
}

// run steps and ticks the coordinator until leadership is lost, ctx ends
// or a fenced write fails.
func (d *driver) run(ctx context.Context) error {
	defer func() {
		d.s.mu.Lock()
		d.stopped = true
		for r, rss := range d.streams {
			for _, rs := range rss {
				close(rs.closed)
			}
			delete(d.streams, r)
		}
		d.s.mu.Unlock()
	}()
	tick := time.NewTicker(d.s.opts.TickEvery)
	defer tick.Stop()
	for {
		var rd coordinator.Ready
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.lead.Done():
			return fmt.Errorf("lost the leadership of %s (term %d)", d.domain, d.lead.Term)
		case <-d.reload:
			return errReload
		case in := <-d.inbox:
			rd = d.handle(d.s.opts.Now(), in)
		case <-tick.C:
			start := time.Now()
			rd = d.co.Tick(d.s.opts.Now())
			if len(rd.Send) > 0 {
				d.s.metrics.rebalanced(d.domain, time.Since(start))
			}
		}
		if err := d.ready(ctx, rd); err != nil {
			return err
		}
	}
}

func (d *driver) region(name string) *regionState {
	st := d.regions[name]
	if st == nil {
		st = &regionState{}
		d.regions[name] = st
	}
	return st
}

// handle applies one inbound event and returns what the Coordinator asks.
func (d *driver) handle(now time.Time, in inbound) coordinator.Ready {
	st := d.region(in.rs.region)
	i := slices.Index(st.streams, in.rs)
	switch in.kind {
	case inAttach:
		if i < 0 {
			st.streams = append(st.streams, in.rs)
		}
		if in.msg == nil || in.msg.(coordinator.Ack).Term != d.lead.Term {
			rd, _ := d.evalAck(now, in.rs.region, st) // an ack of an older term counts as none
			return rd
		}
	case inDetach:
		if i >= 0 {
			st.streams = slices.Delete(st.streams, i, i+1)
		}
		rd, _ := d.evalAck(now, in.rs.region, st)
		return rd
	default:
		if i < 0 {
			return coordinator.Ready{} // a late message of a detached stream
		}
	}
	var rd coordinator.Ready
	var err error
	switch m := in.msg.(type) {
	case coordinator.Ack:
		if err = d.checkAck(st, m); err == nil {
			in.rs.acked = max(in.rs.acked, m.Version)
			rd, err = d.evalAck(now, in.rs.region, st)
		}
	case coordinator.Report:
		if err = d.checkReport(in.rs, m); err == nil {
			in.rs.rates, in.rs.lastAt = rates(in.rs, m), m.At
			err = d.forwardReport(now, in.rs.region, st, m.At)
		}
	default:
		err = fmt.Errorf("%w: message %T", coordinator.ErrBadValue, m)
	}
	d.s.metrics.message(d.domain, in.msg, err)
	if err != nil {
		d.s.log.Debug("message refused", "domain", d.domain, "region", in.rs.region, "err", err)
		in.rs.reject(err)
	}
	return rd
}

// checkAck refuses what the Coordinator would: an ack of another term, or
// of a version never sent to the region.
func (d *driver) checkAck(st *regionState, a coordinator.Ack) error {
	switch {
	case a.Term < d.lead.Term:
		return fmt.Errorf("%w: ack of term %d, leader's term is %d", coordinator.ErrStale, a.Term, d.lead.Term)
	case a.Term > d.lead.Term || a.Version > st.sent:
		return fmt.Errorf("%w: %s acked term %d version %d, latest sent is term %d version %d",
			coordinator.ErrBadVersion, a.Region, a.Term, a.Version, d.lead.Term, st.sent)
	}
	return nil
}

// evalAck forwards the region's Ack of the latest version that every
// connected stream of it has acked, if the Coordinator has not had it.
func (d *driver) evalAck(now time.Time, region string, st *regionState) (coordinator.Ready, error) {
	if len(st.streams) == 0 {
		return coordinator.Ready{}, nil
	}
	v := st.streams[0].acked
	for _, rs := range st.streams[1:] {
		v = min(v, rs.acked)
	}
	if v <= st.acked {
		return coordinator.Ready{}, nil
	}
	ack := coordinator.Ack{Domain: d.domain, Region: region, Term: d.lead.Term, Version: v}
	rd, err := d.co.Step(now, ack)
	if err != nil {
		d.s.log.Warn("the coordinator refused a region's ack", "domain", d.domain, "region", region, "version", v, "err", err)
		return coordinator.Ready{}, err
	}
	st.acked = v
	d.applied(ack)
	return rd, nil
}

// checkReport refuses what the Coordinator would refuse of a report: an
// unknown limit, a bad amount, or one not later than the stream's previous.
func (d *driver) checkReport(rs *regionStream, m coordinator.Report) error {
	if !m.At.After(rs.lastAt) {
		return fmt.Errorf("%w: report of %s at %v, not after %v", coordinator.ErrStale, m.Region, m.At, rs.lastAt)
	}
	for _, ld := range m.Limits {
		if !slices.Contains(d.limits, ld.Limit) {
			return fmt.Errorf("%w %q", coordinator.ErrUnknownLimit, ld.Limit)
		}
		if !validAmount(ld.Admitted) || !validAmount(ld.Rejected) {
			return fmt.Errorf("%w: limit %s: admitted %v, rejected %v", coordinator.ErrBadValue, ld.Limit, ld.Admitted, ld.Rejected)
		}
		for _, kd := range ld.Keys {
			if kd.Key == "" || !validAmount(kd.Admitted) || !validAmount(kd.Rejected) {
				return fmt.Errorf("%w: limit %s: key %q: admitted %v, rejected %v", coordinator.ErrBadValue, ld.Limit, kd.Key, kd.Admitted, kd.Rejected)
			}
		}
	}
	return nil
}

func validAmount(v float64) bool { return v >= 0 && v <= allot.MaxAmount }

// Report intervals, as the Coordinator bounds them: the first report of a
// region is taken to cover defaultReportInterval; the others, the time
// since the previous one, bounded.
const (
	defaultReportInterval = time.Second
	minReportInterval     = 10 * time.Millisecond
	maxReportInterval     = time.Minute
)

func interval(from, to time.Time) time.Duration {
	if from.IsZero() {
		return defaultReportInterval
	}
	return min(max(to.Sub(from), minReportInterval), maxReportInterval)
}

// rates converts a stream's report into rates over the interval since its
// previous report; the first report of a stream gives none.
func rates(rs *regionStream, m coordinator.Report) streamReport {
	sr := streamReport{}
	var perSec float64
	if !rs.lastAt.IsZero() {
		perSec = 1 / interval(rs.lastAt, m.At).Seconds()
	}
	for _, ld := range m.Limits {
		lr := sr[ld.Limit]
		if lr == nil {
			lr = &limitRate{}
			sr[ld.Limit] = lr
		}
		lr.admitted += ld.Admitted * perSec
		lr.rejected += ld.Rejected * perSec
		for _, kd := range ld.Keys {
			if lr.keys == nil {
				lr.keys = map[string]*keyRate{}
			}
			kr := lr.keys[kd.Key]
			if kr == nil {
				kr = &keyRate{}
				lr.keys[kd.Key] = kr
			}
			kr.admitted += kd.Admitted * perSec
			kr.rejected += kd.Rejected * perSec
			kr.near = kr.near || kd.NearLimit || kd.Rejected > 0
		}
	}
	return sr
}

// forwardReport gives the Coordinator one report of the region at at, if
// later than the region's previous one (instances' clocks and reports
// interleave: a report not later only updates its stream's rates): its
// amounts are the sum over the region's streams of their rates times the
// interval since the region's previous report, as the Coordinator takes
// it; a key is near its limit if any stream's latest report says so.
func (d *driver) forwardReport(now time.Time, region string, st *regionState, at time.Time) error {
	if !at.After(st.at) {
		return nil
	}
	dt := interval(st.at, at).Seconds()
	rep := coordinator.Report{Domain: d.domain, Region: region, At: at}
	for _, limit := range d.limits {
		var ld coordinator.LimitDemand
		seen := false
		keys := map[string]*keyRate{}
		for _, rs := range st.streams {
			lr := rs.rates[limit]
			if lr == nil {
				continue
			}
			seen = true
			ld.Admitted += lr.admitted
			ld.Rejected += lr.rejected
			for k, kr := range lr.keys {
				sum := keys[k]
				if sum == nil {
					sum = &keyRate{}
					keys[k] = sum
				}
				sum.admitted += kr.admitted
				sum.rejected += kr.rejected
				sum.near = sum.near || kr.near
			}
		}
		if !seen {
			continue
		}
		ld.Limit = limit
		ld.Admitted, ld.Rejected = amount(ld.Admitted*dt), amount(ld.Rejected*dt)
		for _, k := range sortedKeys(keys) {
			kr := keys[k]
			ld.Keys = append(ld.Keys, coordinator.KeyDemand{Key: k, Admitted: amount(kr.admitted * dt), Rejected: amount(kr.rejected * dt), NearLimit: kr.near})
		}
		rep.Limits = append(rep.Limits, ld)
	}
	if _, err := d.co.Step(now, rep); err != nil {
		return err
	}
	st.at = at
	d.applied(rep)
	return nil
}

func (d *driver) applied(m coordinator.Message) {
	if d.stepped != nil {
		d.stepped(m)
	}
}

func amount(v float64) float64 { return min(v, allot.MaxAmount) }

func sortedKeys(m map[string]*keyRate) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// ready persists rd, then sends its assignments.
func (d *driver) ready(ctx context.Context, rd coordinator.Ready) error {
	if len(rd.Persist) == 0 && len(rd.Send) == 0 {
		return nil
	}
	if len(rd.Persist) > 0 {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := d.s.opts.Store.Persist(pctx, d.lead, d.domain, rd)
		cancel()
		if err != nil {
			return fmt.Errorf("persist assignments: %w", err) // never send what was not persisted
		}
	}
	d.s.metrics.ready(d.domain, rd, d.co.Stats())
	d.send(rd)
	return nil
}

// send sends rd's assignments to every stream of their regions.
func (d *driver) send(rd coordinator.Ready) {
	for _, a := range rd.Send {
		st := d.region(a.Region)
		st.sent = max(st.sent, a.Version)
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	for _, a := range rd.Send {
		m := wire.Assignment(a)
		for _, rs := range d.streams[a.Region] {
			rs.send(m)
		}
	}
}
