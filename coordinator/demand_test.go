package coordinator

import (
	"math"
	"testing"
	"time"
)

// twoRegions is a limit of 100/s between two regions without floors.
const twoRegions = `
domain: api
regions: [us, eu]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s}
`

// run advances the cluster in steps of 250 ms for d: at each step every
// region r with every[r] > 0 whose report is due reports rate(r, t) × its
// interval for the limit, then the coordinator ticks.
func (cl *cluster) run(d time.Duration, every []time.Duration, rate func(r int, t time.Duration) float64) {
	const step = 250 * time.Millisecond
	for range int(d / step) {
		cl.now = cl.now.Add(step)
		t := cl.now.Sub(t0)
		for r, e := range every {
			if e > 0 && t%e == 0 {
				cl.report(r, rate(r, t)*e.Seconds(), nil)
			}
		}
		cl.settle()
		cl.tick(0)
		cl.settle()
	}
}

// TestDemandIndependentOfReportInterval: two regions with the same rate,
// one reporting every 500 ms and one every 2 s, get the same share: demand
// is a rate averaged in time, not weighed by how often or how recently a
// region reported.
func TestDemandIndependentOfReportInterval(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	cl.run(20*time.Second, []time.Duration{500 * time.Millisecond, 2 * time.Second},
		func(int, time.Duration) float64 { return 80 })
	near(t, "same rate", cl.shares(""), []float64{0.5, 0.5})
}

// TestNoiseMovesNothing: a region's rate that varies by a few percent from
// report to report (noise) moves no share once the split has settled.
func TestNoiseMovesNothing(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	noisy := func(r int, t time.Duration) float64 {
		base := []float64{90, 60}[r]
		return base * (1 + 0.04*math.Sin(float64(t)/float64(time.Second)*2.3+float64(r)))
	}
	cl.run(10*time.Second, []time.Duration{time.Second, time.Second}, noisy)
	v := cl.c.Stats().Version
	cl.run(30*time.Second, []time.Duration{time.Second, time.Second}, noisy)
	near(t, "settled", cl.shares(""), []float64{0.6, 0.4})
	if sent := cl.c.Stats().Version - v; sent > 4 {
		t.Fatalf("%d assignments in 30 s of noise", sent)
	}
}

// TestShiftWithinTwoPeriods: a demand shift is taken at once, not
// averaged in: shares are within 0.05 of the new split within two
// rebalance periods (4 s), though demand is averaged over 2 s.
func TestShiftWithinTwoPeriods(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	shift := 10 * time.Second
	rate := func(r int, t time.Duration) float64 {
		if t > shift {
			return []float64{30, 120}[r]
		}
		return []float64{120, 30}[r]
	}
	cl.run(shift, []time.Duration{time.Second, time.Second}, rate)
	near(t, "before", cl.shares(""), []float64{0.8, 0.2})
	cl.run(4*time.Second, []time.Duration{time.Second, time.Second}, rate)
	near(t, "two periods after", cl.shares(""), []float64{0.2, 0.8})
}

// TestSmallShiftNotFrozen: a sustained shift of 10% of demand (45/55 to
// 55/45), within noise of a single report, is followed: hysteresis does
// not freeze the old split.
func TestSmallShiftNotFrozen(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	rate := func(r int, t time.Duration) float64 {
		if t > 10*time.Second {
			return []float64{60.5, 49.5}[r]
		}
		return []float64{49.5, 60.5}[r]
	}
	cl.run(10*time.Second, []time.Duration{time.Second, time.Second}, rate)
	near(t, "45/55", cl.shares(""), []float64{0.45, 0.55})
	cl.run(6*time.Second, []time.Duration{time.Second, time.Second}, rate)
	got := cl.shares("")
	if math.Abs(got[0]-0.55) > 0.02 {
		t.Fatalf("shares %.4f six seconds after a 45/55 → 55/45 shift, want 0.55/0.45 ± 0.02", got)
	}
}

