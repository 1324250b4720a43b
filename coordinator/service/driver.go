package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/wire"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// driver owns one led domain's coordinator.Fleet and moves its data: it
// hands the Fleet what the instances' Connect streams bring (attach,
// detach, reports, acks), ticks it, persists what it returns and sends
// each assignment to the stream of the instance it names. Every rule about
// instances (a region's ack, their parts of its allowance, grant expiry)
// lives in the Fleet; all of the driver's state is owned by run's
// goroutine but the streams map.
type driver struct {
	s      *Server
	domain string
	lead   *etcdstore.Leadership
	fleet  *coordinator.Fleet // owned by run's goroutine
	inbox  chan inbound
	done   chan struct{} // closed when the driver stops

	reload     chan struct{} // closed by SetConfig
	reloadOnce sync.Once

	streams map[streamID]*regionStream // guarded by s.mu: the latest stream of each instance
	stopped bool                       // guarded by s.mu: run has closed every stream
	legacy  uint64                     // guarded by s.mu: ids made up for streams without an instance

	stepped func(coordinator.Message) // if set, sees every message the Fleet applied (tests)
}

type streamID struct{ region, instance string }

// regionStream is one instance's Connect stream of a region.
type regionStream struct {
	region   string
	instance string
	legacy   bool // the Hello named no instance
	out      chan *allotv1.CoordinatorMessage
	closed   chan struct{} // closed when the driver stops
	kicked   chan struct{} // closed to end the stream (kick)
	kickOnce sync.Once
}

// kick ends the stream; the instance reconnects.
func (r *regionStream) kick() { r.kickOnce.Do(func() { close(r.kicked) }) }

func (r *regionStream) send(m *allotv1.CoordinatorMessage) bool {
	select {
	case r.out <- m:
		return true
	default:
		return false // a slow instance: it will get the next period's grant
	}
}

func (r *regionStream) reject(err error) {
	r.send(&allotv1.CoordinatorMessage{Msg: &allotv1.CoordinatorMessage_Rejection{Rejection: &allotv1.Rejection{Message: err.Error()}}})
}

// inbound is what Connect hands to the driver: a stream attaching (with
// its Hello) or detaching, or a message of a stream.
type inbound struct {
	rs      *regionStream
	kind    inboundKind
	msg     coordinator.Message // for inMessage; the Hello's ack for inAttach
	weights []coordinator.Weight
}

type inboundKind int

const (
	inMessage inboundKind = iota
	inAttach
	inDetach
)

// attach adds an instance's stream of region (a later stream of the same
// instance replaces the earlier) and tells run, with its Hello.
func (d *driver) attach(region, instance string, hello coordinator.Ack, weights []coordinator.Weight) *regionStream {
	rs := &regionStream{region: region, instance: instance, out: make(chan *allotv1.CoordinatorMessage, 16), closed: make(chan struct{}), kicked: make(chan struct{})}
	d.s.mu.Lock()
	if d.stopped {
		close(rs.closed)
		d.s.mu.Unlock()
		return rs
	}
	if instance == "" {
		d.legacy++
		rs.instance, rs.legacy = fmt.Sprintf("unnamed-%d", d.legacy), true
	}
	d.streams[streamID{region, rs.instance}] = rs
	d.s.mu.Unlock()
	hello.Domain, hello.Region, hello.Instance = d.domain, region, rs.instance
	d.postIn(inbound{rs: rs, kind: inAttach, msg: hello, weights: weights})
	return rs
}

func (d *driver) detach(rs *regionStream) {
	d.s.mu.Lock()
	id := streamID{rs.region, rs.instance}
	current := d.streams[id] == rs
	if current {
		delete(d.streams, id)
	}
	d.s.mu.Unlock()
	if current {
		d.postIn(inbound{rs: rs, kind: inDetach})
	}
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

// run steps and ticks the Fleet until leadership is lost, ctx ends or a
// fenced write fails.
func (d *driver) run(ctx context.Context) error {
	defer func() {
		d.s.mu.Lock()
		d.stopped = true
		for id, rs := range d.streams {
			close(rs.closed)
			delete(d.streams, id)
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
			before := d.fleet.Coordinator().Stats().Rebalances
			rd = d.fleet.Tick(d.s.opts.Now())
			if d.fleet.Coordinator().Stats().Rebalances > before {
				d.s.metrics.rebalanced(d.domain, time.Since(start))
			}
		}
		if err := d.ready(ctx, rd); err != nil {
			return err
		}
	}
}

// current reports whether rs is its instance's latest stream.
func (d *driver) current(rs *regionStream) bool {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	return d.streams[streamID{rs.region, rs.instance}] == rs
}

// handle applies one inbound event and returns what the Fleet asks.
func (d *driver) handle(now time.Time, in inbound) coordinator.Ready {
	switch in.kind {
	case inAttach:
		if !d.current(in.rs) {
			return coordinator.Ready{} // replaced before it was handled
		}
		rd, err := d.fleet.Attach(now, in.rs.region, in.rs.instance, in.rs.legacy, in.msg.(coordinator.Ack), in.weights)
		if err != nil {
			in.rs.reject(err)
		}
		return rd
	case inDetach:
		return d.fleet.Detach(now, in.rs.region, in.rs.instance)
	}
	if !d.current(in.rs) {
		return coordinator.Ready{} // a late message of a replaced or detached stream
	}
	var err error
	switch m := in.msg.(type) {
	case coordinator.Ack:
		m.Instance = in.rs.instance
		in.msg = m
	case coordinator.Report:
		m.Instance = in.rs.instance
		in.msg = m
	}
	rd, err := d.fleet.Step(now, in.msg)
	d.s.metrics.message(d.domain, in.msg, err)
	if err != nil {
		d.s.log.Debug("message refused", "domain", d.domain, "region", in.rs.region, "instance", in.rs.instance, "err", err)
		in.rs.reject(err)
	} else if d.stepped != nil {
		d.stepped(in.msg)
	}
	return rd
}

// ready persists rd, then sends its assignments.
func (d *driver) ready(ctx context.Context, rd coordinator.Ready) error {
	if len(rd.Persist) == 0 && len(rd.Send) == 0 && rd.Members == nil {
		return nil
	}
	if len(rd.Persist) > 0 || rd.Members != nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := d.s.opts.Store.Persist(pctx, d.lead, d.domain, rd)
		cancel()
		if err != nil {
			return fmt.Errorf("persist assignments: %w", err) // never send what was not persisted
		}
	}
	d.s.metrics.ready(d.domain, rd, d.fleet.Coordinator().Stats())
	d.send(rd)
	return nil
}

// send sends each of rd's assignments to the stream of its instance.
func (d *driver) send(rd coordinator.Ready) {
	// A region's assignment goes to each of its instances with the same
	// shares: convert them once.
	converted := map[*coordinator.Share][]*allotv1.Share{}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	for _, a := range rd.Send {
		rs := d.streams[streamID{a.Region, a.Instance}]
		if rs == nil {
			continue
		}
		var shares []*allotv1.Share
		if len(a.Shares) > 0 {
			shares = converted[&a.Shares[0]]
			if shares == nil {
				shares = wire.Shares(a.Shares)
				converted[&a.Shares[0]] = shares
			}
		}
		if rs.legacy {
			if a.Version == 0 && len(a.Shares) == 0 {
				continue // a grant only
			}
			a.Instance, a.Grant = "", nil // it knows no grants
		}
		if !rs.send(wire.AssignmentWith(a, shares)) && a.Grant != nil && a.Grant.Full {
			rs.kick() // it applies nothing before a full grant: it must reconnect for another
		}
	}
}
