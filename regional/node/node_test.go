package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
)

const cfgText = `
domain: api
regions: [us, eu]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1h, algorithm: sliding_window, mode: split, enforcement: local}
`

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newNode(t *testing.T, cfg *allot.Config, id string, counts regional.CountStore) *node.Node {
	t.Helper()
	n, err := node.New(node.Options{Region: "us", Instance: id, Engine: regional.New(cfg, regional.Options{}), Counts: counts})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func parse(t *testing.T, text string) *allot.Config {
	t.Helper()
	cfg, err := allot.ParseConfig("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func admitted(t *testing.T, e *regional.Engine, now time.Time, n int) int {
	t.Helper()
	var dec allot.Decision
	a := 0
	for range n {
		if err := e.Check(now, "api", allot.Descriptor{{Key: "user", Value: "42"}}, 1, &dec); err != nil {
			t.Fatal(err)
		}
		if dec.Allowed {
			a++
		}
	}
	return a
}

// An instance holds nothing until its first grant, then its region's
// share × its weight; what the coordinator's Fleet sends is applied by
// the Node, and the ack it returns is the Fleet's to take.
func TestNodeHoldsNothingUntilGranted(t *testing.T) {
	cfg := parse(t, cfgText)
	start := t0.Add(time.Minute) // the coordinator starts mid-window
	f, err := coordinator.NewFleet(start, coordinator.FleetConfig{Coordinator: coordinator.Config{Domain: cfg.Domain("api"), Term: 1, Period: time.Second}}, coordinator.Snapshot{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, cfg, "us-1", nil)
	if err := n.Link(t0); err != nil {
		t.Fatal(err)
	}
	if got := admitted(t, n.Engine(), start, 10); got != 0 {
		t.Fatalf("admitted %d before any grant, want 0", got)
	}
	if n.Ready() == nil {
		t.Fatal("Ready before any grant")
	}
	hello, ws, err := n.Connect(start, "api")
	if err != nil {
		t.Fatal(err)
	}
	rd, err := f.Attach(start, "us", "us-1", false, hello, ws)
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Send) != 1 {
		t.Fatalf("Attach sent %d assignments, want 1 (the full grant)", len(rd.Send))
	}
	applied, ack, err := n.Assign(start, rd.Send[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || ack.Instance != "us-1" {
		t.Fatalf("Assign applied %v, ack %+v", applied, ack)
	}
	if err := n.Ready(); err != nil {
		t.Fatal(err)
	}
	// The region's share is half of the limit (the even split of a
	// coordinator without demand yet), the instance its only one.
	if got := admitted(t, n.Engine(), start, 100); got > 50 {
		t.Fatalf("admitted %d in the window of the grant, want at most 50", got)
	}
	if got, want := admitted(t, n.Engine(), t0.Add(2*time.Hour), 100), 50; got != want {
		t.Fatalf("admitted %d two windows on, want %d", got, want)
	}
	// A grant not renewed before it expires takes the instance back to
	// nothing.
	doms, shares := n.Expire(n.Expires("api").Add(time.Nanosecond))
	if len(doms) != 1 || len(shares) == 0 || n.Ready() == nil {
		t.Fatalf("Expire dropped %v (%v), Ready %v", doms, shares, n.Ready())
	}
	// Leave says so to the coordinator.
	if ack := n.Leave(start)["api"]; !ack.Leaving || ack.Instance != "us-1" {
		t.Fatalf("Leave's ack %+v", ack)
	}
}

// Reports carry the engine's demand, one per coordinated domain, in
// order even when the clock steps back.
func TestNodeReportsStayOrdered(t *testing.T) {
	cfg := parse(t, cfgText)
	n := newNode(t, cfg, "us-1", nil)
	if err := n.Link(t0); err != nil {
		t.Fatal(err)
	}
	admitted(t, n.Engine(), t0, 3)
	r1 := n.Reports(t0.Add(time.Second))
	r2 := n.Reports(t0) // the clock stepped back
	if len(r1) != 1 || len(r2) != 1 {
		t.Fatalf("reports %v, %v: want one each", r1, r2)
	}
	if !r2[0].At.After(r1[0].At) {
		t.Fatalf("second report at %v, not after the first's %v", r2[0].At, r1[0].At)
	}
	if got := r1[0]; got.Instance != "us-1" || got.Region != "us" || len(got.Limits) != 1 || got.Limits[0].Rejected != 3 {
		t.Fatalf("first report %+v, want 3 rejected of per-user (nothing held)", got)
	}
}

// With a CountStore, the region's instances sum their shared-mode counts:
// what one instance admitted is in what the others send their peers.
func TestNodeSyncOutSumsTheRegionsInstances(t *testing.T) {
	cfg := parse(t, `
domain: api
regions: [us, eu]
limits:
  - {name: g, match: {user: "*"}, rate: 100/1h, algorithm: sliding_window, mode: shared, enforcement: local}
`)
	now := t0.Add(time.Minute)
	counts := &regional.MemoryCounts{Now: func() time.Time { return now }}
	a, b := newNode(t, cfg, "us-a", counts), newNode(t, cfg, "us-b", counts)
	for _, n := range []*node.Node{a, b} {
		if err := n.Engine().SetPeers("us", []string{"eu"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := admitted(t, a.Engine(), now, 30); got != 30 {
		t.Fatalf("a admitted %d, want 30", got)
	}
	if got := admitted(t, b.Engine(), now, 10); got != 10 {
		t.Fatalf("b admitted %d, want 10", got)
	}
	if _, err := a.SyncOut(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	batches, err := b.SyncOut(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, bt := range batches {
		for _, d := range bt.Deltas {
			total += d.Value
		}
	}
	if total != 40 {
		t.Fatalf("b sends its peers a region count of %d, want 40 (a's 30 and its 10)", total)
	}
	// A store that does not answer: each instance counts alone, and says
	// so.
	counts.SetErr(context.DeadlineExceeded)
	if _, err := b.SyncOut(context.Background(), now); err == nil {
		t.Fatal("SyncOut with a failing CountStore returned no error")
	}
}

func TestPeerIntervals(t *testing.T) {
	cfg := parse(t, `
domain: api
regions: [us, eu]
limits:
  - {name: g, match: {}, rate: 100/1s, mode: shared, sync_interval: 50ms}
  - {name: h, match: {}, rate: 100/10s, mode: shared, sync_interval: 1s}
`)
	tick, hb := node.PeerIntervals(cfg)
	if tick != 10*time.Millisecond || hb != 25*time.Millisecond {
		t.Fatalf("PeerIntervals = %v, %v; want 10ms, 25ms", tick, hb)
	}
}

// behindNode is a linked instance us-1 whose clock reads 300ms behind
// the coordinator's, and a Fleet: *coord is the coordinator's time, which
// the test advances, and local() the instance's.
func behindNode(t *testing.T) (*coordinator.Fleet, *node.Node, *time.Time, func() time.Time) {
	t.Helper()
	const behind = 300 * time.Millisecond
	cfg := parse(t, cfgText)
	f, err := coordinator.NewFleet(t0, coordinator.FleetConfig{Coordinator: coordinator.Config{Domain: cfg.Domain("api"), Term: 1, Period: time.Second}}, coordinator.Snapshot{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, cfg, "us-1", nil)
	coord := t0
	local := func() time.Time { return coord.Add(-behind) }
	if err := n.Link(local()); err != nil {
		t.Fatal(err)
	}
	return f, n, &coord, local
}

// An instance whose clock reads 300ms behind the coordinator's runs its
// engine on the coordinator's time once an assignment echoes its hello
// or one of its reports: its windows start when the coordinator's do,
// within Skew.
func TestNodeRunsOnTheCoordinatorsClock(t *testing.T) {
	f, n, coord, local := behindNode(t)
	if n.Skew() != -1 || !n.Now(local()).Equal(local()) {
		t.Fatalf("before any echo: skew %v, Now off by %v", n.Skew(), n.Now(local()).Sub(local()))
	}
	hello, ws, err := n.Connect(local(), "api")
	if err != nil {
		t.Fatal(err)
	}
	rd, err := f.Attach(*coord, "us", "us-1", false, hello, ws)
	if err != nil {
		t.Fatal(err)
	}
	const oneWay = 20 * time.Millisecond
	deliver := func(rd coordinator.Ready) {
		t.Helper()
		*coord = coord.Add(oneWay)
		for _, a := range rd.Send {
			if _, _, err := n.Assign(local(), a); err != nil {
				t.Fatal(err)
			}
		}
	}
	deliver(rd)
	for range 3 { // a report, its echo in the next grant
		reps := n.Reports(local())
		*coord = coord.Add(oneWay)
		if _, err := f.Step(*coord, reps[0]); err != nil {
			t.Fatal(err)
		}
		*coord = coord.Add(time.Second)
		deliver(f.Tick(*coord))
	}
	skew := n.Skew()
	if skew < 0 || skew > oneWay+time.Millisecond {
		t.Fatalf("skew %v, want at most the one-way delay %v", skew, oneWay)
	}
	if d := n.Now(local()).Sub(*coord); d > skew || -d > skew {
		t.Fatalf("Now is %v off the coordinator's clock, beyond its skew %v", d, skew)
	}
	if g := n.Engine().WindowGuard(); g != node.WindowGuard {
		t.Fatalf("window guard %v within %v of the coordinator's clock, want %v", g, skew, node.WindowGuard)
	}
}

// An instance that persists its long windows and restarts mid-window
// (same id: its certificate's) restores its counts: the new process
// admits what the old one left of its share, less at most a slack, and
// never more. Without Marks it admits nothing in the window.
func TestNodeRestoresItsLongWindows(t *testing.T) {
	cfg := parse(t, "domain: api\nregions: [us]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h, algorithm: sliding_window}\n")
	start := t0.Add(time.Minute)
	f, err := coordinator.NewFleet(start, coordinator.FleetConfig{Coordinator: coordinator.Config{Domain: cfg.Domain("api"), Term: 1, Period: time.Second}}, coordinator.Snapshot{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := &regional.MemoryStore{}
	life := func(now time.Time, marks regional.MarkStore) *node.Node {
		n, err := node.New(node.Options{Region: "us", Instance: "us-1", Engine: regional.New(cfg, regional.Options{}), Marks: marks})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Restore(context.Background(), now); err != nil {
			t.Fatal(err)
		}
		if err := n.Link(now); err != nil {
			t.Fatal(err)
		}
		hello, ws, err := n.Connect(now, "api")
		if err != nil {
			t.Fatal(err)
		}
		rd, err := f.Attach(now, "us", "us-1", false, hello, ws)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range rd.Send {
			if _, _, err := n.Assign(now, a); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	// spend admits up to want, persisting every "interval", and returns
	// what it admitted.
	spend := func(n *node.Node, now time.Time, want int) int {
		got, idle := 0, 0
		for got < want && idle < 3 {
			k := admitted(t, n.Engine(), now, want-got)
			if got += k; k == 0 {
				idle++
			} else {
				idle = 0
			}
			if _, err := n.Persist(context.Background(), now); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	first := life(start, store)
	if got := spend(first, start, 60); got != 60 {
		t.Fatalf("the first life admitted %d of 60", got)
	}
	crash := start.Add(10 * time.Second)
	f.Detach(crash, "us", "us-1")
	second := life(crash, store)
	after := spend(second, crash, 100)
	t.Logf("admitted 60, then %d after the restart (slack 5)", after)
	if after > 40 || after < 35 {
		t.Fatalf("admitted %d after the restart, want 35..40 (100 - 60, less at most a slack)", after)
	}
	f.Detach(crash, "us", "us-1")
	if got := spend(life(crash, nil), crash, 100); got != 0 {
		t.Fatalf("without Marks: admitted %d after the restart, want 0", got)
	}
}

// Allowance moves within a window through the Node (docs/adr/0005): an
// instance whose hot key is lowered mid-window acks what it released of
// the window; one whose key is raised acks what it wants of it; an extra
// in its next grant lets it spend exactly that, so that the key's window
// holds L over both regions and no more. Grants here stand for the
// Fleet's (coordinator/fleet_pool_test.go tests how it pairs them).
func TestNodeMovesAllowanceWithinAWindow(t *testing.T) {
	cfg := parse(t, "domain: api\nregions: [us, eu]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1m, algorithm: sliding_window, mode: split, enforcement: local}\n")
	const key = "per-user:user=42"
	window := t0.Add(time.Hour) // a window's start
	now := window.Add(-time.Second)
	nodes := map[string]*node.Node{}
	version := uint64(0)
	assign := func(region string, seq uint64, shares []coordinator.Share, extras []coordinator.Moved) coordinator.Ack {
		t.Helper()
		n := nodes[region]
		at := n.Reports(now)[0].At
		version++
		a := coordinator.Assignment{Domain: "api", Region: region, Term: 1, Version: version, Shares: shares, Instance: region + "-1",
			Grant: &coordinator.Grant{Seq: seq, Expires: now.Add(time.Hour), Full: seq == 1, Fresh: true, Extras: extras, PooledKeys: []string{"per-user"},
				Weights: []coordinator.Weight{{Limit: "per-user", Value: 1}}},
			Clock: &coordinator.ClockEcho{ReportAt: at, Received: at, Sent: now}}
		if len(shares) == 0 {
			a.Version = 0
		}
		_, ack, err := n.Assign(now, a)
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	for region, s := range map[string]float64{"us": 1, "eu": 0} {
		n, err := node.New(node.Options{Region: region, Instance: region + "-1", Engine: regional.New(cfg, regional.Options{})})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Link(now); err != nil {
			t.Fatal(err)
		}
		if _, _, err := n.Connect(now, "api"); err != nil {
			t.Fatal(err)
		}
		nodes[region] = n
		assign(region, 1, []coordinator.Share{{Limit: "per-user", Value: s}, {Limit: "per-user", Key: key, Value: s}}, nil)
		if n.Skew() < 0 {
			t.Fatalf("%s: the clock's error is not known", region)
		}
	}
	now = window.Add(time.Second)
	if got := admitted(t, nodes["us"].Engine(), now, 30); got != 30 {
		t.Fatalf("us admitted %d of 30", got)
	}
	now = window.Add(2 * time.Second)
	ack := assign("us", 2, []coordinator.Share{{Limit: "per-user", Key: key, Value: 0.5}}, nil)
	if len(ack.Released) != 1 || ack.Released[0].Key != key || !ack.Released[0].Window.Equal(window) || ack.Released[0].Value < 0.5-1e-9 || ack.Released[0].Value > 0.5+1e-9 {
		t.Fatalf("us lowered the key from 1 to 0.5 after 30 of 100 and acked releases %+v, want 0.5 of the window at %v", ack.Released, window)
	}
	ack = assign("eu", 2, []coordinator.Share{{Limit: "per-user", Key: key, Value: 0.5}}, nil)
	if len(ack.Wanted) != 1 || ack.Wanted[0].Key != key || ack.Wanted[0].Value < 0.5-1e-9 {
		t.Fatalf("eu raised the key to 0.5 mid-window and acked wants %+v, want 0.5", ack.Wanted)
	}
	if got := admitted(t, nodes["eu"].Engine(), now, 100); got != 0 {
		t.Fatalf("eu admitted %d from a raise mid-window, before any extra", got)
	}
	assign("eu", 3, nil, []coordinator.Moved{{Limit: "per-user", Key: key, Window: window, Value: ack.Wanted[0].Value}})
	now = now.Add(time.Second)
	us, eu := admitted(t, nodes["us"].Engine(), now, 100), admitted(t, nodes["eu"].Engine(), now, 100)
	if us != 20 || eu != 50 {
		t.Fatalf("after the move us admitted %d more (want 20) and eu %d (want 50): the window holds %d, want L = 100", us, eu, 30+us+eu)
	}
}

// TestNodeKnowsItsClockFromItsFirstGrant: the full grant that answers an
// instance's hello echoes it, so the instance runs on the coordinator's
// time, within the error measured, and may move a long window's
// allowance, from its first grant on rather than from its first report's
// echo (a region's second instance, granted nothing of the window its
// first one may have spent, then gets what the first gives up when they
// are divided: long-window-startup.yaml).
func TestNodeKnowsItsClockFromItsFirstGrant(t *testing.T) {
	f, n, coord, local := behindNode(t)
	const oneWay = 20 * time.Millisecond
	hello, ws, err := n.Connect(local(), "api")
	if err != nil {
		t.Fatal(err)
	}
	*coord = coord.Add(oneWay)
	rd, err := f.Attach(*coord, "us", "us-1", false, hello, ws)
	if err != nil {
		t.Fatal(err)
	}
	*coord = coord.Add(oneWay)
	for _, a := range rd.Send {
		if _, _, err := n.Assign(local(), a); err != nil {
			t.Fatal(err)
		}
	}
	skew := n.Skew()
	if skew < 0 || skew > oneWay+time.Millisecond {
		t.Fatalf("skew %v after the first grant, want at most the one-way delay %v", skew, oneWay)
	}
	if d := n.Now(local()).Sub(*coord); d > skew || -d > skew {
		t.Fatalf("Now off the coordinator's time by %v, more than its error %v", d, skew)
	}
}

// TestNodeSendsItsLatestReportAgain: a new stream sends the latest report
// again right after its hello (LastReport), if it is recent: a new leader
// then knows the instance's demand at once. A leader that took it already
// ignores it; a new one takes it as the instance's first report.
func TestNodeSendsItsLatestReportAgain(t *testing.T) {
	f, n, coord, local := behindNode(t)
	if _, ok := n.LastReport(local(), "api", time.Second); ok {
		t.Fatal("a latest report before any report")
	}
	if got := admitted(t, n.Engine(), local(), 3); got != 0 {
		t.Fatalf("admitted %d before any grant", got)
	}
	reps := n.Reports(local())
	last, ok := n.LastReport(local().Add(500*time.Millisecond), "api", time.Second)
	if !ok || !last.At.Equal(reps[0].At) || len(last.Limits) == 0 || last.Limits[0].Rejected != 3 {
		t.Fatalf("latest report %+v (%v), want the one made: %+v", last, ok, reps[0])
	}
	if _, ok := n.LastReport(local().Add(2*time.Second), "api", time.Second); ok {
		t.Fatal("a latest report older than its maximal age")
	}
	hello, ws, err := n.Connect(local(), "api")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Attach(*coord, "us", "us-1", false, hello, ws); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // a new leader takes it; sent again, it is ignored
		if _, err := f.Step(*coord, last); err != nil {
			t.Fatalf("report sent again (%d): %v", i, err)
		}
	}
	if got := f.Coordinator().Stats().Reports; got != 1 {
		t.Fatalf("%d reports taken, want the one sent again, once", got)
	}
}
