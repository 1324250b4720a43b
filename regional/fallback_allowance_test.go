package regional

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

var fallbackRuns = flag.Int("fallback.runs", 0, "runs of TestFallbackAdmissionsStayWithinTheLimit (0: 900, 180 under the race detector)")

// downStore is a Store that fails every call while down.
type downStore struct {
	Store
	down atomic.Bool
}

var errStoreDown = errors.New("store down")

func (s *downStore) Take(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Take(ctx, now, ops, res)
}

func (s *downStore) Lease(ctx context.Context, now time.Time, ops []LeaseOp, res []LeaseResult) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Lease(ctx, now, ops, res)
}

// Charge implements ReservationStore when the store under it does.
func (s *downStore) Charge(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.(ReservationStore).Charge(ctx, now, ops, res)
}

func (s *downStore) Heartbeat(ctx context.Context, now time.Time, region, instance string, ttl time.Duration) (int, error) {
	if s.down.Load() {
		return 0, errStoreDown
	}
	return s.Store.Heartbeat(ctx, now, region, instance, ttl)
}

// outageRun checks user 1 every 20 ms for 8 s from a window's start,
// the store down from `from` to `to` (offsets), and returns what was
// admitted.
func outageRun(t *testing.T, cfg string, from, to time.Duration) int {
	t.Helper()
	s := &downStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	start := t0.Truncate(10 * time.Second).Add(10 * time.Second)
	admitted := 0
	for at := time.Duration(0); at < 8*time.Second; at += 20 * time.Millisecond {
		s.down.Store(at >= from && at < to)
		if check(t, f, start.Add(at), user("1"), 1).Allowed {
			admitted++
		}
	}
	return admitted
}

// The local fallback does not know what the store admitted before it
// began: in the window that holds its start it admits nothing more, and
// once it admitted in a window the store is not asked again before the
// window ends (the store does not know what it admitted). Either way a
// window of a region alone admits at most L. Before, 200 of L = 100 in
// both cases.
func TestFallbackSpendsOnlyWhatTheStoreLeft(t *testing.T) {
	for _, enf := range []string{"exact", "leased"} {
		cfg := "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 100/10s, algorithm: sliding_window, enforcement: " + enf + ", on_failure: local}\n"
		if got := outageRun(t, cfg, 4*time.Second, time.Hour); got > 100 {
			t.Errorf("%s, the store down from the middle of the window: %d admitted in it, L = 100", enf, got)
		}
		if got := outageRun(t, cfg, 0, 4*time.Second); got > 100 || got < 100 {
			t.Errorf("%s, the store back in the middle of the window: %d admitted in it, want L = 100", enf, got)
		}
	}
}

