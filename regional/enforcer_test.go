package regional

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// countingStore counts the calls that reach a store.
type countingStore struct {
	Store
	takes, leases atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, now time.Time, ops []TakeOp, res []TakeResult) error {
	c.takes.Add(1)
	return c.Store.Take(ctx, now, ops, res)
}

func (c *countingStore) Lease(ctx context.Context, now time.Time, ops []LeaseOp, res []LeaseResult) error {
	c.leases.Add(1)
	return c.Store.Lease(ctx, now, ops, res)
}

func newEnforcer(t *testing.T, yaml string, s Store, instance string) *Enforcer {
	t.Helper()
	return NewEnforcer(New(mustConfig(t, yaml), Options{}), s, EnforcerOptions{Region: "r", Instance: instance})
}

func check(t *testing.T, f *Enforcer, at time.Time, d allot.Descriptor, hits int64) allot.Decision {
	t.Helper()
	var dec allot.Decision
	if err := f.CheckItems(context.Background(), at, "api", []Item{{Descriptor: d, Hits: hits}}, &dec); err != nil {
		t.Fatal(err)
	}
	return dec
}

func entry(k, v string) allot.Descriptor { return allot.Descriptor{{Key: k, Value: v}} }

func TestEnforcerExactInstancesShareOneBucket(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 10/1h, enforcement: exact}
`
	s := &countingStore{Store: &MemoryStore{}}
	fs := []*Enforcer{newEnforcer(t, cfg, s, "a"), newEnforcer(t, cfg, s, "b"), newEnforcer(t, cfg, s, "c")}
	admitted := 0
	for i := range 30 {
		if dec := check(t, fs[i%3], t0.Add(ms(i)), user("1"), 1); dec.Allowed {
			admitted++
		} else if dec.RetryAfter <= 0 {
			t.Fatalf("request %d: rejected without a retry: %+v", i, dec)
		}
	}
	if admitted != 10 || s.takes.Load() != 30 {
		t.Fatalf("admitted %d with %d store calls, want 10 with one call per decision", admitted, s.takes.Load())
	}
}

func TestEnforcerChargesAllOrNothing(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/1h}
  - {name: per-user, match: {user: "*"}, rate: 100/1h, enforcement: leased}
  - {name: login, match: {route: "/login"}, rate: 3/1h, enforcement: exact}
`
	f := newEnforcer(t, cfg, &MemoryStore{}, "a")
	all := allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "1"}, {Key: "route", Value: "/login"}}
	before := check(t, f, t0, user("1"), 1).Statuses[0].Remaining
	for i := range 4 {
		dec := check(t, f, t0, all, 1)
		if dec.Allowed != (i < 3) || len(dec.Statuses) != 3 {
			t.Fatalf("request %d: %+v", i, dec)
		}
	}
	// The 4th was rejected by login: neither per-tenant nor per-user kept its charge.
	if got := check(t, f, t0, entry("tenant", "acme"), 0).Statuses[0].Remaining; got != 97 {
		t.Fatalf("per-tenant: %d left, want 97", got)
	}
	if got := check(t, f, t0, user("1"), 1).Statuses[0].Remaining; got != before-4 {
		t.Fatalf("per-user: %d left, want %d", got, before-4)
	}
}

func TestEnforcerRefundItems(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/1h}
  - {name: login, match: {user: "*"}, rate: 3/1h, enforcement: exact}
`
	f := newEnforcer(t, cfg, &MemoryStore{}, "a")
	both := allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "1"}}
	for range 3 {
		check(t, f, t0, both, 1)
	}
	var dec allot.Decision
	if err := f.RefundItems(context.Background(), t0, "api", []Item{{Descriptor: both, Hits: 2}}, &dec); err != nil {
		t.Fatal(err)
	}
	if dec.Statuses[0].Remaining != 99 || dec.Statuses[1].Remaining != 2 {
		t.Fatalf("after refunding 2: %+v, want 99 and 2 left", dec.Statuses)
	}
	if !check(t, f, t0, both, 2).Allowed {
		t.Fatal("the refunded hits cannot be used again")
	}
}

func TestEnforcerLeasedNeedsFewStoreCalls(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 100k/1s, enforcement: leased}
`
	s := &countingStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	admitted := 0
	for i := range 100_000 {
		if check(t, f, t0.Add(time.Duration(i)*20*time.Microsecond), user("1"), 1).Allowed { // 50k/s
			admitted++
		}
	}
	calls := s.takes.Load() + s.leases.Load()
	if admitted != 100_000 || float64(calls)/float64(admitted) > 0.01 {
		t.Fatalf("admitted %d with %d store calls, want all with at most one call per 100", admitted, calls)
	}
}

