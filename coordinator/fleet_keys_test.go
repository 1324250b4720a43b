package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// runKeys is run with hot keys: every instance of hot reports its key
// near its limit (with demand n), the others their limit's demand only.
// It checks the sums of w.keys too, after every step.
func (w *fleetWorld) runKeys(d time.Duration, demand map[*fleetInst]float64, hot map[*fleetInst]string) {
	ids := make([]string, 0, len(w.insts))
	for id := range w.insts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for end := w.now.Add(d); w.now.Before(end); {
		for _, id := range ids {
			in := w.insts[id]
			n, ok := demand[in]
			if !ok {
				continue
			}
			var keys []KeyDemand
			if k := hot[in]; k != "" {
				keys = []KeyDemand{{Key: k, Admitted: n * 0.6, Rejected: n * 0.4, NearLimit: true}}
			}
			w.reportKeys(in, n, keys)
		}
		for _, id := range ids {
			w.deliver(w.insts[id])
		}
		w.check(w.now.String())
		w.advance(250 * time.Millisecond)
		w.check(w.now.String())
	}
}

// keyWorld is a world of 8 us-east and 2 eu-west instances, all
// connected, past a new leader's quiet period.
func keyWorld(t *testing.T) (*fleetWorld, []*fleetInst) {
	w := newFleetWorld(t, nil)
	w.keys = []string{"k0"}
	var us []*fleetInst
	for i := range 8 {
		us = append(us, w.start("us-east", fmt.Sprintf("u%d", i)))
	}
	for _, in := range append(us, w.start("eu-west", "e0"), w.start("eu-west", "e1")) {
		w.connect(in)
	}
	return w, us
}

// everyone demands n of the limit.
func (w *fleetWorld) everyone(n float64) map[*fleetInst]float64 {
	d := map[*fleetInst]float64{}
	for _, in := range w.insts {
		d[in] = n
	}
	return d
}

// A hot key that reaches 2 of a region's 8 instances gets its allowance
// there: the others apply keyRest × their weight for the limit to it, the
// two share the rest by their weights of their own; and the key's shares
// sum to at most 1 at every step.
func TestFleetHotKeyReachingFewInstances(t *testing.T) {
	w, us := keyWorld(t)
	demand := w.everyone(100)
	hot := map[*fleetInst]string{us[0]: "k0", us[1]: "k0"}
	w.runKeys(20*time.Second, demand, hot)
	share := w.f.regions[w.f.regionOf["us-east"]].shares.Share("loc", "k0")
	if share < 0.4 {
		t.Fatalf("us-east's share of k0 is %v; want most of it", share)
	}
	got := us[0].level("loc", "k0") + us[1].level("loc", "k0")
	if got < 0.9*share {
		t.Fatalf("the 2 instances k0 reaches apply %v of it, us-east's share is %v: want at least 0.9 of it", got, share)
	}
	for _, in := range us[2:] {
		if v, max := in.level("loc", "k0"), keyRest*in.x.weights["loc"]*share; v > max+1e-9 {
			t.Fatalf("%s, which k0 does not reach, applies %v of it; want at most keyRest × its weight for the limit (%v)", in.id, v, max)
		}
	}
	if w0, w1 := us[0].x.own[keyID{"loc", "k0"}], us[1].x.own[keyID{"loc", "k0"}]; w0 < 0.4 || w1 < 0.4 {
		t.Fatalf("weights of their own for k0: %v and %v; want about half each", w0, w1)
	}
	if r := us[5].x.rest[keyID{"loc", "k0"}]; r != float64(float32(keyRest)) {
		t.Fatalf("k0's rest factor at an instance it does not reach is %v, want %v", r, keyRest)
	}
	if st := w.f.Stats(); st.KeyWeights != 2 || st.RestFactors != 1 {
		t.Fatalf("stats %+v: want 2 weights of their own and 1 rest factor", st)
	}

	// The key spreads to every instance: it comes back to the limit's
	// weights, and the weights of their own and its rest factor go.
	for _, in := range us {
		hot[in] = "k0"
	}
	w.runKeys(20*time.Second, demand, hot)
	for _, in := range us {
		if len(in.x.own) != 0 || len(in.x.rest) != 0 {
			t.Fatalf("%s still holds weights of its own %v and rest factors %v for a key that reaches every instance", in.id, in.x.own, in.x.rest)
		}
	}
}

