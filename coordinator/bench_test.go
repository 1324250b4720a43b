package coordinator

import (
	"runtime"
	"strconv"
	"testing"
)

const fiveRegions = `
domain: api
regions: [us, eu, ap, sa, af]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s, floors: {us: 0.02, eu: 0.02, ap: 0.02, sa: 0.02, af: 0.02}}
`

// BenchmarkRebalance measures one full rebalance of 100,000 hot keys in 5
// regions: the Tick that sets new targets and sends the lowerings, then
// the acks of every region, which grant the raises. Demand moves between
// two regions every op, so every key's shares move. B/key is the heap the
// coordinator holds per hot key (targets: ≤ 100 ms per op, ≤ 300 B/key).
func BenchmarkRebalance(b *testing.B) {
	const keys = 100_000
	d := mustDomain(b, fiveRegions)
	// reports[p][r] is region r's report in phase p: in phase p, region p
	// has 90% of every key's demand and reports them near their limit.
	var reports [2][]Report
	for p := range reports {
		for r, region := range d.Regions {
			kd := make([]KeyDemand, keys)
			for i := range kd {
				kd[i] = KeyDemand{Key: "per-user:user=" + strconv.Itoa(i), Admitted: 1, NearLimit: r == p}
				if r == p {
					kd[i].Admitted = 36
				}
			}
			reports[p] = append(reports[p], Report{Domain: d.Name, Region: region, Limits: []LimitDemand{
				{Limit: "per-user", Admitted: kd[0].Admitted * keys, Keys: kd},
			}})
		}
	}
	now := t0
	// rebalance feeds the reports of phase p, ticks and acks until nothing
	// is left to send; only the tick and the acks are timed.
	rebalance := func(c *Coordinator, p int) {
		b.StopTimer()
		now = now.Add(DefaultPeriod)
		for _, rep := range reports[p] {
			rep.At = now
			if _, err := c.Step(now, rep); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		rd := c.Tick(now)
		for len(rd.Send) > 0 {
			var next Ready
			for _, a := range rd.Send {
				r, err := c.Step(now, Ack{Domain: a.Domain, Region: a.Region, Term: a.Term, Version: a.Version})
				if err != nil {
					b.Fatal(err)
				}
				next.Send = append(next.Send, r.Send...)
			}
			rd = next
		}
	}

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	c, err := New(now, Config{Domain: d, Term: 1}, Snapshot{})
	if err != nil {
		b.Fatal(err)
	}
	rebalance(c, 0)
	rebalance(c, 0)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if n := c.Stats().HotKeys; n != keys {
		b.Fatalf("%d hot keys, want %d", n, keys)
	}
	perKey := float64(int64(ms.HeapAlloc)-int64(before)) / keys

	b.ResetTimer()
	for i := range b.N {
		rebalance(c, 1-i%2)
	}
	b.ReportMetric(perKey, "B/key")
}

const benchThreeRegions = `
domain: api
regions: [us, eu, ap]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s, floors: {us: 0.05, eu: 0.05, ap: 0.05}}
`

// BenchmarkFleetRebalance measures one full rebalance of a Fleet of 3
// regions × 200 instances with 10,000 hot keys of a local limit: every
// instance reports, then the Tick that retargets regions and instances'
// weights, then the acks of every instance that got an assignment, until
// nothing is left to send. Demand moves between two regions (and between
// the halves of each region's instances) every op. msgs/op counts the
// assignments sent to instances; B/instance is the heap the Fleet holds
// per instance (targets: ≤ 200 ms per op).
func BenchmarkFleetRebalance(b *testing.B) {
	const (
		perRegion = 200
		keys      = 10_000
	)
	d := mustDomain(b, benchThreeRegions)
	type inst struct{ region, id string }
	var insts []inst
	for _, r := range d.Regions {
		for i := range perRegion {
			insts = append(insts, inst{r, r + "-" + strconv.Itoa(i)})
		}
	}
	// reports[p][i] is instance i's report in phase p: region p's first
	// half of instances carries most of the demand, and its keys are hot.
	var reports [2][]Report
	for p := range reports {
		for i, in := range insts {
			hot := in.region == d.Regions[p] && i%perRegion < perRegion/2
			kd := make([]KeyDemand, 0, keys/perRegion)
			for k := i % perRegion; k < keys; k += perRegion {
				kd = append(kd, KeyDemand{Key: "per-user:user=" + strconv.Itoa(k), Admitted: 1, NearLimit: hot})
			}
			adm := 1.0
			if hot {
				adm = 50
			}
			reports[p] = append(reports[p], Report{Domain: d.Name, Region: in.region, Instance: in.id, Limits: []LimitDemand{
				{Limit: "per-user", Admitted: adm * float64(len(kd)), Keys: kd},
			}})
		}
	}
	now := t0
	msgs := 0
	var f *Fleet
	acks := func(rd Ready) {
		for len(rd.Send) > 0 {
			var next Ready
			for _, a := range rd.Send {
				msgs++
				r, err := f.Step(now, Ack{Domain: a.Domain, Region: a.Region, Instance: a.Instance, Term: a.Term, Version: a.Version, Seq: a.Grant.Seq})
				if err != nil {
					b.Fatal(err)
				}
				next.Send = append(next.Send, r.Send...)
			}
			rd = next
		}
	}
	rebalance := func(p int) {
		b.StopTimer()
		now = now.Add(DefaultPeriod)
		for _, rep := range reports[p] {
			rep.At = now
			if _, err := f.Step(now, rep); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		acks(f.Tick(now))
	}

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	f, err := NewFleet(now, FleetConfig{Coordinator: Config{Domain: d, Term: 1}}, Snapshot{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, in := range insts {
		rd, err := f.Attach(now, in.region, in.id, false, Ack{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		acks(rd)
	}
	rebalance(0)
	rebalance(0)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	perInstance := float64(int64(ms.HeapAlloc)-int64(before)) / float64(len(insts))

	msgs = 0
	b.ResetTimer()
	for i := range b.N {
		rebalance(1 - i%2)
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
	b.ReportMetric(perInstance, "B/instance")
}
