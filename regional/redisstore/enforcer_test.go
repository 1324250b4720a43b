package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/sony/gobreaker/v2"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // dial failures are what these tests cause
	os.Exit(m.Run())
}

// slack is what a decision may take beyond the store's deadline on a busy
// CI machine.
const slack = 20 * time.Millisecond

// instance is one allot process of a region: its own engine, store
// connection and Enforcer.
func instance(t *testing.T, yaml, id string, sopts redisstore.Options, timeout time.Duration) (*regional.Enforcer, *redisstore.Store) {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, sopts)
	if err := s.Ping(context.Background()); err != nil { // warm: the first call would miss a short deadline
		t.Fatal(err)
	}
	f := regional.NewEnforcer(regional.New(cfg, regional.Options{}), s, regional.EnforcerOptions{
		Region: "r", Instance: id, StoreTimeout: timeout, Heartbeat: 100 * time.Millisecond})
	return f, s
}

func decide(t *testing.T, f *regional.Enforcer, d allot.Descriptor) allot.Decision {
	t.Helper()
	var dec allot.Decision
	if err := f.CheckItems(context.Background(), time.Now(), "api", []regional.Item{{Descriptor: d, Hits: 1}}, &dec); err != nil {
		t.Fatal(err)
	}
	return dec
}

func desc(k, v string) allot.Descriptor { return allot.Descriptor{{Key: k, Value: v}} }