// A key's rest factor goes down before any weight of its own rises above
// the instance's weight for the limit, and comes back up only after they
// are all within it again: at no step does an instance apply more to the
// key than a bound the Fleet counts.
func TestFleetHotKeyApartOnlyOnceAcked(t *testing.T) {
	w, us := keyWorld(t)
	demand := w.everyone(100)
	w.runKeys(8*time.Second, demand, nil)
	// us[7] is cut off: it may still apply the key's old rest factor (1)
	// until its grant expires, so no weight of its own may go above the
	// limit's until then.
	w.cut(us[7])
	cutAt := w.now
	hot := map[*fleetInst]string{us[0]: "k0"}
	for w.now.Sub(cutAt) < 4*time.Second {
		w.runKeys(250*time.Millisecond, demand, hot)
		if own, lim := us[0].x.own[keyID{"loc", "k0"}], us[0].x.weights["loc"]; own > lim {
			t.Fatalf("%v after us[7] was cut off, us[0] holds %v of k0 of its own, above its weight for the limit %v", w.now.Sub(cutAt), own, lim)
		}
	}
	// Once its grant has expired, us[0] gets the key's allowance.
	w.runKeys(10*time.Second, demand, hot)
	if own := us[0].x.own[keyID{"loc", "k0"}]; own < 0.9 {
		t.Fatalf("us[0] holds %v of k0 of its own after us[7]'s grant expired; want most of it", own)
	}
}

// A new leader counts what an instance says it holds, its weights of its
// own for hot keys and the rest factors it applies included: it raises
// none of them until every instance an earlier leader may have granted is
// known, and the key stays within its share throughout.
func TestFleetHotKeyFailover(t *testing.T) {
	w, us := keyWorld(t)
	demand := w.everyone(100)
	hot := map[*fleetInst]string{us[0]: "k0", us[1]: "k0"}
	w.runKeys(20*time.Second, demand, hot)
	before := us[0].x.own[keyID{"loc", "k0"}]
	if before < 0.4 {
		t.Fatalf("us[0] holds %v of k0 of its own before the failover", before)
	}
	w.newLeader(false)
	if !w.f.quietIn(w.now, w.f.regions[w.f.regionOf["us-east"]]) {
		t.Fatal("the new leader does not wait for the instances of the old one")
	}
	// The instances reconnect one by one, with the key's traffic going on.
	for i, in := range us {
		w.connect(in)
		w.runKeys(250*time.Millisecond, demand, hot)
		if i < len(us)-1 {
			if got := us[0].x.own[keyID{"loc", "k0"}]; got > before {
				t.Fatalf("during the quiet period us[0] holds %v of k0 of its own, above the %v it had", got, before)
			}
		}
	}
	for _, id := range []string{"e0", "e1"} {
		w.connect(w.insts[id])
	}
	w.runKeys(20*time.Second, demand, hot)
	if got := us[0].level("loc", "k0") + us[1].level("loc", "k0"); got < 0.4 {
		t.Fatalf("after the failover the 2 instances k0 reaches apply %v of it", got)
	}
}

// A Fleet that continues another waits, like it, for the instances of an
// earlier leader that have not attached yet, and a leader persists them
// among its members, so that the leader after it waits for them too.
func TestFleetAwaitingCarriedOver(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("eu-west", "a"), w.start("us-east", "b")
	w.connect(a)
	w.deliver(a) // a holds eu-west's part of the leader of term 5
	if w.loc(a) == 0 {
		t.Fatal("a holds nothing")
	}
	w.newLeader(false) // a's stream ends; its grant lasts
	w.connect(b)
	w.run(time.Second, map[*fleetInst]float64{b: 100})
	for _, continues := range []bool{true, false} {
		w.newLeader(continues)
		if fr := w.f.regions[w.f.regionOf["eu-west"]]; !w.f.quietIn(w.now, fr) {
			t.Fatalf("a leader after one that persisted its members (continues %v) does not wait for a, which may hold a grant", continues)
		}
	}
	e := w.start("eu-west", "e")
	w.connect(e)
	w.run(2*time.Second, map[*fleetInst]float64{e: 100}) // check: a's part is not given to e
}

