package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"testing"
	"time"
)

const key42 = "per-user:user=42"

// second advances the cluster by one second on a reliable network: every
// region reports (demand[r] for the limit; hot[r] for key42, reported near
// its limit), then the coordinator ticks (it rebalances every other tick).
func (cl *cluster) second(demand, hot []float64) {
	cl.now = cl.now.Add(time.Second)
	for r := range demand {
		if hot != nil && hot[r] > 0 {
			cl.report(r, demand[r], map[string]float64{key42: hot[r]}, key42)
		} else {
			cl.report(r, demand[r], nil)
		}
	}
	cl.settle()
	cl.tick(0)
	cl.settle()
}

func near(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for r := range want {
		if math.Abs(got[r]-want[r]) > 0.05 {
			t.Fatalf("%s: shares %.4f, want %.4f ± 0.05", what, got, want)
		}
	}
}

// TestShiftConverges moves all demand from us to eu at 10 s. Two
// rebalance periods later (14 s) the shares of the limit and of a hot key
// are within 0.05 of the demand-proportional split.
func TestShiftConverges(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	cl.keys = []string{key42}
	onUS, onEU := []float64{100, 0, 0}, []float64{0, 100, 0}
	checks := map[int][]float64{
		10: {0.9, 0.05, 0.05}, // 1 − other floors where all demand is
		14: {0.05, 0.9, 0.05},
	}
	for s := 1; s <= 14; s++ {
		d := onUS
		if s > 10 {
			d = onEU
		}
		cl.second(d, d)
		if want, ok := checks[s]; ok {
			near(t, "limit", cl.shares(""), want)
			near(t, "key", cl.shares(key42), want)
		}
	}
}

// TestPartitionKeepsShare cuts ap off: it keeps enforcing its share while
// us and eu divide the rest by demand; once healed, ap gives share back.
func TestPartitionKeepsShare(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	ap := cl.region("ap")
	for range 4 {
		cl.second([]float64{10, 10, 10}, nil)
	}
	apShare := cl.share(ap, "")
	near(t, "equal demand", cl.shares(""), []float64{1. / 3, 1. / 3, 1. / 3})

	cl.cut[ap] = true
	for range 12 {
		cl.second([]float64{30, 10, 10}, nil)
		if got := cl.share(ap, ""); got != apShare {
			t.Fatalf("partitioned ap applies %v, had %v", got, apShare)
		}
	}
	rest := 1 - apShare - 0.1 // what us and eu divide above their floors
	near(t, "partitioned", cl.shares(""), []float64{0.05 + rest*0.75, 0.05 + rest*0.25, apShare})

	cl.cut[ap] = false
	for range 6 {
		cl.second([]float64{30, 10, 10}, nil)
	}
	near(t, "healed", cl.shares(""), []float64{0.05 + 0.85*0.6, 0.05 + 0.85*0.2, 0.05 + 0.85*0.2})
}

// TestZeroDemand: with no demand anywhere the shares stay as they are and
// nothing is sent; regions without demand get their floors.
func TestZeroDemand(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	initial := cl.shares("")
	for range 6 {
		cl.second([]float64{0, 0, 0}, nil)
	}
	if got := cl.shares(""); got[0] != initial[0] || got[1] != initial[1] || got[2] != initial[2] {
		t.Fatalf("shares %v, want %v", got, initial)
	}
	if v := cl.c.Stats().Version; v != 0 {
		t.Fatalf("version %d: an assignment was sent", v)
	}
	for range 6 {
		cl.second([]float64{0, 50, 0}, nil)
	}
	near(t, "eu only", cl.shares(""), []float64{0.05, 0.9, 0.05})
	// Demand stops: the last split stays.
	for range 6 {
		cl.second([]float64{0, 0, 0}, nil)
	}
	near(t, "stopped", cl.shares(""), []float64{0.05, 0.9, 0.05})
}

