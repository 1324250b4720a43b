package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/allot-dev/allot"
)

const fleetConfig = `
domain: api
regions: [us-east, eu-west]
limits:
  - {name: loc, match: {}, rate: 1000/1s}
  - {name: ex, match: {}, rate: 1000/1s, enforcement: exact}
`

// fleetWorld is a Fleet and its instances, with in-order delivery per
// instance: a test decides when messages arrive.
type fatalf interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

type fleetWorld struct {
	t     fatalf
	now   time.Time
	f     *Fleet
	insts map[string]*fleetInst // by id
	snap  Snapshot              // what the Fleets persisted
	keys  []string              // keys of the local limit whose sums check checks
}

type fleetInst struct {
	region, id string
	x          *Instance
	up         bool         // connected
	inbox      []Assignment // from the Fleet, not yet applied
	applied    map[keyID]float64
	reported   time.Time // At of its latest report
	older      bool      // it connects as an enforcer of an earlier release: not KeyAware
	left       bool      // it left (a graceful stop): it never serves again
}

func newFleetWorld(t testing.TB, prev *Fleet) *fleetWorld {
	return newFleetWorldHot(t, prev, 0)
}

// newFleetWorldHot is newFleetWorld with a Coordinator's HotTTL (0: the
// default).
func newFleetWorldHot(t testing.TB, prev *Fleet, hotTTL time.Duration) *fleetWorld {
	return newFleetWorldOf(t, prev, hotTTL, fleetConfig)
}