// A key is hot in a region (the Coordinator gives it shares of its own)
// when an instance that holds a part of the limit reports it near its
// limit and the region's demand for it is not far below the region's
// allowance for it: a starting instance rejects every key, and an
// instance's small part of the region's share sees many keys near.
func TestFleetHotKeysOfTheRegion(t *testing.T) {
	w := newFleetWorld(t, nil)
	a, b := w.start("us-east", "a"), w.start("us-east", "b")
	w.connect(a)
	w.deliver(a) // a holds the region's part; b holds nothing yet
	w.connect(b)
	at := func(in *fleetInst, keys ...KeyDemand) {
		w.now = w.now.Add(time.Second)
		w.reportKeys(in, 100, keys)
		w.reportKeys(b, 100, nil)
		w.advance(0)
	}
	at(b, KeyDemand{Key: "starting", Rejected: 100})
	// us-east's allowance of a key at its share 0.5 of 1000/s is 500/s.
	at(a, KeyDemand{Key: "small", Admitted: 10, Rejected: 2, NearLimit: true})
	if n := w.f.co.Stats().HotKeys; n != 0 {
		t.Fatalf("%d hot keys from an instance that holds nothing and a key far from its allowance; want none", n)
	}
	at(a, KeyDemand{Key: "hot", Admitted: 300, Rejected: 100, NearLimit: true})
	if n := w.f.co.Stats().HotKeys; n != 1 {
		t.Fatalf("%d hot keys, want 1", n)
	}
}