// hammer runs workers goroutines on each enforcer, each deciding d until
// stop says so, and returns how many were admitted.
func hammer(t *testing.T, fs []*regional.Enforcer, workers int, d allot.Descriptor, stop func(n int) bool) int {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, f := range fs {
		for range workers {
			wg.Go(func() {
				for n := 0; !stop(n); n++ {
					var dec allot.Decision
					if err := f.CheckItems(context.Background(), time.Now(), "api", []regional.Item{{Descriptor: d, Hits: 1}}, &dec); err != nil {
						t.Error(err)
						return
					}
					if dec.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return int(admitted.Load())
}

func TestExactAdmitsExactlyTheLimit(t *testing.T) {
	srv := redistest.Start(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 200/1h, enforcement: exact, on_failure: closed}
`
	var fs []*regional.Enforcer
	for i := range 3 {
		f, _ := instance(t, cfg, fmt.Sprint(i), redisstore.Options{Addrs: []string{srv.Addr}}, 5*time.Second)
		fs = append(fs, f)
	}
	admitted := hammer(t, fs, 16, desc("user", "1"), func(n int) bool { return n >= 20 }) // 960 requests
	if admitted != 200 {
		t.Fatalf("admitted %d of 960, want exactly 200; stats %+v", admitted, fs[0].Stats())
	}
}

func TestLeasedStaysWithinItsBound(t *testing.T) {
	srv := redistest.Start(t)
	const cfg = `
domain: api
limits:
  - {name: per-tenant, match: {tenant: "*"}, rate: 2000/1s, burst: 200, enforcement: leased, on_failure: closed}
`
	var fs []*regional.Enforcer
	for i := range 3 {
		f, _ := instance(t, cfg, fmt.Sprint(i), redisstore.Options{Addrs: []string{srv.Addr}}, 5*time.Second)
		fs = append(fs, f)
	}
	for _, at := range []time.Time{time.Now(), time.Now().Add(100 * time.Millisecond)} { // twice: every instance sees all three
		for _, f := range fs {
			f.Tick(context.Background(), at)
		}
	}
	if n := fs[0].Instances(); n != 3 {
		t.Fatalf("%d instances, want 3", n)
	}
	start := time.Now()
	end := start.Add(time.Second)
	admitted := hammer(t, fs, 8, desc("tenant", "acme"), func(int) bool { return time.Now().After(end) })
	took := time.Since(start)
	// The key is fresh: leases hold nothing at the start, and the bound is
	// the bucket's, burst + rate × T.
	bound := 200 + int(2000*took.Seconds())
	var grants uint64
	for _, f := range fs {
		grants += f.Stats().Limits[0].LeaseGrants
	}
	t.Logf("admitted %d in %v (bound %d) with %d leases", admitted, took, bound, grants)
	if admitted > bound || admitted < 200 {
		t.Fatalf("admitted %d in %v, want between the burst (200) and burst + rate × T = %d", admitted, took, bound)
	}
	if grants*5 > uint64(admitted) {
		t.Fatalf("%d leases for %d admitted: leases are too small", grants, admitted)
	}
}

func TestSlowRedisKeepsTheDeadline(t *testing.T) {
	srv := redistest.Start(t)
	proxy := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "redis", "127.0.0.1:0", srv.Addr)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	const cfg = `
domain: api
limits:
  - {name: open, match: {a: "*"}, rate: 1000/1h, enforcement: exact, on_failure: open}
  - {name: closed, match: {b: "*"}, rate: 1000/1h, enforcement: exact, on_failure: closed}
  - {name: local, match: {c: "*"}, rate: 10/1h, enforcement: exact, on_failure: local}
  - {name: leased, match: {d: "*"}, rate: 1000/1h, enforcement: leased, on_failure: local}
`
	const deadline = 5 * time.Millisecond
	f, s := instance(t, cfg, "a", redisstore.Options{Addrs: []string{proxy.Listen}, Cooldown: 200 * time.Millisecond}, deadline)
	// The first calls of a new client (connections, scripts) can take
	// longer than 5ms on a loaded machine: the test starts once the store
	// answers every limit (a take and a lease) within the deadline. (A
	// local fallback's bucket begins empty: a warm-up that fell back
	// would reject.)
	tries := 0
	waitUntil(t, 5*time.Second, "the store answers within the deadline", func() bool {
		tries++ // keys of their own: one that fell back owes its store
		for _, k := range []string{"a", "b", "c", "d"} {
			if !decide(t, f, desc(k, fmt.Sprint("warm-up-", tries))).Allowed || s.Breaker() != gobreaker.StateClosed {
				return false
			}
		}
		return true
	})
	for _, k := range []string{"a", "b", "c", "d"} {
		if dec := decide(t, f, desc(k, "1")); !dec.Allowed {
			t.Fatalf("%s before the toxic: %+v", k, dec)
		}
	}
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name": "slow", "type": "latency", "attributes": {"latency": 50}}`)); err != nil {
		t.Fatal(err)
	}
	sawOpen := false
	for i := range 50 {
		for _, c := range []struct {
			key     string
			allowed bool
		}{{"a", true}, {"b", false}, {"c", i < 10}, {"d", i < 10}} {
			start := time.Now()
			dec := decide(t, f, desc(c.key, fmt.Sprint(i%2)))
			if took := time.Since(start); took > deadline+slack {
				t.Fatalf("decision %d on %s took %v with a deadline of %v", i, c.key, took, deadline)
			}
			if c.key != "c" && c.key != "d" && dec.Allowed != c.allowed {
				t.Fatalf("decision %d on %s: allowed %v, want %v by on_failure", i, c.key, dec.Allowed, c.allowed)
			}
		}
		sawOpen = sawOpen || s.Breaker() == gobreaker.StateOpen
	}
	if !sawOpen {
		t.Error("the breaker never opened")
	}
	for _, st := range f.Stats().Limits {
		if !st.Fallback || st.FallbackAllowed+st.FallbackRejected == 0 {
			t.Errorf("%s: %+v, want it in fallback", st.Limit, st)
		}
		if st.Limit == "local" && st.FallbackAllowed != 10+9 { // 10 on user 0 and on user 1, less the one Redis admitted
			t.Logf("local fallback admitted %d", st.FallbackAllowed)
		}
	}
	if err := proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "decisions go to Redis again", func() bool {
		decide(t, f, desc("a", "x"))
		return !stats(f, "open").Fallback
	})
}

func stats(f *regional.Enforcer, limit string) regional.LimitStats {
	for _, st := range f.Stats().Limits {
		if st.Limit == limit {
			return st
		}
	}
	return regional.LimitStats{}
}

// waitUntil polls cond until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisRestartRecovers(t *testing.T) {
	srv := redistest.Start(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 100/1h, enforcement: exact, on_failure: local}
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/1h, enforcement: leased, on_failure: local}
`
	const deadline = 5 * time.Millisecond
	f, _ := instance(t, cfg, "a", redisstore.Options{Addrs: []string{srv.Addr}, Cooldown: 200 * time.Millisecond}, deadline)
	var admitted [2]atomic.Int64
	var slow atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, d := range []allot.Descriptor{desc("user", "1"), desc("tenant", "acme")} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if decide(t, f, d).Allowed {
					admitted[i].Add(1)
				}
				if time.Since(start) > deadline+slack {
					slow.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	waitUntil(t, 5*time.Second, "load on Redis", func() bool { return admitted[0].Load() > 10 && admitted[1].Load() > 10 })
	srv.Kill()
	waitUntil(t, 5*time.Second, "fallback", func() bool { return stats(f, "otp").Fallback && stats(f, "per-tenant").Fallback })
	srv.Restart()
	waitUntil(t, 10*time.Second, "back on Redis", func() bool { return !stats(f, "otp").Fallback && !stats(f, "per-tenant").Fallback })
	close(stop)
	wg.Wait()
	// Redis keeps nothing across the restart (no persistence): each of its
	// two lives admits up to the burst, and the fallback up to its share
	// (one instance: the whole burst).
	for i := range admitted {
		if n := admitted[i].Load(); n > 300 {
			t.Errorf("limit %d admitted %d, want at most 3 × burst", i, n)
		}
	}
	if n := slow.Load(); n > 0 {
		t.Errorf("%d decisions took longer than %v", n, deadline+slack)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 1000/1h, enforcement: exact, on_failure: closed}
  - {name: per-ip, match: {ip: "*"}, rate: 3/1h, enforcement: exact, on_failure: closed}
`
	const deadline = 5 * time.Millisecond
	f, _ := instance(t, cfg, "a", redisstore.Options{Addrs: c.Addrs(), Cluster: true, Cooldown: 200 * time.Millisecond}, time.Second)
	t.Run("several slots, all or nothing", func(t *testing.T) {
		both := allot.Descriptor{{Key: "user", Value: "9"}, {Key: "ip", Value: "10.0.0.1"}}
		for i := range 5 {
			if dec := decide(t, f, both); dec.Allowed != (i < 3) {
				t.Fatalf("request %d: %+v", i, dec)
			}
		}
		if dec := decide(t, f, desc("user", "9")); dec.Statuses[0].Remaining != 996 {
			t.Fatalf("otp after 3 admitted and 2 rejected: %+v, want 996 left", dec.Statuses[0])
		}
	})
	t.Run("primary killed", func(t *testing.T) {
		f, _ := instance(t, cfg, "b", redisstore.Options{Addrs: c.Addrs(), Cluster: true, Cooldown: 200 * time.Millisecond}, deadline)
		user := desc("user", "1")
		// A new client learns the cluster's slots on its first calls,
		// which a loaded machine can stretch past the 5ms deadline: the
		// test starts once the store answers in time.
		waitUntil(t, 5*time.Second, "the store answers within the deadline", func() bool {
			return decide(t, f, desc("user", "warm-up")).Allowed && !stats(f, "otp").Fallback
		})
		if !decide(t, f, user).Allowed {
			t.Fatal("rejected before the failure")
		}
		c.PrimaryOf(t, redisstore.DefaultPrefix+"{api/otp:user=1}").Kill()
		waitUntil(t, 5*time.Second, "fallback", func() bool {
			start := time.Now()
			decide(t, f, user)
			if took := time.Since(start); took > deadline+slack {
				t.Fatalf("a decision took %v", took)
			}
			return stats(f, "otp").Fallback
		})
		waitUntil(t, 20*time.Second, "a replica takes over", func() bool {
			decide(t, f, user)
			return !stats(f, "otp").Fallback
		})
	})
}

