package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestNeverOverAllocates drives a coordinator, 3-5 regions and a network
// that loses, delays, duplicates and reorders messages and partitions
// regions, through random demand, rebalances, leader changes and region
// restarts. After every step, for every limit's default vector and every
// key, the shares the regions apply sum to at most 1 (cluster.check).
func TestNeverOverAllocates(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(3, 5).Draw(rt, "regions")
		regions := make([]string, n)
		for i := range regions {
			regions[i] = fmt.Sprintf("r%d", i)
		}
		floor := rapid.SampledFrom([]float64{0, 0.05, 0.2}).Draw(rt, "floor")
		yaml := fmt.Sprintf(`
domain: api
regions: [%s]
limits:
  - {name: a, match: {user: "*"}, rate: 100/1s, floors: {r0: %g, r1: %g}}
  - {name: b, match: {tenant: "*"}, rate: 100/1s}
`, strings.Join(regions, ", "), floor, floor)
		cfg := Config{
			Period:     2 * time.Second,
			HalfLife:   time.Duration(rapid.IntRange(100, 3000).Draw(rt, "halfLifeMs")) * time.Millisecond,
			DeadAfter:  3 * time.Second,
			HotTTL:     time.Duration(rapid.IntRange(1, 8).Draw(rt, "hotTTLs")) * time.Second,
			Hysteresis: rapid.SampledFrom([]float64{1e-6, 0.01, 0.05}).Draw(rt, "hysteresis"),
			MaxStep:    rapid.SampledFrom([]float64{0.1, 0.5, 1}).Draw(rt, "maxStep"),
			MaxHotKeys: rapid.IntRange(2, 8).Draw(rt, "maxHotKeys"),
		}
		cl := newCluster(rt, yaml, cfg)
		cl.keys = []string{"k0", "k1", "k2", "k3"}
		actions := map[string]func(){
			"report": func() { cl.randomReport(rt) },
			"tick": func() {
				cl.tick(rapid.SampledFrom([]time.Duration{0, 300 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}).Draw(rt, "dt"))
			},
			"deliver":   func() { cl.deliverRandom(rt, false) },
			"duplicate": func() { cl.deliverRandom(rt, true) },
			"settle":    func() { cl.settle() },
			"drop": func() {
				if len(cl.net) > 0 {
					i := rapid.IntRange(0, len(cl.net)-1).Draw(rt, "drop")
					cl.net = slices.Delete(cl.net, i, i+1)
				}
			},
			"partition": func() {
				r := rapid.IntRange(0, n-1).Draw(rt, "partition")
				cl.cut[r] = !cl.cut[r]
			},
			"leader":  func() { cl.newLeader() },
			"restart": func() { cl.restart(rapid.IntRange(0, n-1).Draw(rt, "restart")); cl.check() },
		}
		var names []string // weighted: mostly traffic and progress, now and then a failure
		for name, weight := range map[string]int{"report": 6, "tick": 4, "deliver": 8, "duplicate": 2, "settle": 2,
			"drop": 2, "partition": 1, "leader": 1, "restart": 1} {
			for range weight {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		steps := rapid.IntRange(300, 600).Draw(rt, "steps")
		for range steps {
			actions[rapid.SampledFrom(names).Draw(rt, "action")]()
		}
	})
}

// randomReport puts on the network a report of a random region, with
// random demand for each limit and some keys.
func (cl *cluster) randomReport(rt *rapid.T) {
	r := rapid.IntRange(0, len(cl.d.Regions)-1).Draw(rt, "region")
	cl.at[r] = later(cl.now, cl.at[r])
	rep := Report{Domain: cl.d.Name, Region: cl.d.Regions[r], At: cl.at[r]}
	for _, l := range cl.d.Limits {
		ld := LimitDemand{Limit: l.Name, Admitted: rapid.Float64Range(0, 100).Draw(rt, "admitted")}
		for _, k := range cl.keys {
			if rapid.Bool().Draw(rt, "has "+k) {
				ld.Keys = append(ld.Keys, KeyDemand{
					Key:       k,
					Admitted:  rapid.Float64Range(0, 50).Draw(rt, "key admitted"),
					Rejected:  rapid.SampledFrom([]float64{0, 0, 5}).Draw(rt, "key rejected"),
					NearLimit: rapid.Bool().Draw(rt, "near"),
				})
			}
		}
		rep.Limits = append(rep.Limits, ld)
	}
	cl.net = append(cl.net, envelope{to: -1, from: r, m: rep})
}

func (cl *cluster) deliverRandom(rt *rapid.T, dup bool) {
	if len(cl.net) > 0 {
		cl.deliver(rapid.IntRange(0, len(cl.net)-1).Draw(rt, "message"), dup)
	}
}