// With many instances every live one gets a part of a local limit: the
// hysteresis that keeps weights from following noise is not larger than
// the even part of one instance's weight (it was 0.02, and of 200
// instances attaching one by one the 151 after the first 49 held
// nothing).
func TestFleetManyInstancesAllGetWeight(t *testing.T) {
	d := mustDomain(t, benchThreeRegions)
	now := t0
	f, err := NewFleet(now, FleetConfig{Coordinator: Config{Domain: d, Term: 1}}, Snapshot{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var acks func(rd Ready)
	acks = func(rd Ready) {
		for _, a := range rd.Send {
			r, err := f.Step(now, Ack{Domain: a.Domain, Region: a.Region, Instance: a.Instance, Term: a.Term, Version: a.Version, Seq: a.Grant.Seq})
			if err != nil {
				t.Fatal(err)
			}
			acks(r)
		}
	}
	for j := range 200 {
		rd, err := f.Attach(now, "us", fmt.Sprint("us-", j), false, Ack{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		acks(rd)
	}
	for range 5 {
		now = now.Add(DefaultPeriod)
		for j := range 200 {
			if _, err := f.Step(now, Report{Domain: d.Name, Region: "us", Instance: fmt.Sprint("us-", j), At: now,
				Limits: []LimitDemand{{Limit: "per-user", Admitted: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		acks(f.Tick(now))
	}
	for _, in := range f.regions[f.regionOf["us"]].insts {
		if w := in.w[0].share; w < 0.004 {
			t.Fatalf("%s holds %v of the limit; want about 1/200 like every other", in.id, w)
		}
	}
}

// An instance that does not say it is KeyAware (an enforcer of an earlier
// release) gets no weights of their own nor rest factors, which it would
// take for its weights for the limits, and while it may hold share no key
// of its region goes apart: it applies its weight for the limit to every
// key.
func TestFleetOlderInstanceKeepsKeysTogether(t *testing.T) {
	w, us := keyWorld(t)
	old := us[7]
	// us[7] reconnects as a process of an earlier release would: its
	// hello names no KeyAware.
	old.up, old.inbox = false, nil
	w.out(w.f.Detach(w.now, old.region, old.id))
	old.x.Reconnect()
	hello, _ := old.x.Hello()
	rd, err := w.f.Attach(w.now, old.region, old.id, false, hello, nil)
	if err != nil {
		t.Fatal(err)
	}
	old.up = true
	w.out(rd)
	demand := w.everyone(100)
	hot := map[*fleetInst]string{us[0]: "k0", us[1]: "k0"}
	for range 40 {
		w.runKeys(500*time.Millisecond, demand, hot)
		for _, a := range old.inbox {
			for _, wt := range a.Grant.Weights {
				if wt.Key != "" {
					t.Fatalf("an older instance got %+v", wt)
				}
			}
		}
		for _, in := range us {
			if len(in.x.own) > 0 || len(in.x.rest) > 0 {
				t.Fatalf("%s holds weights of its own %v or rest factors %v with an older instance in its region", in.id, in.x.own, in.x.rest)
			}
		}
	}
}

// An instance of an earlier release (not KeyAware) applies its weight for
// the limit to every key. One that attaches while a key is apart (weights
// of their own above their instances' weights) is raised only once the
// key is back together, not into a weight freed meanwhile by an expired
// grant: at no step do the key's shares sum above 1.
func TestFleetOlderInstanceWaitsForKeysTogether(t *testing.T) {
	w, us := keyWorld(t)
	demand := w.everyone(100)
	hot := map[*fleetInst]string{us[0]: "k0", us[1]: "k0"}
	w.runKeys(20*time.Second, demand, hot)
	if us[0].x.own[keyID{"loc", "k0"}] < 0.4 {
		t.Fatalf("k0 is not apart: weight of its own %v", us[0].x.own[keyID{"loc", "k0"}])
	}
	// u7 is cut off: its weight is free once its grant expires. Before,
	// the two that k0 reaches are cut off too (they cannot ack the key
	// coming back together), and an older instance attaches.
	w.cut(us[7])
	w.runKeys(3*time.Second, demand, hot)
	w.cut(us[0])
	w.cut(us[1])
	old := w.start("us-east", "old")
	old.older = true
	w.connect(old)
	demand[old] = 100
	w.runKeys(10*time.Second, demand, hot) // checks every step
	for _, in := range us[:2] {
		w.connect(in)
	}
	w.runKeys(20*time.Second, demand, hot)
	if old.level("loc", "") == 0 {
		t.Fatal("the older instance is never raised")
	}
}

// A new leader's quiet period: an instance of the earlier leader that has
// not attached yet may apply any rest factor (none at all, 1, for a key
// whose factor it never applied), so no rest factor is taken as
// confirmed, and no weight of its own rises into it, until every such
// instance attached and acked.
func TestFleetRestFactorsWaitForEarlierInstances(t *testing.T) {
	w, us := keyWorld(t)
	demand := w.everyone(100)
	w.runKeys(10*time.Second, demand, nil)
	// k0 becomes hot at u0 and u1: its rest factor goes down, and every
	// instance but u6 and u7 applies it before the leader fails over.
	hot := map[*fleetInst]string{us[0]: "k0", us[1]: "k0"}
	for range 8 {
		for _, in := range w.insts {
			var keys []KeyDemand
			if hot[in] != "" {
				keys = []KeyDemand{{Key: "k0", Admitted: 60, Rejected: 40, NearLimit: true}}
			}
			w.reportKeys(in, 100, keys)
		}
		for _, in := range w.insts {
			if in != us[6] && in != us[7] {
				w.deliver(in)
			}
		}
		w.check(w.now.String())
		w.advance(250 * time.Millisecond)
	}
	if r, ok := us[5].x.rest[keyID{"loc", "k0"}]; !ok || r >= 1 {
		t.Fatalf("u5 applies rest factor %v (%v) for k0, want keyRest", r, ok)
	}
	if _, ok := us[6].x.rest[keyID{"loc", "k0"}]; ok {
		t.Fatal("u6 applies a rest factor for k0 already")
	}
	w.newLeader(false)
	for _, in := range w.insts {
		if in != us[6] && in != us[7] {
			w.connect(in)
		}
	}
	late := maps.Clone(demand)
	delete(late, us[6])
	delete(late, us[7])
	w.runKeys(2*time.Second, late, hot)
	w.connect(us[6])
	w.connect(us[7])
	w.deliver(us[0]) // before u6 and u7 apply their full grants
	w.deliver(us[1])
	w.check("u6 and u7 attached")
	w.runKeys(20*time.Second, demand, hot)
}