// TestFallbackAdmissionsStayWithinTheLimit: one region of one to three
// instances, each an Enforcer on one MemoryStore, a sliding window, a
// token bucket or GCRA with exact or leased enforcement and on_failure:
// local, random traffic and a store that fails for the whole region and
// comes back at random instants. The oracle sums what every instance
// admitted per aligned window of a sliding window, and over every
// interval T of a bucket: with one instance at most L, and B + r·T (a
// leased one: + B ÷ 2, as without fallback). With n, a window at most
// L + (n − 1) × L ÷ n and a bucket B + r·T + (n − 1) × (B + r × one
// heartbeat) ÷ n: an instance that did not see the outage may use the
// store while the others admitted in fallback, and one that has not yet
// seen the store back keeps its fallback for up to a heartbeat while the
// others use the store (open: the instances do not know each other's
// fallbacks). Before the fallback's buckets began empty and repaid the
// store, one instance admitted up to 2 × B + r·T (66 of 600 bucket runs
// failed). -fallback.runs=20000 passes.
func TestFallbackAdmissionsStayWithinTheLimit(t *testing.T) {
	runs := *fallbackRuns
	switch {
	case runs > 0:
	case raceEnabled:
		runs = 180
	default:
		runs = 900
	}
	worst, worstB := 0.0, 0.0
	defer func() {
		t.Logf("%d runs: the worst window admitted %.2f × L; a bucket, at most %.2f × B above r·T", runs, worst, worstB)
	}()
	for seed := range uint64(runs) {
		d := &draw{rand.New(rand.NewPCG(seed, 0x66616c6c))}
		enf := []string{"exact", "leased"}[d.int(0, 1)]
		amount := d.int64(5, 300)
		period := []time.Duration{time.Second, 10 * time.Second}[d.int(0, 1)]
		alg := []string{"sliding_window", "token_bucket", "gcra"}[seed%3]
		burst := amount
		if alg != "sliding_window" {
			burst = d.int64(1, 3*amount)
		}
		burstField := ""
		if alg != "sliding_window" {
			burstField = fmt.Sprintf(", burst: %d", burst)
		}
		cfg := fmt.Sprintf("domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: %d/%dms%s, algorithm: %s, enforcement: %s, on_failure: local}\n",
			amount, period.Milliseconds(), burstField, alg, enf)
		mem := &MemoryStore{}
		s := &downStore{Store: mem}
		n := d.int(1, 3)
		fs := make([]*Enforcer, n)
		for i := range fs {
			// A heartbeat at most every step, alive for three: an outage
			// longer than that lets memberships expire (the count is
			// held after it), and every instance sees an outage longer
			// than a heartbeat.
			fs[i] = NewEnforcer(New(mustConfig(t, cfg), Options{}), s, EnforcerOptions{Region: "r", Instance: fmt.Sprint(i), Heartbeat: period / 5})
		}
		now := t0
		for range 2 { // every instance sees the others
			for _, f := range fs {
				if err := f.heartbeat(context.Background(), now, 3*period/5); err != nil {
					t.Fatal(err)
				}
			}
		}
		admitted := map[int64]int64{}
		var times, costs []int64 // every admission, in order (buckets)
		outages := 0
		for range d.int(50, 400) {
			now = now.Add(time.Duration(d.int64(0, int64(period)/5)))
			for _, f := range fs { // the driver's tick
				f.Tick(context.Background(), now)
			}
			switch k := d.int(0, 9); {
			case k == 0:
				if !s.down.Load() {
					outages++
				}
				s.down.Store(!s.down.Load())
			default:
				f := fs[d.int(0, n-1)]
				cost := min(d.int64(1, max(1, amount/10)), burst)
				for range d.int(1, 30) {
					if check(t, f, now, user("1"), cost).Allowed {
						admitted[now.UnixNano()/int64(period)] += cost
						times, costs = append(times, now.UnixNano()), append(costs, cost)
					}
				}
			}
		}
		if alg != "sliding_window" {
			// B + r·T over every interval [t_i, t_j]: the most admitted
			// above r·T is max_j (S_j − r·t_j) − min_{i ≤ j} (S_{i−1} − r·t_i).
			rate := float64(amount) / float64(period)
			heartbeat := period / 5
			bound := float64(burst) + float64(n-1)*(float64(burst)+rate*float64(heartbeat))/float64(n)
			if enf == "leased" { // leases are spent after they were taken
				bound += float64(burst) / 2
			}
			sum, least, from := 0.0, math.Inf(1), int64(0)
			for j, at := range times {
				if v := sum - rate*float64(at); v < least {
					least, from = v, at
				}
				sum += float64(costs[j])
				over := sum - rate*float64(at) - least
				worstB = max(worstB, over/float64(burst))
				if over > bound+1e-6 {
					t.Fatalf("seed %d (%s %s, %d per %v, burst %d, %d instances, %d outages): %.1f admitted above r·T from %v to %v, bound %.1f",
						seed, alg, enf, amount, period, burst, n, outages, over, time.Unix(0, from).Sub(t0), time.Unix(0, at).Sub(t0), bound)
				}
			}
			continue
		}
		// One instance: at most L. Several: one that did not see the
		// outage may use the store in a window in which the others
		// admitted in fallback, each up to L ÷ n (open).
		bound := float64(amount) + float64(n-1)*float64(amount)/float64(n)
		for w, got := range admitted {
			worst = max(worst, float64(got)/float64(amount))
			if float64(got) > bound {
				t.Fatalf("seed %d (%s, L = %d per %v, %d instances, %d outages): window %d admitted %d, bound %.1f", seed, enf, amount, period, n, outages, w, got, bound)
			}
		}
	}
}