// TestHotKeyLifecycle: a key hot in us only gets 1 − the other floors
// there, while the limit's default keeps its split; once it is no longer
// reported hot it goes back to the default everywhere and is forgotten.
func TestHotKeyLifecycle(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{HotTTL: 10 * time.Second})
	cl.keys = []string{key42}
	for range 6 {
		cl.second([]float64{10, 10, 10}, []float64{50, 0, 0})
	}
	near(t, "key", cl.shares(key42), []float64{0.9, 0.05, 0.05})
	near(t, "default", cl.shares(""), []float64{1. / 3, 1. / 3, 1. / 3})
	if n := cl.c.Stats().HotKeys; n != 1 {
		t.Fatalf("hot keys %d, want 1", n)
	}
	if _, ok := cl.store.recs[keyID{"per-user", key42}]; !ok {
		t.Fatal("no record of the hot key")
	}
	for range 16 {
		cl.second([]float64{10, 10, 10}, nil)
	}
	for r := range 3 {
		if _, own := cl.apps[r].keys[keyID{"per-user", key42}]; own {
			t.Fatalf("region %d still has a share of its own for the key", r)
		}
	}
	if n := cl.c.Stats().HotKeys; n != 0 {
		t.Fatalf("hot keys %d, want 0", n)
	}
	if _, ok := cl.store.recs[keyID{"per-user", key42}]; ok {
		t.Fatal("the retired key's record is still stored")
	}
}

// TestLeaderChange: the leader's lowering of us is lost, then it dies.
// The new leader starts from the store, counts us's old share until us
// acknowledges, and the shares converge as fast as without a failover.
func TestLeaderChange(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	cl.keys = []string{key42}
	onUS, onEU := []float64{100, 0, 0}, []float64{0, 100, 0}
	for range 6 {
		cl.second(onUS, onUS)
	}
	// At 7 s the rebalance lowers us ...
	cl.now = cl.now.Add(time.Second)
	for r := range 3 {
		cl.report(r, onEU[r], map[string]float64{key42: onEU[r]}, key42)
	}
	cl.settle()
	cl.tick(0)
	if len(cl.net) == 0 {
		t.Fatal("the rebalance sent nothing")
	}
	cl.net = nil // ... and the assignments are lost with the leader
	cl.newLeader()
	if held := cl.c.limits[0].def[0].bound; math.Abs(float64(held)-0.9) > 1e-6 {
		t.Fatalf("the new leader holds %v for us, want its unacknowledged 0.9", held)
	}
	cl.tick(0) // at once: regions are frozen (not heard yet) and get every share again
	cl.settle()
	// The persisted lowering of us, and no raise yet.
	lowered := cl.store.recs[keyID{"per-user", ""}].Cells[0].Share
	if lowered > 0.9-0.05 {
		t.Fatalf("the lost rebalance persisted us at %v: not a lowering", lowered)
	}
	near(t, "after failover", cl.shares(""), []float64{lowered, 0.05, 0.05})
	for range 4 {
		cl.second(onEU, onEU)
	}
	near(t, "limit", cl.shares(""), []float64{0.05, 0.9, 0.05})
	near(t, "key", cl.shares(key42), []float64{0.05, 0.9, 0.05})
	if cl.c.Stats().Term != 2 {
		t.Fatalf("term %d", cl.c.Stats().Term)
	}
}

