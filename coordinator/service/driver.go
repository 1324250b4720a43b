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

// driver owns one led domain's Coordinator.
type driver struct {
	s      *Server
	domain string
	lead   *etcdstore.Leadership
	co     *coordinator.Coordinator // owned by run's goroutine
	inbox  chan coordinator.Message
	done   chan struct{} // closed when the driver stops

	reload     chan struct{} // closed by SetConfig
	reloadOnce sync.Once

	streams map[string]*regionStream // guarded by s.mu
}

// regionStream is the outbound side of one region's Connect stream.
type regionStream struct {
	region string
	out    chan *allotv1.CoordinatorMessage
	closed chan struct{} // closed when the driver stops or a newer stream replaces it
}

func (r *regionStream) send(m *allotv1.CoordinatorMessage) bool {
	select {
	case r.out <- m:
		return true
	default:
		return false // a slow region: it will get the next period's assignment
	}
}

func (r *regionStream) reject(err error) {
	r.send(&allotv1.CoordinatorMessage{Msg: &allotv1.CoordinatorMessage_Rejection{Rejection: &allotv1.Rejection{Message: err.Error()}}})
}

func (d *driver) attach(region string) *regionStream {
	rs := &regionStream{region: region, out: make(chan *allotv1.CoordinatorMessage, 16), closed: make(chan struct{})}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if old := d.streams[region]; old != nil {
		close(old.closed)
	}
	d.streams[region] = rs
	return rs
}

func (d *driver) detach(rs *regionStream) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if d.streams[rs.region] == rs {
		delete(d.streams, rs.region)
		close(rs.closed)
	}
}

// post hands a message to the driver, unless it has stopped.
func (d *driver) post(m coordinator.Message) {
	select {
	case d.inbox <- m:
	case <-d.done:
	}
}

// run steps and ticks the coordinator until leadership is lost, ctx ends
// or a fenced write fails.
func (d *driver) run(ctx context.Context) error {
	defer func() {
		d.s.mu.Lock()
		for r, rs := range d.streams {
			close(rs.closed)
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
		case m := <-d.inbox:
			var err error
			rd, err = d.co.Step(d.s.opts.Now(), m)
			d.s.metrics.message(d.domain, m, err)
			if err != nil {
				d.s.log.Debug("message refused", "domain", d.domain, "err", err)
				d.rejectTo(m, err)
				continue
			}
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
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	for _, a := range rd.Send {
		if rs := d.streams[a.Region]; rs != nil {
			rs.send(wire.Assignment(a))
		}
	}
	return nil
}

func (d *driver) rejectTo(m coordinator.Message, err error) {
	var region string
	switch m := m.(type) {
	case coordinator.Report:
		region = m.Region
	case coordinator.Ack:
		region = m.Region
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if rs := d.streams[region]; rs != nil {
		rs.reject(err)
	}
}