func TestInstancesFollowJoinAndLeave(t *testing.T) {
	srv := redistest.Start(t)
	const cfg = `
domain: api
limits:
  - {name: otp, match: {user: "*"}, rate: 10/1h, enforcement: exact}
`
	var fs []*regional.Enforcer
	for i := range 6 {
		f, _ := instance(t, cfg, fmt.Sprint(i), redisstore.Options{Addrs: []string{srv.Addr}}, time.Second)
		fs = append(fs, f)
	}
	tickUntil := func(live []*regional.Enforcer, want int) {
		t.Helper()
		waitUntil(t, 5*time.Second, fmt.Sprintf("%d instances", want), func() bool {
			ok := true
			for _, f := range live {
				f.Tick(context.Background(), time.Now())
				ok = ok && f.Instances() == want
			}
			return ok
		})
	}
	tickUntil(fs, 6)
	if err := fs[5].Close(context.Background(), time.Now()); err != nil { // scale in
		t.Fatal(err)
	}
	tickUntil(fs[:5], 5)
	tickUntil(fs[:4], 4) // one crashed: it expires after three heartbeats
}

// TestLeasedSaturatedWindowUsesItsAllowance hammers a leased sliding
// window of 1000/1s from 2 instances of 4 workers each on a real
// redis-server (the windows are Redis TIME's, which is this machine's
// clock) and counts what they admit in each whole window: at most the
// window's amount (by the decisions' own stamps, within 1%), and at least
// 99% of it (a lease short of a whole one
// used to wait for it; what the store and the leases held when a window
// ended was lost).
func TestLeasedSaturatedWindowUsesItsAllowance(t *testing.T) {
	srv := redistest.Start(t)
	const cfg = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000/1s, algorithm: sliding_window, enforcement: leased, on_failure: closed}