func TestEnforcerLeasedStaysWithinTheBucket(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1h, enforcement: leased}
`
	s := &MemoryStore{}
	var fs []*Enforcer
	for i := range 3 {
		f := newEnforcer(t, cfg, s, fmt.Sprint(i))
		f.Tick(context.Background(), t0)
		fs = append(fs, f)
	}
	admitted := 0
	for i := range 1000 {
		if check(t, fs[i%3], t0.Add(ms(1)), user("1"), 1).Allowed {
			admitted++
		}
	}
	// No time passes: the bucket's burst is all there is, and all of it is spent.
	if admitted != 100 {
		t.Fatalf("admitted %d, want exactly the burst, 100", admitted)
	}
}

func TestEnforcerReturnsExpiredLeases(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000/1h, enforcement: leased}
`
	s := &MemoryStore{}
	a, b := newEnforcer(t, cfg, s, "a"), newEnforcer(t, cfg, s, "b")
	for i := range 50 {
		if !check(t, a, t0.Add(ms(i)), user("1"), 1).Allowed {
			t.Fatalf("request %d rejected", i)
		}
	}
	held := 1000 - 50 - availableIn(t, s, "api/per-user:user=1")
	if held <= 0 {
		t.Fatalf("a holds %v tokens, want a lease", held)
	}
	a.Tick(context.Background(), t0.Add(2*time.Second))
	if got := availableIn(t, s, "api/per-user:user=1"); got != 950 {
		t.Fatalf("after a's lease expired the store holds %v, want 950", got)
	}
	st := a.Stats().Limits[0]
	if st.LeaseExpirations != 1 || st.LeaseReturns != 1 || st.TokensReturned != uint64(held) || st.LeaseGrants == 0 {
		t.Fatalf("stats %+v", st)
	}
	if !check(t, b, t0.Add(2*time.Second), user("1"), 1).Allowed {
		t.Fatal("b cannot use the returned tokens")
	}
}