// TestBadInput: bad messages are refused with a sentinel error, counted,
// and change nothing.
func TestBadInput(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	cl.second([]float64{10, 10, 10}, []float64{5, 0, 0})
	rep := func(f func(*Report)) Report {
		r := Report{Domain: "api", Region: "us", At: cl.now.Add(time.Hour), Limits: []LimitDemand{
			{Limit: "per-user", Admitted: 1, Keys: []KeyDemand{{Key: key42, Admitted: 1}}},
		}}
		f(&r)
		return r
	}
	sent := cl.c.Stats().Version
	tests := []struct {
		name string
		m    Message
		want error
	}{
		{"domain", rep(func(r *Report) { r.Domain = "llm" }), ErrUnknownDomain},
		{"region", rep(func(r *Report) { r.Region = "mars" }), ErrUnknownRegion},
		{"limit", rep(func(r *Report) { r.Limits[0].Limit = "nope" }), ErrUnknownLimit},
		{"NaN", rep(func(r *Report) { r.Limits[0].Admitted = math.NaN() }), ErrBadValue},
		{"negative", rep(func(r *Report) { r.Limits[0].Rejected = -1 }), ErrBadValue},
		{"infinite key", rep(func(r *Report) { r.Limits[0].Keys[0].Admitted = math.Inf(1) }), ErrBadValue},
		{"empty key", rep(func(r *Report) { r.Limits[0].Keys[0].Key = "" }), ErrBadValue},
		{"replayed", rep(func(r *Report) { r.At = cl.at[0] }), ErrStale},
		{"nil", nil, ErrBadValue},
		{"ack old term", Ack{Domain: "api", Region: "us", Term: 0, Version: 1}, ErrStale},
		{"ack new term", Ack{Domain: "api", Region: "us", Term: 2, Version: 1}, ErrBadVersion},
		{"ack unsent", Ack{Domain: "api", Region: "us", Term: 1, Version: sent + 1}, ErrBadVersion},
		{"ack region", Ack{Domain: "api", Region: "mars", Term: 1, Version: 1}, ErrUnknownRegion},
	}
	for i, tt := range tests {
		before := dump(cl.c)
		rd, err := cl.c.Step(cl.now, tt.m)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.want)
		}
		if len(rd.Persist)+len(rd.Send) > 0 || dump(cl.c) != before {
			t.Errorf("%s: state changed", tt.name)
		}
		if got := cl.c.Stats().Rejected; got != uint64(i+1) {
			t.Errorf("%s: rejected %d, want %d", tt.name, got, i+1)
		}
	}
}

// dump formats the coordinator's state but its stats.
func dump(c *Coordinator) string {
	s := fmt.Sprint(c.heard, c.lastAt, c.sent, c.acked, c.hotKeys)
	for _, ls := range c.limits {
		s += fmt.Sprint(ls.def, ls.keys, ls.cells)
	}
	return s
}

func TestNewErrors(t *testing.T) {
	d := mustDomain(t, threeRegions)
	bad := []struct {
		name string
		cfg  Config
		snap Snapshot
	}{
		{"no domain", Config{Term: 1}, Snapshot{}},
		{"no term", Config{Domain: d}, Snapshot{}},
		{"old term", Config{Domain: d, Term: 3}, Snapshot{Term: 3}},
		{"step", Config{Domain: d, Term: 1, MaxStep: 2}, Snapshot{}},
		{"share", Config{Domain: d, Term: 2}, Snapshot{Term: 1, Records: []Record{
			{Limit: "per-user", Cells: []Cell{{Region: "us", Share: Follow}}},
		}}},
		{"bound", Config{Domain: d, Term: 2}, Snapshot{Term: 1, Records: []Record{
			{Limit: "per-user", Key: "k", Cells: []Cell{{Region: "us", Share: 0.5, Bound: math.NaN()}}},
		}}},
	}
	for _, tt := range bad {
		if _, err := New(t0, tt.cfg, tt.snap); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: error %v, want ErrBadConfig", tt.name, err)
		}
	}
}

// tickAcked ticks c at now and acknowledges what it sends, and what that
// brings, at once; it returns the latest default share sent to each
// region.
func tickAcked(t *testing.T, c *Coordinator, now time.Time) map[string]float64 {
	t.Helper()
	sent := map[string]float64{}
	for rd := c.Tick(now); len(rd.Send) > 0; {
		var next Ready
		for _, a := range rd.Send {
			for _, sh := range a.Shares {
				if sh.Key == "" {
					sent[a.Region] = sh.Value
				}
			}
			got, err := c.Step(now, Ack{Domain: "api", Region: a.Region, Term: a.Term, Version: a.Version})
			if err != nil {
				t.Fatal(err)
			}
			next.Send = append(next.Send, got.Send...)
		}
		rd = next
	}
	return sent
}