// newFleetWorldOf is newFleetWorldHot with a configuration of its own,
// which has a local limit loc and an exact one ex.
func newFleetWorldOf(t testing.TB, prev *Fleet, hotTTL time.Duration, config string) *fleetWorld {
	cfg, err := allot.ParseConfig("fleet.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	term := int64(5)
	if prev != nil {
		term = prev.co.term + 1
	}
	f, err := NewFleet(now, FleetConfig{Coordinator: Config{Domain: cfg.Domain("api"), Term: term, Period: time.Second, DeadAfter: 3 * time.Second, HotTTL: hotTTL},
		GrantTTL: 5 * time.Second, MaxSkew: 500 * time.Millisecond}, Snapshot{}, prev)
	if err != nil {
		t.Fatal(err)
	}
	return &fleetWorld{t: t, now: now, f: f, insts: map[string]*fleetInst{}}
}

// newLeader replaces the Fleet by one of the next term, starting from what
// the Fleets persisted, that continues the old one (prev) or not (a
// failover). Every stream of the old one ends.
func (w *fleetWorld) newLeader(continues bool) { w.newTerm(w.f.cfg, continues) }

// newTerm is newLeader with configuration cfg.
func (w *fleetWorld) newTerm(cfg FleetConfig, continues bool) {
	cfg.Coordinator.Term = w.f.co.term + 1
	var prev *Fleet
	if continues {
		prev = w.f
	}
	f, err := NewFleet(w.now, cfg, w.snap, prev)
	if err != nil {
		w.t.Fatal(err)
	}
	w.f = f
	for _, in := range w.insts {
		in.up, in.inbox = false, nil
	}
}

// dropRegion replaces the Fleet by one of the next term whose
// configuration no longer lists region, continuing the old one or not.
// Every stream ends; the region's instances cannot connect again, and go
// on applying what they hold until their grants expire.
func (w *fleetWorld) dropRegion(region string, continues bool) {
	w.t.Helper()
	d := *w.dom()
	d.Regions = slices.DeleteFunc(slices.Clone(d.Regions), func(r string) bool { return r == region })
	cfg := w.f.cfg
	cfg.Coordinator.Domain, cfg.Coordinator.GoneHold = &d, 0
	w.newTerm(cfg, continues)
}

func (w *fleetWorld) dom() *allot.Domain { return w.f.dom }

func (w *fleetWorld) out(rd Ready) {
	for _, rec := range rd.Persist {
		i := slices.IndexFunc(w.snap.Records, func(r Record) bool { return r.Limit == rec.Limit && r.Key == rec.Key })
		switch {
		case rec.Cells == nil && i >= 0:
			w.snap.Records = slices.Delete(w.snap.Records, i, i+1)
		case rec.Cells == nil:
		case i >= 0:
			w.snap.Records[i] = rec
		default:
			w.snap.Records = append(w.snap.Records, rec)
		}
	}
	if rd.Members != nil {
		w.snap.Members = rd.Members
	}
	if len(rd.Persist) > 0 { // as etcdstore: a Ready of members only writes no Term
		w.snap.Term, w.snap.Version = rd.Term, rd.Version
	}
	for _, a := range rd.Send {
		if in := w.insts[a.Instance]; in != nil && in.up {
			in.inbox = append(in.inbox, a)
		}
	}
}

func (w *fleetWorld) start(region, id string) *fleetInst {
	x, err := NewInstance(w.dom(), region, id)
	if err != nil {
		w.t.Fatal(err)
	}
	in := &fleetInst{region: region, id: id, x: x, applied: map[keyID]float64{}}
	in.apply(x.Shares())
	w.insts[id] = in
	return in
}

func (in *fleetInst) apply(shares []Share) {
	for _, s := range shares {
		id := keyID{s.Limit, s.Key}
		if s.Value == Follow {
			delete(in.applied, id)
		} else {
			in.applied[id] = s.Value
		}
	}
}

func (w *fleetWorld) connect(in *fleetInst) {
	in.up = true
	in.x.Reconnect()
	hello, ws := in.x.Hello()
	if in.older {
		ws = slices.DeleteFunc(ws, func(w Weight) bool { return w == KeyAware })
	}
	rd, err := w.f.Attach(w.now, in.region, in.id, false, hello, ws)
	if err != nil {
		w.t.Fatal(err)
	}
	w.out(rd)
}

func (w *fleetWorld) cut(in *fleetInst) {
	in.up, in.inbox = false, nil
	w.out(w.f.Detach(w.now, in.region, in.id))
}

// deliver applies in's pending assignments and acks them.
func (w *fleetWorld) deliver(in *fleetInst) {
	for len(in.inbox) > 0 && in.up {
		a := in.inbox[0]
		in.inbox = in.inbox[1:]
		shares, ack, err := in.x.Apply(w.now, a)
		if err != nil {
			continue
		}
		in.apply(shares)
		ack.Instance = in.id
		rd, err := w.f.Step(w.now, ack)
		if err != nil {
			w.t.Fatalf("ack of %s refused: %v", in.id, err)
		}
		w.out(rd)
	}
}

// leave stops in gracefully: it drops its shares and tells the Fleet.
func (w *fleetWorld) leave(in *fleetInst) Ready {
	w.t.Helper()
	shares, ack := in.x.Leave()
	in.apply(shares)
	ack.Instance = in.id
	rd, err := w.f.Step(w.now, ack)
	if err != nil {
		w.t.Fatal(err)
	}
	return rd
}

// leaveByHello stops in gracefully and tells the Fleet by the hello of a
// new stream (the one that carried its leave broke), and returns the
// Fleet's answer.
func (w *fleetWorld) leaveByHello(in *fleetInst) (Ready, error) {
	shares, _ := in.x.Leave()
	in.apply(shares)
	in.up, in.inbox, in.left = false, nil, true
	in.x.Reconnect()
	hello, ws := in.x.Hello()
	if !hello.Leaving {
		w.t.Fatalf("%s's hello after Leave does not say it left", in.id)
	}
	return w.f.Attach(w.now, in.region, in.id, false, hello, ws)
}

func (w *fleetWorld) report(in *fleetInst, loc float64) { w.reportKeys(in, loc, nil) }

// reportKeys reports in's demand, with keys of the local limit.
func (w *fleetWorld) reportKeys(in *fleetInst, loc float64, keys []KeyDemand) {
	if !in.up || !w.now.After(in.reported) {
		return
	}
	in.reported = w.now
	rd, err := w.f.Step(w.now, Report{Domain: "api", Region: in.region, Instance: in.id, At: w.now,
		Limits: []LimitDemand{{Limit: "loc", Admitted: loc, Keys: keys}, {Limit: "ex", Admitted: loc}}})
	if err != nil {
		w.t.Fatalf("report of %s refused: %v", in.id, err)
	}
	w.out(rd)
}

func (w *fleetWorld) advance(d time.Duration) {
	w.now = w.now.Add(d)
	for _, in := range w.insts {
		in.apply(in.x.Expire(w.now))
	}
	w.out(w.f.Tick(w.now))
}

// check fails if what every instance applies exceeds the limit, for the
// default vectors and for each of w.keys: for the local limit, the sum
// over every instance of every region; for the exact one (counted in a
// regional store), the sum over regions of the largest share any
// instance of the region applies.
func (w *fleetWorld) check(what string) {
	w.t.Helper()
	for _, key := range append([]string{""}, w.keys...) {
		loc, ex := 0.0, map[string]float64{}
		for _, in := range w.insts {
			loc += in.level("loc", key)
			ex[in.region] = max(ex[in.region], in.level("ex", key))
		}
		if loc > 1+1e-6 || ex["us-east"]+ex["eu-west"] > 1+1e-6 {
			w.t.Fatalf("%s: applied shares of key %q sum above 1: local %v, exact %v", what, key, loc, ex)
		}
	}
}

// level is what in applies for a key of a limit: the key's own share in
// its engine, or the limit's default.
func (in *fleetInst) level(limit, key string) float64 {
	if v, ok := in.applied[keyID{limit, key}]; ok {
		return v
	}
	return in.applied[keyID{limit: limit}]
}

func (w *fleetWorld) loc(in *fleetInst) float64 { return in.applied[keyID{limit: "loc"}] }

// run delivers everything and ticks for d, with instances reporting their
// demand every tick.
func (w *fleetWorld) run(d time.Duration, demand map[*fleetInst]float64) {
	for end := w.now.Add(d); w.now.Before(end); {
		for in, n := range demand {
			w.report(in, n)
		}
		for _, in := range w.insts {
			w.deliver(in)
		}
		w.check(w.now.String())
		w.advance(250 * time.Millisecond)
		w.check(w.now.String())
	}
}

// A region dropped from the configuration is held until its instances'
// grants expire, unless each of them says it left: a leave that reaches
// the new term as a leaving hello (its stream broke when the term
// changed) ends the hold at once. Before, the hold lasted the grant's
// minute: us-east applied 0.5 of the limit for it.
func TestRemovedRegionFreedWhenItsInstancesLeave(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b, c := w.start("us-east", "a"), w.start("eu-west", "b"), w.start("eu-west", "c")
	for _, in := range []*fleetInst{a, b, c} {
		w.connect(in)
	}
	w.run(4*time.Second, map[*fleetInst]float64{a: 500, b: 250, c: 250})
	w.dropRegion("eu-west", true)
	w.connect(a)
	// A hello of an instance of eu-west that did not leave is refused.
	if hello, ws := b.x.Hello(); true {
		if _, err := w.f.Attach(w.now, "eu-west", b.id, false, hello, ws); !errors.Is(err, ErrUnknownRegion) {
			t.Fatalf("a hello of eu-west, dropped, that did not leave: %v, want ErrUnknownRegion", err)
		}
	}
	leave := func(in *fleetInst) {
		if rd, err := w.leaveByHello(in); err != nil || len(rd.Send) > 0 {
			t.Fatalf("%s's leaving hello: %+v %v, want taken, with no grant", in.id, rd, err)
		}
		delete(w.insts, in.id)
	}
	leave(b)
	w.run(3*time.Second, map[*fleetInst]float64{a: 1000})
	if got := w.loc(a); got > 0.5+1e-6 {
		t.Fatalf("with eu-west's c yet to leave, us-east applies %v, want at most its 0.5", got)
	}
	leave(c)
	w.run(3*time.Second, map[*fleetInst]float64{a: 1000})
	if got := w.loc(a); got < 0.95 {
		t.Fatalf("3 s after every instance of eu-west left, us-east applies %v, want the whole limit", got)
	}
}

// An assignment that arrives after the instance left (it was on its way
// when the instance told the Fleet it holds nothing) is refused: before,
// the instance applied its share again while the Fleet had freed it, and
// shares in force summed above 1.
func TestInstanceAppliesNothingAfterLeave(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("eu-west", "b")
	w.connect(a)
	w.connect(b)
	w.run(2*time.Second, map[*fleetInst]float64{a: 500, b: 500})
	// b's demand falls: the Fleet lowers b, then would raise a. b gets
	// a grant it does not apply yet.
	for range 8 {
		w.report(a, 1000)
		w.report(b, 10)
		w.deliver(a)
		w.advance(250 * time.Millisecond)
	}
	pending := slices.Clone(b.inbox)
	if len(pending) == 0 {
		t.Fatal("no assignment on its way to b")
	}
	w.out(w.leave(b))
	b.up, b.inbox = false, nil
	for _, m := range pending { // they arrive after the leave
		if shares, _, err := b.x.Apply(w.now, m); err == nil {
			b.apply(shares)
		}
	}
	w.run(2*time.Second, map[*fleetInst]float64{a: 1000})
	if got := w.loc(b); got != 0 {
		t.Fatalf("b applies %v after it left, with us-east's a at %v: want nothing", got, w.loc(a))
	}
}

func TestFleetNewInstanceHoldsNothingUntilGranted(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	if got := w.loc(a); got != 0 || a.x.Held() {
		t.Fatalf("a new instance applies %v (held %v), want nothing", got, a.x.Held())
	}
	// Alone in its region, a takes the region's whole part at once.
	w.connect(a)
	w.deliver(a)
	if !a.x.Serving() || w.loc(a) != 0.5 {
		t.Fatalf("a alone applies %v of the local limit (serving %v), want us-east's whole share 0.5", w.loc(a), a.x.Serving())
	}
	// b gets a part only once a has given it up and acked.
	w.connect(b)
	w.deliver(b)
	if got := w.loc(b); got != 0 {
		t.Fatalf("b applies %v before a gave anything up", got)
	}
	w.deliver(a)
	w.deliver(b)
	if la, lb := w.loc(a), w.loc(b); lb == 0 || la+lb > 0.5+1e-6 {
		t.Fatalf("after a acked its lowering, a and b apply %v and %v; want both a part, together at most 0.5", la, lb)
	}
}

// A region's local share is divided among its instances by their demand,
// and what all of them apply never exceeds the region's share.
func TestFleetDividesALocalShareByDemand(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b, eu := w.start("us-east", "a"), w.start("us-east", "b"), w.start("eu-west", "eu")
	for _, in := range []*fleetInst{a, b, eu} {
		w.connect(in)
	}
	// The quiet period of a new leader passes first.
	w.run(8*time.Second, map[*fleetInst]float64{a: 900, b: 100, eu: 0})
	la, lb := w.loc(a), w.loc(b)
	if la+lb < 0.8 || la < 2*lb {
		t.Fatalf("us-east's instances apply %v and %v of the local limit; want most of it, a's part well above b's", la, lb)
	}
	if got := a.applied[keyID{limit: "ex"}]; got < 0.8 {
		t.Fatalf("a applies %v of the exact limit; want the region's whole share", got)
	}
	// Demand moves to b: weight follows, with the limit never exceeded.
	w.run(8*time.Second, map[*fleetInst]float64{a: 100, b: 900, eu: 0})
	if la, lb := w.loc(a), w.loc(b); lb < 2*la {
		t.Fatalf("after the shift a and b apply %v and %v; want b's part well above a's", la, lb)
	}
}

// An instance cut off from the coordinator while the rest of its region
// stays connected holds its region's lowering back until its grant has
// expired; it then holds nothing, and when it reconnects it is brought up
// to date before it applies anything.
func TestFleetCutOffInstance(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b, eu := w.start("us-east", "a"), w.start("us-east", "b"), w.start("eu-west", "eu")
	for _, in := range []*fleetInst{a, b, eu} {
		w.connect(in)
	}
	w.run(10*time.Second, map[*fleetInst]float64{a: 500, b: 500, eu: 0})
	before := b.applied[keyID{limit: "ex"}]
	if before < 0.8 {
		t.Fatalf("us-east applies %v of the exact limit, want most of it", before)
	}
	w.cut(b)
	cutAt := w.now
	// Demand moves to eu-west. us-east lowers, but eu-west may be raised
	// only once b's grant has expired: until then b may still apply it.
	for w.now.Sub(cutAt) < 12*time.Second {
		w.run(250*time.Millisecond, map[*fleetInst]float64{a: 0, eu: 1000})
		if w.now.Sub(cutAt) < 4*time.Second && eu.applied[keyID{limit: "ex"}] > 1-before+1e-6 {
			t.Fatalf("%v after b was cut off, eu-west applies %v while b may still apply %v", w.now.Sub(cutAt), eu.applied[keyID{limit: "ex"}], before)
		}
	}
	if b.x.Held() || b.applied[keyID{limit: "ex"}] != 0 {
		t.Fatalf("b still holds %v after its grant expired", b.applied[keyID{limit: "ex"}])
	}
	if got := eu.applied[keyID{limit: "ex"}]; got < 0.8 {
		t.Fatalf("eu-west applies %v after b's grant expired; want most of the limit", got)
	}
	// b reconnects: its first assignment is the region's shares as they are.
	w.connect(b)
	if len(b.inbox) == 0 || b.inbox[0].Grant == nil || !b.inbox[0].Grant.Full {
		t.Fatalf("b's first assignment after reconnecting is %+v, want a full grant", b.inbox)
	}
	w.run(4*time.Second, map[*fleetInst]float64{a: 0, b: 0, eu: 1000})
	if got := b.applied[keyID{limit: "ex"}]; got > 0.2+1e-6 {
		t.Fatalf("b applies %v of the exact limit after reconnecting, want us-east's lowered share", got)
	}
}

// A Fleet that continues another of the same process (a new term after a
// configuration change) keeps its instances' weights.
func TestFleetContinues(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	w.connect(a)
	w.connect(b)
	w.run(8*time.Second, map[*fleetInst]float64{a: 500, b: 500})
	w2 := newFleetWorld(t, w.f)
	w2.now, w2.insts = w.now, w.insts
	for _, in := range []*fleetInst{a, b} {
		in.up = false
		w2.connect(in)
	}
	w2.run(time.Second, map[*fleetInst]float64{a: 500, b: 500})
	if wa, wb := a.x.weights["loc"], b.x.weights["loc"]; wa+wb < 0.95 {
		t.Fatalf("after a new term a and b hold weights %v and %v of the local limit; want what they held kept", wa, wb)
	}
}

// TestFleetNeverOverAllocates drives a Fleet and its instances through
// random connects, cuts, demand (of the limits and of hot keys that
// instances report near their limit, so that keys get shares, weights of
// their own and rest factors, and lose them again), deliveries, lost
// messages, restarts, graceful stops, leader changes (failovers and new
// terms of the same process) and time, and checks after every step that
// what every instance applies stays within the limit, for the default
// vectors and for every key.
func TestFleetNeverOverAllocates(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		w := newFleetWorldHot(t, nil, time.Duration(rapid.IntRange(2, 8).Draw(rt, "hotTTLs"))*time.Second)
		w.t = rt
		w.keys = []string{"k0", "k1", "k2", "k3"}
		// Enough instances in a region for a key reported by one of them
		// to reach few of them (it goes apart).
		ids := []string{"u1", "u2", "u3", "u4", "u5", "e1", "e2", "e3", "e4"}
		restarts := 0
		for _, id := range ids {
			region := "us-east"
			if id[0] == 'e' {
				region = "eu-west"
			}
			w.start(region, id).older = rapid.IntRange(0, 9).Draw(rt, "older "+id) == 0
		}
		pick := func() *fleetInst {
			id := rapid.SampledFrom(ids).Draw(rt, "inst")
			return w.insts[id]
		}
		// Each instance has a favourite key that it reports near its
		// limit more often, so that some keys reach a few instances in a
		// row of reports.
		favourite := func(in *fleetInst) string { return w.keys[int(in.id[1])%len(w.keys)] }
		hot := func(in *fleetInst) {
			w.reportKeys(in, 500, []KeyDemand{{Key: favourite(in), Admitted: 400, Rejected: 100, NearLimit: true}})
		}
		ops := map[string]func(){
			"connect": func() {
				if in := pick(); !in.up && !in.left {
					w.connect(in)
				}
			},
			"cut": func() {
				if in := pick(); in.up {
					w.cut(in)
				}
			},
			"report": func() { // demand, some keys, some of them near their limit
				in := pick()
				var keys []KeyDemand
				for _, k := range w.keys {
					switch rapid.IntRange(0, 3).Draw(rt, "key "+k) {
					case 1:
						keys = append(keys, KeyDemand{Key: k}) // a key it holds a share of its own for, without traffic
					case 2:
						keys = append(keys, KeyDemand{Key: k, Admitted: float64(rapid.IntRange(0, 100).Draw(rt, "key demand")), NearLimit: true})
					case 3:
						keys = append(keys, KeyDemand{Key: k, Admitted: 10, Rejected: float64(rapid.IntRange(1, 100).Draw(rt, "rejected"))})
					}
				}
				w.reportKeys(in, float64(rapid.IntRange(0, 1000).Draw(rt, "demand")), keys)
			},
			"hot":     func() { hot(pick()) }, // its favourite key, near its limit
			"deliver": func() { w.deliver(pick()) },
			"settle": func() {
				for _, id := range ids {
					w.deliver(w.insts[id])
				}
			},
			"round": func() { // the instances that favour one key report it, the others their demand
				k := rapid.SampledFrom(w.keys).Draw(rt, "round key")
				for _, id := range ids {
					if in := w.insts[id]; favourite(in) == k {
						hot(in)
					} else {
						w.report(in, 10)
					}
				}
				w.advance(time.Duration(rapid.IntRange(100, 1500).Draw(rt, "round ms")) * time.Millisecond)
				for _, id := range ids {
					w.deliver(w.insts[id])
				}
			},
			"advance": func() {
				w.advance(time.Duration(rapid.IntRange(1, 3000).Draw(rt, "ms")) * time.Millisecond)
			},
			"restart": func() { // a new process, a new id, holding nothing
				in := pick()
				if in.up {
					w.cut(in)
				}
				restarts++
				// The old process is gone: what it applied no longer counts.
				delete(w.insts, in.id)
				id := fmt.Sprintf("%s-r%d", in.id[:2], restarts)
				ids = append(ids[:0:0], ids...)
				for j := range ids {
					if ids[j] == in.id {
						ids[j] = id
					}
				}
				w.start(in.region, id)
			},
			"lose": func() {
				if in := pick(); len(in.inbox) > 1 {
					j := rapid.IntRange(0, len(in.inbox)-1).Draw(rt, "lost")
					in.inbox = slices.Delete(in.inbox, j, j+1) // a lost message (the stream stays up)
				}
			},
			"leave": func() { // a graceful stop; the process starts again as a new instance by restart
				in := pick()
				if !in.up {
					return
				}
				if rapid.Bool().Draw(rt, "leave on a new stream") {
					// Its stream broke as it sent the leave (leadership
					// moved): the next stream's hello says it left.
					if rd, err := w.leaveByHello(in); err == nil {
						w.out(rd)
					}
					w.check("leave")
					return
				}
				shares, ack := in.x.Leave()
				in.apply(shares)
				ack.Instance = in.id
				w.check("leave")
				if rd, err := w.f.Step(w.now, ack); err == nil {
					w.out(rd)
				}
				in.up, in.inbox, in.left = false, nil, true
			},
			"leader": func() { w.newLeader(rapid.Bool().Draw(rt, "continues")) },
			"drop": func() { // the configuration drops eu-west: its instances hold what they hold until their grants expire
				if len(w.dom().Regions) == 1 {
					return
				}
				w.dropRegion("eu-west", rapid.Bool().Draw(rt, "continues"))
				ids = slices.DeleteFunc(ids, func(id string) bool { return w.insts[id].region == "eu-west" })
				for _, id := range slices.Sorted(maps.Keys(w.insts)) {
					in := w.insts[id]
					if in.region != "eu-west" || in.left || !rapid.Bool().Draw(rt, "eu-west's "+in.id+" leaves") {
						continue // it applies what it holds until its grant expires
					}
					// A graceful stop, told to the new term by a leaving
					// hello: once every holder of eu-west left, its hold ends.
					if rd, err := w.leaveByHello(in); err == nil {
						w.out(rd)
					}
					w.check("eu-west left")
				}
			},
			"reorder": func() { // an instance applies its messages in another order (they travel apart)
				if in := pick(); len(in.inbox) > 1 {
					j := rapid.IntRange(1, len(in.inbox)-1).Draw(rt, "reorder")
					in.inbox[0], in.inbox[j] = in.inbox[j], in.inbox[0]
				}
			},
		}
		var names []string // weighted: mostly traffic and progress, now and then a failure
		for name, weight := range map[string]int{"connect": 4, "cut": 1, "report": 3, "hot": 3, "deliver": 4, "settle": 2,
			"round": 4, "advance": 2, "restart": 1, "lose": 1, "leave": 1, "leader": 1, "reorder": 1, "drop": 1} {
			for range weight {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for i := range rapid.IntRange(20, 300).Draw(rt, "steps") {
			ops[rapid.SampledFrom(names).Draw(rt, "op")]()
			w.check(fmt.Sprint("step ", i))
			w.checkIncremental(fmt.Sprint("step ", i))
		}
	})
}

// checkIncremental fails if what an instance's engine applies (the
// shares its Instance returned, step by step) differs from what the
// Instance's state says it applies now: an Instance recomputes only what
// each assignment changes, and this checks that it recomputes enough.
func (w *fleetWorld) checkIncremental(what string) {
	w.t.Helper()
	for _, in := range w.insts {
		x := in.x
		ids := map[keyID]bool{}
		for id := range in.applied {
			ids[id] = true
		}
		for l := range x.region.defaults {
			ids[keyID{limit: l}] = true
		}
		for _, m := range []map[keyID]float64{x.region.keys, x.own, x.rest} {
			for id := range m {
				ids[id] = true
			}
		}
		for id := range ids {
			want, has := x.level(id)
			got, applied := in.applied[id]
			if has != applied || has && got != want {
				w.t.Fatalf("%s: %s applies %v (own share %v) for %s %q; its state says %v (own share %v)", what, in.id, got, applied, id.limit, id.key, want, has)
			}
		}
	}
}

// The first instance of a region of a domain that never had a leader gets
// a fresh grant: its shares are in force since always. A later instance
// (a restart, a scale-out) gets them in force from when they were granted.
func TestFleetFreshGrants(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	w.connect(a)
	full := a.inbox[0]
	if !full.Grant.Fresh {
		t.Fatal("the region's first instance got a grant that is not fresh")
	}
	shares, _, err := a.x.Apply(w.now, full)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shares {
		if s.Key == "" && (!s.Reset || !s.Since.IsZero()) {
			t.Fatalf("a's first share %+v: want a reset in force since always", s)
		}
	}
	a.inbox = nil
	w.connect(b)
	full = b.inbox[0]
	if full.Grant.Fresh {
		t.Fatal("the region's second instance got a fresh grant")
	}
	shares, _, err = b.x.Apply(w.now, full)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shares {
		if s.Limit == "loc" && s.Key == "" && (!s.Reset || s.Since.Before(w.now)) {
			t.Fatalf("b's share of the local limit %+v: want a reset in force from now", s)
		}
	}
}

// An instance that leaves (a graceful stop) frees what it held at once;
// the instances that may hold grants are persisted when they change, and
// a new leader waits only until those have attached, not for their grants
// to expire.
func TestFleetLeaveAndMembers(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	w.connect(a)
	w.connect(b)
	w.run(4*time.Second, map[*fleetInst]float64{a: 500, b: 500})
	if w.loc(b) == 0 {
		t.Fatal("b holds nothing")
	}
	rd := w.leave(b)
	if len(rd.Members) != 1 || rd.Members[0].Instance != "a" {
		t.Fatalf("members after b left: %+v, want a alone", rd.Members)
	}
	b.up = false
	w.out(rd)
	w.run(3*time.Second, map[*fleetInst]float64{a: 500})
	if got := w.loc(a); got < 0.45 {
		t.Fatalf("a applies %v of the local limit %v after b left; want us-east's whole share", got, 3*time.Second)
	}

	// A new leader knows a may hold a grant: it raises nothing and acks
	// nothing for us-east until a has attached, then goes on at once.
	cfg := w.f.cfg
	cfg.Coordinator.Term++
	f2, err := NewFleet(w.now, cfg, Snapshot{Term: cfg.Coordinator.Term - 1, Members: rd.Members}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fr := f2.regions[f2.regionOf["us-east"]]
	if !f2.quietIn(w.now, fr) {
		t.Fatal("the new leader does not wait for a")
	}
	a.x.Reconnect()
	hello, ws := a.x.Hello()
	if _, err := f2.Attach(w.now, "us-east", "a", false, hello, ws); err != nil {
		t.Fatal(err)
	}
	if f2.quietIn(w.now, fr) {
		t.Fatal("the new leader still waits once every member attached")
	}
}

// The first grant of a Fleet whose domain has no records goes out only
// with a record of the vector it grants a part of (InitialShares): a
// region the configuration drops later is held by that record.
func TestFleetPersistsTheInitialVectorBeforeGranting(t *testing.T) {
	w := newFleetWorld(t, nil)
	w.connect(w.start("eu-west", "e1"))
	for _, l := range []string{"loc", "ex"} {
		i := slices.IndexFunc(w.snap.Records, func(r Record) bool { return r.Limit == l && r.Key == "" })
		if i < 0 || len(w.snap.Records[i].Cells) != 2 {
			t.Fatalf("after the first grant the records are %+v: want %s's initial vector", w.snap.Records, l)
		}
	}
}

// TestRemovedRegionHoldsWhatItsInstancesHold checks what a region the
// configuration drops keeps at the next term of the same process: what
// its instances may still apply. One that left (drained before the
// change) holds nothing, so the region that stays is raised into its
// share at once; one that did not keeps it until its grant expires.
func TestRemovedRegionHoldsWhatItsInstancesHold(t *testing.T) {
	for _, left := range []bool{true, false} {
		w := newFleetWorld(t, nil)
		a, b := w.start("us-east", "a"), w.start("eu-west", "b")
		w.connect(a)
		w.connect(b)
		w.run(4*time.Second, map[*fleetInst]float64{a: 500, b: 500})
		held := w.loc(b)
		if held < 0.3 {
			t.Fatalf("eu-west's b holds %v before the change", held)
		}
		if left {
			w.out(w.leave(b))
			delete(w.insts, b.id)
		}
		var expires time.Time // of b's latest grant
		if in := w.f.regions[w.f.regionOf["eu-west"]].byID[b.id]; in != nil {
			expires = in.expires
		}
		w.dropRegion("eu-west", true) // the same process: eu-west's b can no longer reach the coordinator
		w.connect(a)
		start := w.now
		for w.now.Before(start.Add(10 * time.Second)) {
			w.run(250*time.Millisecond, map[*fleetInst]float64{a: 1000})
			sum := w.loc(a)
			if !left && w.now.Before(expires.Add(w.f.cfg.MaxSkew)) {
				sum += held // b still applies it
			}
			if sum > 1+1e-6 {
				t.Fatalf("left %v, %v after the change: us-east's a applies %v, with eu-west's %v above the limit", left, w.now.Sub(start), w.loc(a), held)
			}
			if left && w.now.Sub(start) >= 3*time.Second && w.loc(a) < 0.95 {
				t.Fatalf("%v after eu-west, which had left, was removed, us-east applies %v, want the whole limit", w.now.Sub(start), w.loc(a))
			}
		}
		if w.loc(a) < 0.95 {
			t.Fatalf("left %v: us-east applies %v after the hold, want the whole limit", left, w.loc(a))
		}
	}
}

// TestFleetGivesEveryBusyInstanceAWholeRequest: a limit of 20 a window
// over 20 instances (10, 6 and 4 by region), with us offering four times
// what each instance of eu and ap offers. Divided by demand, ap's share
// would be 0.08, 0.4 of a request a window at each of its instances,
// which admit nothing; and a region's instances would hold a part of
// their share that follows their noise, some of them a hair below one
// request. Each region gets at least one request a window for each of its
// instances with demand (its units, where all of them fit), and each such
// instance at least one request a window of its region's share.
func TestFleetGivesEveryBusyInstanceAWholeRequest(t *testing.T) {
	w := newFleetWorldOf(t, nil, 0, `
domain: api
regions: [us-east, eu-west, ap]
limits:
  - {name: loc, match: {}, rate: 20/1s}
  - {name: ex, match: {}, rate: 1000/1s, enforcement: exact}
`)
	demand := map[*fleetInst]float64{}
	for r, n := range map[string]int{"us-east": 10, "eu-west": 6, "ap": 4} {
		for i := range n {
			in := w.start(r, fmt.Sprintf("%s-%d", r, i))
			w.connect(in)
			demand[in] = 1 + float64(i%3)/10 // uneven within a region, a little
			if r == "us-east" {
				demand[in] *= 4
			}
		}
	}
	w.run(20*time.Second, demand)
	for in := range demand {
		if got := 20 * w.loc(in); got < 1-1e-5 {
			t.Errorf("%s holds %.6f of a request a window, want at least 1", in.id, got)
		}
	}
}

// TestFleetWeightsFollowDemandNotNoise: two instances of us-east with the
// same demand on average, 30 and 170 in turn, a second each (the noise of
// a few requests a report interval). Their weights follow the average,
// near even, instead of the latest report, which swung them between a
// fifth and four fifths; every swing left an instance at its lowered part
// for the rest of its window.
func TestFleetWeightsFollowDemandNotNoise(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	w.connect(a)
	w.connect(b)
	w.run(8*time.Second, map[*fleetInst]float64{a: 100, b: 100}) // the quiet period of a new leader
	odd := false
	for range 40 {
		odd = !odd
		da, db := 30.0, 170.0
		if odd {
			da, db = db, da
		}
		w.run(time.Second, map[*fleetInst]float64{a: da, b: db})
		if la, lb := w.loc(a), w.loc(b); math.Abs(la-lb) > 0.2*(la+lb) {
			t.Fatalf("a and b apply %.3f and %.3f of the local limit for the same average demand", la, lb)
		}
	}
}
