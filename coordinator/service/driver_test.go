package service

import (
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
)

const driverConfig = `
domain: api
regions: [us-east, eu-west]
limits:
  - {name: global, match: {}, rate: 1000/1s}
`

// testDriver is a driver without etcd or gRPC: tests call handle and send
// themselves, and see what reaches the Coordinator.
func testDriver(t *testing.T, now time.Time) (*driver, *[]coordinator.Message) {
	t.Helper()
	cfg, err := allot.ParseConfig("driver.yaml", []byte(driverConfig))
	if err != nil {
		t.Fatal(err)
	}
	const term = 7
	co, err := coordinator.New(now, coordinator.Config{Domain: cfg.Domain("api"), Term: term, Period: time.Second}, coordinator.Snapshot{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: Options{Now: func() time.Time { return now }}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(nil)}
	d := &driver{
		s: s, domain: "api", lead: &etcdstore.Leadership{Term: term}, co: co, limits: []string{"global"},
		inbox: make(chan inbound, 16), done: make(chan struct{}),
		streams: map[string][]*regionStream{}, regions: map[string]*regionState{},
	}
	var got []coordinator.Message
	d.stepped = func(m coordinator.Message) { got = append(got, m) }
	return d, &got
}

// connect attaches a stream as Connect does and lets the driver handle it.
func connect(d *driver, now time.Time, region string, term int64, version uint64) *regionStream {
	rs := d.attach(region, term, version)
	d.send(d.handle(now, <-d.inbox))
	return rs
}

func disconnect(d *driver, now time.Time, rs *regionStream) {
	d.detach(rs)
	d.send(d.handle(now, <-d.inbox))
}

func acks(ms []coordinator.Message) []uint64 {
	var vs []uint64
	for _, m := range ms {
		if a, ok := m.(coordinator.Ack); ok {
			vs = append(vs, a.Version)
		}
	}
	return vs
}

// latest drains rs's outbound messages and returns the version of the
// latest assignment among them (0 for none).
func latest(t *testing.T, rs *regionStream) uint64 {
	t.Helper()
	var v uint64
	for {
		select {
		case m := <-rs.out:
			if rj := m.GetRejection(); rj != nil {
				t.Fatalf("rejection: %s", rj.GetMessage())
			}
			v = max(v, m.GetAssignment().GetVersion())
		default:
			return v
		}
	}
}

func TestDriverAcksWhenEveryInstanceAcked(t *testing.T) {
	now := time.Unix(1000, 0)
	d, got := testDriver(t, now)
	a := connect(d, now, "us-east", 0, 0)
	b := connect(d, now, "us-east", 0, 0)
	eu := connect(d, now, "eu-west", 0, 0)
	// Demand in us-east makes the coordinator move shares to it.
	for i, at := range []time.Time{now.Add(-2 * time.Second), now.Add(-time.Second)} {
		for _, rs := range []*regionStream{a, b, eu} {
			n := 900.0
			if rs == eu {
				n = 0
			}
			d.post(rs, coordinator.Report{Domain: "api", Region: rs.region, At: at.Add(time.Duration(i) * time.Millisecond),
				Limits: []coordinator.LimitDemand{{Limit: "global", Admitted: n}}})
			d.send(d.handle(now, <-d.inbox))
		}
	}
	ack := func(rs *regionStream, v uint64) {
		d.post(rs, coordinator.Ack{Domain: "api", Region: rs.region, Term: 7, Version: v})
		d.send(d.handle(now, <-d.inbox))
	}
	// eu-west lowers first; once it acked, us-east is raised.
	d.send(d.co.Tick(now))
	latest(t, a)
	latest(t, b)
	ve := latest(t, eu)
	if ve == 0 {
		t.Fatal("eu-west got no assignment")
	}
	ack(eu, ve)
	*got = nil
	va, vb := latest(t, a), latest(t, b)
	if va == 0 || va != vb {
		t.Fatalf("instances of us-east got versions %d and %d; want the same assignment", va, vb)
	}
	ack(a, va)
	if vs := acks(*got); len(vs) != 0 {
		t.Fatalf("the coordinator got acks %v after one of two instances acked", vs)
	}
	// Unacknowledged, the shares go again to both at the next rebalance.
	now = now.Add(2 * time.Second)
	d.send(d.co.Tick(now))
	v2, v2b := latest(t, a), latest(t, b)
	if v2 <= va || v2 != v2b {
		t.Fatalf("instances of us-east got versions %d and %d again; want the same, above %d", v2, v2b, va)
	}
	ack(a, va) // repeated
	ack(b, va)
	if vs := acks(*got); len(vs) != 1 || vs[0] != va {
		t.Fatalf("the coordinator got acks %v; want [%d] once both instances acked", vs, va)
	}

	// A third instance that applied nothing of this term holds the next
	// version back until it acks; its Hello's version counts as acked.
	*got = nil
	c := connect(d, now, "us-east", 3, 1) // an older term: counts as nothing
	ack(a, v2)
	ack(b, v2)
	if vs := acks(*got); len(vs) != 0 {
		t.Fatalf("the coordinator got acks %v while a connected instance had not acked", vs)
	}
	// Once it goes, the others' ack is the region's (the documented gap).
	disconnect(d, now, c)
	if vs := acks(*got); len(vs) != 1 || vs[0] != v2 {
		t.Fatalf("after the lagging instance left, the coordinator got acks %v; want [%d]", vs, v2)
	}
	// A Hello naming a version never sent is refused, and counts as nothing.
	*got = nil
	bad := d.attach("us-east", 7, v2+100)
	d.send(d.handle(now, <-d.inbox))
	if m := <-bad.out; m.GetRejection() == nil {
		t.Fatalf("a hello of a version never sent: got %v, want a rejection", m)
	}
	if bad.acked != 0 || len(*got) != 0 {
		t.Fatalf("a bad hello counted: acked %d, the coordinator got %v", bad.acked, *got)
	}
}

func TestDriverRefusesBadAcks(t *testing.T) {
	now := time.Unix(1000, 0)
	d, got := testDriver(t, now)
	a := connect(d, now, "us-east", 0, 0)
	for _, v := range []coordinator.Ack{
		{Domain: "api", Region: "us-east", Term: 7, Version: 1}, // never sent
		{Domain: "api", Region: "us-east", Term: 8, Version: 0},
		{Domain: "api", Region: "us-east", Term: 6, Version: 1},
	} {
		d.post(a, v)
		d.send(d.handle(now, <-d.inbox))
		select {
		case m := <-a.out:
			if m.GetRejection() == nil {
				t.Fatalf("%+v: got %v, want a rejection", v, m)
			}
		default:
			t.Fatalf("%+v: not refused", v)
		}
	}
	if len(*got) != 0 {
		t.Fatalf("the coordinator got %v", *got)
	}
}

func TestDriverSumsInstancesDemand(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d, got := testDriver(t, t0)
	a := connect(d, t0, "us-east", 0, 0)
	b := connect(d, t0, "us-east", 0, 0)
	report := func(rs *regionStream, at time.Time, admitted, rejected float64, near bool) *coordinator.Report {
		t.Helper()
		*got = nil
		d.post(rs, coordinator.Report{Domain: "api", Region: "us-east", At: at, Limits: []coordinator.LimitDemand{{
			Limit: "global", Admitted: admitted, Rejected: rejected,
			Keys: []coordinator.KeyDemand{{Key: "user=1", Admitted: admitted, NearLimit: near}},
		}}})
		d.send(d.handle(t0, <-d.inbox))
		select {
		case m := <-rs.out:
			t.Fatalf("report at %v: %v", at, m)
		default:
		}
		if len(*got) == 0 {
			return nil
		}
		r := (*got)[0].(coordinator.Report)
		return &r
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// First reports give no rate.
	if r := report(a, ms(0), 100, 0, false); r == nil || r.Limits[0].Admitted != 0 {
		t.Fatalf("first report forwarded as %+v; want a report without demand", r)
	}
	if r := report(b, ms(500), 40, 0, true); r == nil || r.Limits[0].Admitted != 0 || !r.Limits[0].Keys[0].NearLimit {
		t.Fatalf("first report of the second instance forwarded as %+v", r)
	}
	// a: 100 over 1s → 100/s; the region's previous report was at 500ms.
	r := report(a, ms(1000), 100, 10, false)
	if r == nil || !near(r.Limits[0].Admitted, 50) || !near(r.Limits[0].Rejected, 5) || !r.Limits[0].Keys[0].NearLimit {
		t.Fatalf("forwarded %+v; want admitted 50, rejected 5 (100/s, 10/s over 0.5s), key near its limit", r)
	}
	// b: 40 over 1s → 40/s; with a's 100/s over 0.5s: 70.
	r = report(b, ms(1500), 40, 0, false)
	if r == nil || !near(r.Limits[0].Admitted, 70) || !near(r.Limits[0].Keys[0].Admitted, 70) || r.Limits[0].Keys[0].NearLimit || !r.At.Equal(ms(1500)) {
		t.Fatalf("forwarded %+v; want admitted 70 at 1.5s, key no longer near its limit", r)
	}
	// A report not later than the region's previous one only updates the
	// stream's rate; one not later than the stream's own is refused.
	if r := report(a, ms(1400), 20, 0, false); r != nil {
		t.Fatalf("forwarded %+v at an earlier time than the region's previous report", r)
	}
	d.post(a, coordinator.Report{Domain: "api", Region: "us-east", At: ms(1400)})
	d.send(d.handle(t0, <-d.inbox))
	if m := <-a.out; m.GetRejection() == nil {
		t.Fatalf("a repeated report: got %v, want a rejection", m)
	}
	// a's 20 over 0.4s is 50/s; when b leaves, only a counts.
	disconnect(d, t0, b)
	r = report(a, ms(2400), 100, 0, false)
	if r == nil || !near(r.Limits[0].Admitted, 100*0.9) {
		t.Fatalf("forwarded %+v; want admitted 90 (100/s over 0.9s)", r)
	}
	if s := d.co.Stats(); s.Rejected != 0 {
		t.Fatalf("the coordinator refused %d messages", s.Rejected)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