// After an outage long enough for the memberships to expire, the first
// heartbeat that reaches the store sees only the instances that renewed
// already: the count held stays until the others have had a heartbeat's
// time to come back (before, it fell to 1, and a fallback right after
// gave this instance the region's whole share: 2.17 × L in a window in
// TestFallbackAdmissionsStayWithinTheLimit).
func TestEnforcerCountHeldAfterAnOutage(t *testing.T) {
	const cfg = "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 10/1s, enforcement: exact}\n"
	s := &downStore{Store: &MemoryStore{}}
	var fs []*Enforcer
	for i := range 3 {
		fs = append(fs, NewEnforcer(New(mustConfig(t, cfg), Options{}), s, EnforcerOptions{Region: "r", Instance: fmt.Sprint(i), Heartbeat: time.Second}))
	}
	tick := func(at time.Time, fs ...*Enforcer) {
		for _, f := range fs {
			f.Tick(context.Background(), at)
		}
	}
	tick(t0, fs...)
	tick(t0.Add(time.Second), fs...)
	if n := fs[0].Instances(); n != 3 {
		t.Fatalf("%d instances before the outage, want 3", n)
	}
	s.down.Store(true)
	for i := 2; i <= 6; i++ { // five heartbeats fail: every membership expires
		tick(t0.Add(time.Duration(i)*time.Second), fs...)
	}
	s.down.Store(false)
	tick(t0.Add(7*time.Second), fs[0]) // the first back: it sees itself alone
	if n := fs[0].Instances(); n != 3 {
		t.Fatalf("right after the outage: %d instances, want the 3 held until the others renew", n)
	}
	tick(t0.Add(7*time.Second+100*time.Millisecond), fs[1:]...)
	tick(t0.Add(8*time.Second), fs...)
	if n := fs[0].Instances(); n != 3 {
		t.Fatalf("once the others renewed: %d instances, want 3", n)
	}
	// A real scale-in is followed once the hold (a membership's
	// lifetime from the first heartbeat back) has passed.
	if err := fs[2].Close(context.Background(), t0.Add(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	tick(t0.Add(9*time.Second), fs[:2]...)
	tick(t0.Add(10500*time.Millisecond), fs[:2]...)
	if n := fs[0].Instances(); n != 2 {
		t.Fatalf("after one left: %d instances, want 2", n)
	}
}

// A token bucket's fallback admits only what B + r·T allows around the
// store's outage: it begins empty (the store may have spent its bucket
// just before: before, 200 passed within a second for a burst of 100 at
// 10/s), and when the store decides the key again, it first charges the
// store what the fallback's bucket owes (the store's bucket
// refilled meanwhile without knowing: before, a fallback burst of 100
// and the store's full bucket right after passed 200 within 0.2 s).
func TestFallbackBucketsStayWithinBPlusRT(t *testing.T) {
	const cfg = "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 10/1s, burst: 100, enforcement: exact, on_failure: local}\n"
	s := &downStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	burst := func(at time.Time) int {
		n := 0
		for range 150 {
			if check(t, f, at, user("1"), 1).Allowed {
				n++
			}
		}
		return n
	}
	start := t0
	if n := burst(start); n != 100 {
		t.Fatalf("the store's bucket: %d admitted, want 100", n)
	}
	s.down.Store(true)
	entry := 0
	for at := 10 * time.Millisecond; at <= time.Second; at += 10 * time.Millisecond {
		entry += burst(start.Add(at))
	}
	if entry > 10 {
		t.Errorf("the store down right after its bucket was spent: %d admitted by the fallback within 1 s, want at most r·T = 10 (B + r·T = 110 with the 100 before)", entry)
	}
	// Nothing for 20 s: the fallback's bucket fills, then spends it all.
	full := start.Add(21 * time.Second)
	if n := burst(full); n != 100 {
		t.Fatalf("the fallback's bucket, full again: %d admitted, want 100", n)
	}
	s.down.Store(false)
	back := burst(full.Add(200 * time.Millisecond))
	if back+100 > 100+2 {
		t.Errorf("the store back 0.2 s after the fallback spent 100: %d more admitted, want at most r·T = 2 (B + r·T = 102)", back)
	}
}

// A fallback owes the store what it may have admitted, not what its
// bucket, begun empty, lacks: a store call past its deadline on a key of
// 10/s with a burst of 100, the fallback admitting one request 150 ms
// later, costs the store's full bucket that request (charged the lack,
// it held 3 of 100 after).
func TestFallbackOwesWhatItAdmitted(t *testing.T) {
	const cfg = "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 10/1s, burst: 100, enforcement: exact, on_failure: local}\n"
	s := &downStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	if !check(t, f, t0, user("1"), 1).Allowed { // the store's bucket: 99 left
		t.Fatal("the store rejected the first request")
	}
	s.down.Store(true)
	if check(t, f, t0.Add(10*time.Millisecond), user("1"), 1).Allowed {
		t.Fatal("the fallback's bucket begins empty: admitted")
	}
	if !check(t, f, t0.Add(160*time.Millisecond), user("1"), 1).Allowed {
		t.Fatal("the fallback's bucket, 1.5 refilled: rejected")
	}
	s.down.Store(false)
	n := 0
	for range 150 {
		if check(t, f, t0.Add(200*time.Millisecond), user("1"), 1).Allowed {
			n++
		}
	}
	// The store's bucket: 99 + 2 refilled, less the one the fallback
	// admitted (charged at most its refill since it began, 1.5).
	if n < 98 || n > 100 {
		t.Fatalf("the store back: %d admitted, want 98 to 100 (its 99 and 2 refilled, less what the fallback admitted)", n)
	}
}