// TestDroppedRegionsOfTheEvenSplitStayHeld: a vector that never moved is
// persisted too, so a region dropped while it holds the even split is
// held; and a record written during that hold carries the dropped
// region's cell, so a second change within it holds both regions.
func TestDroppedRegionsOfTheEvenSplitStayHeld(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	cl.tick(time.Second) // no demand: the even split, never moved
	if len(cl.store.recs) == 0 {
		t.Fatal("the initial vector was not persisted")
	}
	third := InitialShares(cl.d.Limits[0].Floors, cl.d.Regions)
	const hold = time.Minute
	now, term := cl.now, cl.store.term
	snap := cl.store.snapshot()
	var c *Coordinator
	for _, regions := range []string{"[us, eu]", "[us]"} {
		d := mustDomain(t, "domain: api\nregions: "+regions+"\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1s}\n")
		term++
		var err error
		if c, err = New(now, Config{Domain: d, Term: term, GoneHold: hold}, snap); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		for _, r := range d.Regions {
			if _, err := c.Step(now, Report{Domain: "api", Region: r, At: now, Limits: []LimitDemand{{Limit: "per-user", Admitted: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		rd := c.Tick(now)
		st := store{recs: map[keyID]Record{}}
		for _, rec := range snap.Records {
			st.recs[keyID{rec.Limit, rec.Key}] = rec
		}
		st.persist(rd)
		snap = st.snapshot()
	}
	// us alone, within the hold of both eu and ap: both still hold their
	// thirds, however much us asks for.
	us := 0.0
	for s := range 30 {
		now = now.Add(time.Second)
		if _, err := c.Step(now, Report{Domain: "api", Region: "us", At: now, Limits: []LimitDemand{{Limit: "per-user", Admitted: 100, Rejected: 100}}}); err != nil {
			t.Fatal(err)
		}
		if v, ok := tickAcked(t, c, now)["us"]; ok {
			us = v
		}
		if held := third[1] + third[2]; us > 1-held+1e-6 {
			t.Fatalf("%ds after eu was dropped: us applies %.4f with eu and ap still holding %.4f", s+1, us, held)
		}
	}
}

// TestRemovedRegionKeepsItsShare: a configuration that drops eu leaves its
// enforcers enforcing their last share until their grants expire, so the
// new term counts what eu held as taken until GoneHold has passed: us and
// ap are raised into it only then.
func TestRemovedRegionKeepsItsShare(t *testing.T) {
	cl := newCluster(t, threeRegions, Config{})
	for range 6 { // eu wants most: it holds most
		cl.second([]float64{10, 40, 10}, nil)
	}
	euHeld := cl.share(cl.region("eu"), "")
	if euHeld < 0.2 {
		t.Fatalf("eu holds %v before the change", euHeld)
	}
	d := mustDomain(t, "domain: api\nregions: [us, ap]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1s, floors: {us: 0.05, ap: 0.05}}\n")
	const hold = time.Minute
	c, err := New(cl.now, Config{Domain: d, Term: cl.store.term + 1, GoneHold: hold}, cl.store.snapshot())
	if err != nil {
		t.Fatal(err)
	}
	now, start := cl.now, cl.now
	applied := map[string]float64{}
	for s := range 80 {
		now = now.Add(time.Second)
		for _, r := range d.Regions {
			if _, err := c.Step(now, Report{Domain: "api", Region: r, At: now, Limits: []LimitDemand{{Limit: "per-user", Admitted: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		maps.Copy(applied, tickAcked(t, c, now))
		sum := applied["us"] + applied["ap"]
		switch inHold := now.Sub(start) < hold; {
		case inHold && sum > 1-euHeld+1e-6:
			t.Fatalf("%ds after eu was removed: us + ap apply %.4f, above 1 − eu's %.4f", s+1, sum, euHeld)
		case !inHold && s == 79 && sum < 0.9:
			t.Fatalf("after the hold us + ap apply %.4f, want the whole limit back", sum)
		}
	}
	t.Logf("eu held %.4f; us + ap apply %.4f after the hold", euHeld, applied["us"]+applied["ap"])
}
