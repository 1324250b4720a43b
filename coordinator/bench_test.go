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