`
	var fs []*regional.Enforcer
	for i := range 2 {
		f, _ := instance(t, cfg, fmt.Sprint(i), redisstore.Options{Addrs: []string{srv.Addr}}, 5*time.Second)
		fs = append(fs, f)
	}
	for _, f := range fs {
		f.Tick(context.Background(), time.Now())
	}
	for _, f := range fs {
		f.Tick(context.Background(), time.Now())
	}
	// Two windows to settle, then three to count.
	start := time.Now().Truncate(time.Second).Add(time.Second)
	first, end := start.Add(2*time.Second), start.Add(5*time.Second)
	time.Sleep(time.Until(start))
	var mu sync.Mutex
	perWindow := map[int64]int{}
	var wg sync.WaitGroup
	for _, f := range fs {
		for range 4 {
			wg.Go(func() {
				for {
					now := time.Now()
					if !now.Before(end) {
						return
					}
					var dec allot.Decision
					if err := f.CheckItems(context.Background(), now, "api", []regional.Item{{Descriptor: desc("user", "1"), Hits: 1}}, &dec); err != nil {
						t.Error(err)
						return
					}
					if dec.Allowed && !now.Before(first) {
						mu.Lock()
						perWindow[now.Unix()]++
						mu.Unlock()
					}
					if !dec.Allowed {
						time.Sleep(100 * time.Microsecond) // 8 workers: up to 80,000 rejected requests a second
					}
				}
			})
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	for now := range tick.C {
		if !now.Before(end) {
			break
		}
		for _, f := range fs {
			f.Tick(context.Background(), now)
		}
	}
	tick.Stop()
	wg.Wait()
	total := 0
	for w, n := range perWindow {
		total += n
		// A decision is stamped before it waits for a store call that
		// another request runs: one stamped just before a window's end
		// may spend the next window's lease. 1% of slack for that.
		if n > 1010 {
			t.Errorf("window %d admitted %d, above 1000 (+1%%)", w, n)
		}
	}
	var grants uint64
	for _, f := range fs {
		grants += f.Stats().Limits[0].LeaseGrants
	}
	t.Logf("admitted %v (%d in 3 windows) with %d leases", perWindow, total, grants)
	if len(perWindow) != 3 || total < 2970 {
		t.Errorf("admitted %d in %d windows, want ≥ 99%% of 1000 in each of 3", total, len(perWindow))
	}
}
