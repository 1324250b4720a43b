package coordinator

import (
	"runtime"
	"strconv"
	"testing"
	"time"
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
// regions × 200 instances with hot keys of a local limit per instance:
// every instance reports (untimed), then the Tick that retargets regions,
// instances' weights and their weights of their own for hot keys, then
// the acks of every instance that got an assignment, until nothing is
// left to send. Each region has 10,000 hot keys, each reaching 4 of its
// 200 instances (so each instance reports 200 of them near their limit,
// and divides each key with 3 others: 40,000 weights of their own per
// region); demand moves every op between two regions and, for every key,
// between its instances. msgs/op counts the assignments sent to
// instances (a region's assignment to each of its instances, grants,
// renewals); B/instance is the heap the Fleet holds per instance, B/cell
// the heap per weight of their own for a hot key (what the hot keys add,
// the Coordinator's vectors of them included, over the weights of their
// own). Targets: ≤ 200 ms per op.
func BenchmarkFleetRebalance(b *testing.B) {
	const (
		perRegion = 200
		keys      = 10_000 // per region: the same keys in every region
		reach     = 4      // instances of its region a key reaches
	)
	d := mustDomain(b, benchThreeRegions)
	type inst struct {
		region, id string
		j          int // index in its region
	}
	var insts []inst
	for _, r := range d.Regions {
		for j := range perRegion {
			insts = append(insts, inst{r, r + "-" + strconv.Itoa(j), j})
		}
	}
	names := make([]string, keys)
	for k := range names {
		names[k] = "per-user:user=" + strconv.Itoa(k)
	}
	// reports[p][i] is instance i's report in phase p: region p carries
	// most of the demand; of the instances a key reaches, those of the
	// first half (phase 0) or the second (phase 1) carry most of its
	// demand.
	report := func(p int, in inst, withKeys bool) Report {
		adm := 100.0
		if in.region == d.Regions[p] {
			adm = 1000
		}
		var kd []KeyDemand
		if withKeys {
			kd = make([]KeyDemand, 0, keys*reach/perRegion)
			group := perRegion / reach
			heavy := in.j/group < reach/2 == (p == 0)
			for k := in.j % group; k < keys; k += group {
				n := 1.0
				if heavy {
					n = 20
				}
				kd = append(kd, KeyDemand{Key: names[k], Admitted: n, Rejected: 1, NearLimit: true})
			}
		}
		return Report{Domain: d.Name, Region: in.region, Instance: in.id, Limits: []LimitDemand{{Limit: "per-user", Admitted: adm, Keys: kd}}}
	}
	var reports [2][]Report
	for p := range reports {
		for _, in := range insts {
			reports[p] = append(reports[p], report(p, in, true))
		}
	}
	now := t0
	msgs := 0
	acks := func(f *Fleet, rd Ready) {
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
	rebalance := func(f *Fleet, p int, reps []Report) {
		b.StopTimer()
		now = now.Add(DefaultPeriod)
		for _, rep := range reps {
			rep.At = now
			if _, err := f.Step(now, rep); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		acks(f, f.Tick(now))
	}
	// setup returns a Fleet with every instance attached and two
	// rebalances done, and the heap it holds.
	setup := func(withKeys bool) (*Fleet, int64) {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		f, err := NewFleet(now, FleetConfig{Coordinator: Config{Domain: d, Term: 1}}, Snapshot{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, in := range insts {
			rd, err := f.Attach(now, in.region, in.id, false, Ack{}, []Weight{KeyAware})
			if err != nil {
				b.Fatal(err)
			}
			acks(f, rd)
		}
		for range 4 {
			reps := reports[0]
			if !withKeys {
				reps = nil
				for _, in := range insts {
					reps = append(reps, report(0, in, false))
				}
			}
			rebalance(f, 0, reps)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return f, int64(ms.HeapAlloc) - int64(before)
	}
	f0, heap0 := setup(false)
	perInstance := float64(heap0) / float64(len(insts))
	runtime.KeepAlive(f0)
	f0 = nil
	f, heap := setup(true)
	st := f.Stats()
	if st.KeyWeights != 3*keys*reach {
		b.Fatalf("%d weights of their own for hot keys, want %d", st.KeyWeights, 3*keys*reach)
	}
	if st.RestFactors != 3*keys {
		b.Fatalf("%d hot keys with a rest factor, want %d", st.RestFactors, 3*keys)
	}
	perCell := float64(heap-heap0) / float64(st.KeyWeights)

	msgs = 0
	b.ResetTimer()
	for i := range b.N {
		p := 1 - i%2
		rebalance(f, p, reports[p])
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
	b.ReportMetric(perInstance, "B/instance")
	b.ReportMetric(perCell, "B/cell")
}

// BenchmarkInstanceApply measures what an instance of a region with
// 100,000 hot keys of a local limit does for a renewal of its grant, a
// new weight for the limit, and an assignment that changes one key's
// share: proportional to what changed (for a renewal or one key, well
// under a millisecond and no allocation per hot key).
func BenchmarkInstanceApply(b *testing.B) {
	const keys = 100_000
	d := mustDomain(b, benchThreeRegions)
	x, err := NewInstance(d, "us", "i")
	if err != nil {
		b.Fatal(err)
	}
	x.Shares()
	shares := []Share{{Limit: "per-user", Value: 0.5}}
	for k := range keys {
		shares = append(shares, Share{Limit: "per-user", Key: "per-user:user=" + strconv.Itoa(k), Value: 0.3})
	}
	weight := 0.25
	grant := func(seq, version uint64, shares []Share) Assignment {
		return Assignment{Domain: d.Name, Region: "us", Term: 1, Version: version, Instance: "i", Shares: shares,
			Grant: &Grant{Seq: seq, Expires: t0.Add(time.Hour), Full: seq == 1, Weights: []Weight{{Limit: "per-user", Value: weight}}}}
	}
	if _, _, err := x.Apply(t0, grant(1, 1, shares)); err != nil {
		b.Fatal(err)
	}
	seq, version := uint64(1), uint64(1)
	b.Run("renewal", func(b *testing.B) {
		for range b.N {
			seq++
			if _, _, err := x.Apply(t0, grant(seq, 0, nil)); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A new weight for the limit changes what it applies to every hot
	// key: that one is proportional to them.
	b.Run("weight", func(b *testing.B) {
		for range b.N {
			seq++
			weight = 0.55 - weight // 0.3, 0.25, …
			if out, _, err := x.Apply(t0, grant(seq, 0, nil)); err != nil || len(out) != keys+1 {
				b.Fatal(len(out), err)
			}
		}
	})
	b.Run("one key", func(b *testing.B) {
		for range b.N {
			seq++
			version++
			s := []Share{{Limit: "per-user", Key: "per-user:user=7", Value: float64(version%2) * 0.1}}
			if out, _, err := x.Apply(t0, grant(seq, version, s)); err != nil || len(out) != 1 {
				b.Fatal(len(out), err)
			}
		}
	})
}