// availableIn is what the store's bucket of a 1000/1h key holds.
func availableIn(t *testing.T, s *MemoryStore, key string) float64 {
	t.Helper()
	res := make([]LeaseResult, 1)
	b := Bucket{Key: key, Algorithm: allot.TokenBucket, Amount: 1000, Burst: 1000, Period: time.Hour}
	if err := s.Lease(context.Background(), t0, []LeaseOp{{Bucket: b}}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Available
}

func TestEnforcerOnFailure(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: open, match: {a: "*"}, rate: 1/1h, enforcement: exact, on_failure: open}
  - {name: closed, match: {b: "*"}, rate: 100/1h, enforcement: exact, on_failure: closed}
  - {name: local, match: {c: "*"}, rate: 100/1h, enforcement: exact, on_failure: local}
  - {name: leased, match: {d: "*"}, rate: 100/1h, enforcement: leased, on_failure: local}
`
	s := &MemoryStore{}
	fs := make([]*Enforcer, 4)
	for i := range fs {
		fs[i] = newEnforcer(t, cfg, s, fmt.Sprint(i))
	}
	for _, at := range []time.Time{t0, t0.Add(time.Second)} { // twice: the first ones see the later ones
		for _, f := range fs {
			f.Tick(context.Background(), at)
		}
	}
	f := fs[0]
	if f.Instances() != 4 {
		t.Fatalf("%d instances, want 4", f.Instances())
	}
	s.SetErr(errors.New("connection refused"))
	for i := range 3 {
		if dec := check(t, f, t0, entry("a", "1"), 1); !dec.Allowed {
			t.Fatalf("open, request %d: rejected", i)
		}
		if dec := check(t, f, t0, entry("b", "1"), 1); dec.Allowed || dec.RetryAfter != closedRetryAfter {
			t.Fatalf("closed, request %d: %+v", i, dec)
		}
	}
	// A token bucket in fallback is empty when the fallback begins (the
	// store may have spent it) and fills at the instance's part of the
	// rate: nothing at once, 100 ÷ 4 = 25 an hour later.
	for _, key := range []string{"c", "d"} {
		for _, c := range []struct {
			at   time.Time
			want int
		}{{t0, 0}, {t0.Add(time.Hour), 25}} {
			admitted := 0
			for range 100 {
				if check(t, f, c.at, entry(key, "1"), 1).Allowed {
					admitted++
				}
			}
			if admitted != c.want {
				t.Fatalf("on_failure local (%s) at %v: admitted %d, want %d", key, c.at.Sub(t0), admitted, c.want)
			}
		}
	}
	want := map[string]LimitStats{
		"open":   {FallbackAllowed: 3},
		"closed": {FallbackRejected: 3},
		"local":  {FallbackAllowed: 25, FallbackRejected: 175},
		"leased": {FallbackAllowed: 25, FallbackRejected: 175},
	}
	for _, st := range f.Stats().Limits {
		w := want[st.Limit]
		if !st.Fallback || st.FallbackAllowed != w.FallbackAllowed || st.FallbackRejected != w.FallbackRejected {
			t.Errorf("%s: %+v, want fallback with %+v", st.Limit, st, w)
		}
	}
	s.SetErr(nil) // the store is back: the next call leaves the fallback
	if dec := check(t, f, t0.Add(time.Hour), entry("a", "1"), 1); !dec.Allowed {
		t.Fatalf("after recovery: %+v", dec)
	}
	if dec := check(t, f, t0.Add(time.Hour), entry("a", "1"), 1); dec.Allowed {
		t.Fatal("after recovery the store's bucket (1/1h) is not enforced")
	}
	if st := f.Stats().Limits; st[3].Limit != "open" || st[3].Fallback || !st[0].Fallback {
		t.Fatalf("after recovery, only the limit that reached the store leaves the fallback: %+v", st)
	}
}

func TestEnforcerInstancesFollowMembership(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 10/1h, enforcement: exact}
`
	s := &MemoryStore{}
	var fs []*Enforcer
	tick := func(at time.Time, fs []*Enforcer) {
		for _, f := range fs {
			f.Tick(context.Background(), at)
		}
	}
	for i := range 20 {
		fs = append(fs, newEnforcer(t, cfg, s, fmt.Sprint(i)))
	}
	tick(t0, fs)
	if n := fs[0].Instances(); n != 1 {
		t.Fatalf("first to join sees %d, want 1", n)
	}
	tick(t0.Add(time.Second), fs)
	if n := fs[0].Instances(); n != 20 {
		t.Fatalf("after a heartbeat: %d, want 20", n)
	}
	for _, f := range fs[15:] { // scale in: five leave
		if err := f.Close(context.Background(), t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	tick(t0.Add(2*time.Second), fs[:15])
	if n := fs[0].Instances(); n != 15 {
		t.Fatalf("after five left: %d, want 15", n)
	}
	// Five crash: they stop heartbeating and expire after three heartbeats.
	for i := 3; i <= 4; i++ {
		tick(t0.Add(time.Duration(i)*time.Second), fs[:10])
	}
	if n := fs[0].Instances(); n != 15 {
		t.Fatalf("before the crashed ones expire: %d, want 15", n)
	}
	tick(t0.Add(5*time.Second), fs[:10])
	if n := fs[0].Instances(); n != 10 {
		t.Fatalf("after the crashed ones expired: %d, want 10", n)
	}
}

func TestEnforcerLocalDomainGoesToTheEngine(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000000/1s}
`
	s := &countingStore{Store: &MemoryStore{}}
	f := newEnforcer(t, cfg, s, "a")
	items := []Item{{Descriptor: user("1"), Hits: 1}}
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	allocs := testing.AllocsPerRun(100, func() {
		f.CheckItems(context.Background(), t0, "api", items, &dec)
	})
	if allocs != 0 || s.takes.Load()+s.leases.Load() != 0 || !dec.Allowed {
		t.Fatalf("%v allocations, %d store calls, %+v", allocs, s.takes.Load()+s.leases.Load(), dec)
	}
}

// TestClosedRejectionsAreNotDemand: what on_failure closed rejects while
// the store is down is not the region's demand: no share would admit it,
// so the coordinator gives the region's share to regions that can use it
// meanwhile (sim/scenarios/store-outage-closed.yaml). What the store
// decides is demand, admitted or rejected.
func TestClosedRejectionsAreNotDemand(t *testing.T) {
	const cfg = `
domain: api
limits:
  - {name: closed, match: {b: "*"}, rate: 2/1h, enforcement: exact, on_failure: closed}
`
	s := &MemoryStore{}
	f := newEnforcer(t, cfg, s, "0")
	f.Tick(context.Background(), t0)
	demand := func() (admitted, rejected float64) {
		for _, d := range f.engine.Demand() {
			if d.Limit == "closed" && d.Key == "" {
				admitted, rejected = admitted+d.Admitted, rejected+d.Rejected
			}
		}
		return admitted, rejected
	}
	for range 3 {
		check(t, f, t0, entry("b", "1"), 1)
	}
	if a, r := demand(); a != 2 || r != 1 {
		t.Fatalf("with the store up: demand admitted %v rejected %v, want 2 and 1", a, r)
	}
	s.SetErr(errors.New("connection refused"))
	for i := range 3 {
		if dec := check(t, f, t0, entry("b", "2"), 1); dec.Allowed {
			t.Fatalf("closed, request %d: admitted", i)
		}
	}
	if a, r := demand(); a != 0 || r != 0 {
		t.Fatalf("with the store down: demand admitted %v rejected %v, want none: closed rejected them", a, r)
	}
}