// TestBurstKeepsShare: eu bursts to 150/s for 2 s every 10 s while us
// offers a steady 50/s of a 100/s limit. Between bursts us keeps its use
// and headroom and eu keeps the rest for its next burst (its claim), and
// a burst moves nothing (it is over before moved share would count).
func TestBurstKeepsShare(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	rate := func(r int, t time.Duration) float64 {
		if r == 0 {
			return 50
		}
		if p := t % (10 * time.Second); p > 5*time.Second && p <= 7*time.Second {
			return 150
		}
		return 0
	}
	cl.run(30*time.Second, []time.Duration{time.Second, time.Second}, rate)
	for s := 0; s < 10; s++ {
		cl.run(time.Second, []time.Duration{time.Second, time.Second}, rate)
		near(t, "between and during bursts", cl.shares(""), []float64{0.55, 0.45})
	}
}

// TestNewLeaderNoLearning: demand moves from us to eu while no leader
// runs; the new leader follows it at the regions' first reports.
func TestNewLeaderNoLearning(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	cl.run(10*time.Second, []time.Duration{time.Second, time.Second}, func(r int, _ time.Duration) float64 {
		return []float64{90, 10}[r]
	})
	near(t, "before", cl.shares(""), []float64{0.9, 0.1})
	cl.net = nil
	cl.now = cl.now.Add(5 * time.Second) // no leader
	cl.newLeader()
	cl.run(2*time.Second, []time.Duration{time.Second, time.Second}, func(r int, _ time.Duration) float64 {
		return []float64{10, 90}[r]
	})
	near(t, "after the first reports", cl.shares(""), []float64{0.1, 0.9})
}

// TestSilentRegionMeasuredAgain: the first report of a region silent for
// longer than DeadAfter covers an interval the coordinator does not know
// (its reports were lost): it measures nothing, and the next one does.
func TestSilentRegionMeasuredAgain(t *testing.T) {
	cl := newCluster(t, twoRegions, Config{})
	every := []time.Duration{time.Second, time.Second}
	rate := func(int, time.Duration) float64 { return 50 }
	cl.run(6*time.Second, every, rate)
	cl.cut[1] = true
	cl.run(8*time.Second, every, rate)
	cl.cut[1] = false
	cl.run(3*time.Second, every, rate)
	near(t, "healed", cl.shares(""), []float64{0.5, 0.5})
	if d := float64(cl.c.limits[0].def[1].demand); math.Abs(d-50) > 5 {
		t.Fatalf("eu's demand %v after it was heard again, want 50 (not its report over the silence)", d)
	}
}

// threeLong is a limit of 1000 per 10 s, a window longer than the period,
// among three regions without floors.
const threeLong = `
domain: api
regions: [us, eu, ap]
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000/10s, algorithm: sliding_window}
`

// TestSaturatedLongWindowHoldsItsSplit: three regions each offer 50/s of a
// limit of 100/s over 10 s windows, with noise of ±20 %. Every region uses
// more than its share whatever the split, so no split within 0.05 of the
// even one wastes any share, and the shares stay where they are: each move
// would cost what its transition loses within a window. Once a region's
// demand falls below its share, the split moves (it is not frozen).
func TestSaturatedLongWindowHoldsItsSplit(t *testing.T) {
	cl := newCluster(t, threeLong, Config{})
	low := false
	rate := func(r int, t time.Duration) float64 {
		if low && r == 0 {
			return 5
		}
		return 50 * (1 + 0.2*math.Sin(float64(t)/float64(time.Second)*1.7+2.1*float64(r)))
	}
	every := []time.Duration{time.Second, time.Second, time.Second}
	cl.run(20*time.Second, every, rate)
	v := cl.c.Stats().Version
	cl.run(60*time.Second, every, rate)
	near(t, "saturated", cl.shares(""), []float64{1.0 / 3, 1.0 / 3, 1.0 / 3})
	if sent := cl.c.Stats().Version - v; sent > 0 {
		t.Fatalf("%d assignments in 60 s in which every region used more than its share", sent)
	}
	low = true
	cl.run(20*time.Second, every, rate)
	if got := cl.shares(""); got[0] > 0.1 {
		t.Fatalf("us offers 5/s of 100/s and holds %.3f: a saturated split froze", got)
	}
}
