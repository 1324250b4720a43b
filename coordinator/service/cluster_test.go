package service_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/coordclient"
)

const clusterConfig = `
domain: api
regions: [us-east, eu-west, ap-south]
limits:
  - {name: global, match: {}, rate: 100000/1s, floors: {us-east: 0.1, eu-west: 0.1, ap-south: 0.1}}
`

var regions = []string{"us-east", "eu-west", "ap-south"}

const period = 300 * time.Millisecond

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startEtcd(t *testing.T) string {
	t.Helper()
	client, peer := "http://"+freeAddr(t), "http://"+freeAddr(t)
	e, err := etcdstore.StartEmbedded(t.TempDir(), client, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return client
}

func etcdClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

type coord struct {
	addr string
	srv  *service.Server
	stop func() // a crash: no resignation, the session expires
}

func startCoordinator(t *testing.T, endpoint string, cfg *allot.Config) *coord {
	t.Helper()
	return startCoordinatorTTL(t, endpoint, cfg, grantTTL)
}

// startCoordinatorTTL is startCoordinator with grants of ttl.
func startCoordinatorTTL(t *testing.T, endpoint string, cfg *allot.Config, ttl time.Duration) *coord {
	t.Helper()
	cli := etcdClient(t, endpoint)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.New(service.Options{
		Store: etcdstore.New(cli, "", etcdstore.WithSessionTTL(2*time.Second)), Config: cfg,
		Advertise: l.Addr().String(), TickEvery: 20 * time.Millisecond, GrantTTL: ttl,
		Coordinator: coordinator.Config{Period: period, HalfLife: period / 4, DeadAfter: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go gs.Serve(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	var once sync.Once
	c := &coord{addr: l.Addr().String(), srv: srv, stop: func() {
		once.Do(func() {
			cli.Close()
			cancel()
			gs.Stop()
			<-done
		})
	}}
	t.Cleanup(c.stop)
	return c
}

type region struct {
	name   string
	engine *regional.Engine
	client *coordclient.Client
	stop   func()
}

func startRegion(t *testing.T, name string, cfg *allot.Config, addrs []string, store *etcdstore.Store) *region {
	t.Helper()
	e := regional.New(cfg, regional.Options{})
	c, err := coordclient.New(coordclient.Options{
		Region: name, Engine: e, Addrs: addrs, ReportEvery: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	var once sync.Once
	r := &region{name: name, engine: e, client: c, stop: func() { once.Do(func() { cancel(); <-done; c.Close() }) }}
	t.Cleanup(r.stop)
	return r
}

func (r *region) share() float64 { return r.engine.Share("api", "global", "") }

// TestDroppedRegionThatLeftIsFreed drops eu-west from the configuration
// while its instance stops gracefully, at the same instant: its leave,
// sent on the stream the reload closes, is said again by the hello of
// its next stream, which the new term takes although the configuration
// no longer lists eu-west. Its share is then free at once, not when its
// grant expires (30 s here). What every region applies sums to at most
// 1 throughout.
func TestDroppedRegionThatLeftIsFreed(t *testing.T) {
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	c := startCoordinatorTTL(t, endpoint, cfg, 30*time.Second)
	store := etcdstore.New(etcdClient(t, endpoint), "")
	rs := map[string]*region{}
	for _, name := range regions {
		rs[name] = startRegion(t, name, cfg, []string{c.addr}, store)
	}
	startLoad(t, []*region{rs["us-east"]}).active.Store("us-east", true) // us-east wants more than its share
	sum := func() float64 { return rs["us-east"].share() + rs["eu-west"].share() + rs["ap-south"].share() }
	for start := time.Now(); rs["eu-west"].share() < 0.09; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("eu-west holds %v, want its floor at least", rs["eu-west"].share())
		}
	}
	next, err := allot.ParseConfig("cluster.yaml", []byte(strings.NewReplacer("regions: [us-east, eu-west, ap-south]", "regions: [us-east, ap-south]",
		", eu-west: 0.1", "").Replace(clusterConfig)))
	if err != nil {
		t.Fatal(err)
	}
	left := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rs["eu-west"].client.Leave(ctx)
		close(left)
	}()
	if err := c.srv.SetConfig(next); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		if s := sum(); s > 1+1e-9 {
			t.Fatalf("applied shares sum to %v after the reload", s)
		}
		if s := rs["us-east"].share() + rs["ap-south"].share(); s > 0.99 {
			t.Logf("eu-west's share free %v after the reload", time.Since(start))
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("15 s after the reload us-east and ap-south apply %v and %v, want eu-west's share freed by its leave (its grant lasts 30 s)",
				rs["us-east"].share(), rs["ap-south"].share())
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-left
}

// load sends traffic to the regions marked active, deciding every 2 ms,
// and counts any error: a region must keep deciding whatever happens to
// the coordinators.
type load struct {
	active sync.Map // region name → bool
	errs   atomic.Int64
	stop   chan struct{}
	wg     sync.WaitGroup
}

func startLoad(t *testing.T, rs []*region) *load {
	l := &load{stop: make(chan struct{})}
	for _, r := range rs {
		l.wg.Go(func() {
			var dec allot.Decision
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				if on, _ := l.active.Load(r.name); on != true {
					continue
				}
				if err := r.engine.Check(time.Now(), "api", allot.Descriptor{{Key: "user", Value: "1"}}, 100, &dec); err != nil {
					l.errs.Add(1)
				}
			}
		})
	}
	t.Cleanup(func() { close(l.stop); l.wg.Wait() })
	return l
}

// waitShares polls until want holds, checking at every poll that the
// shares applied by the regions sum to at most 1.
func waitShares(t *testing.T, rs []*region, what string, within time.Duration, want func(s []float64) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		s := make([]float64, len(rs))
		sum := 0.0
		for i, r := range rs {
			s[i] = r.share()
			sum += s[i]
		}
		if sum > 1+1e-9 {
			t.Fatalf("%s: applied shares %v sum to %v > 1", what, s, sum)
		}
		if want(s) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v; shares %v", what, within, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCoordinatedRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, two coordinators and three regions")
	}
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	a := startCoordinator(t, endpoint, cfg)
	b := startCoordinator(t, endpoint, cfg)
	addrs := []string{a.addr, b.addr}
	store := etcdstore.New(etcdClient(t, endpoint), "")

	// ap-south reaches the coordinators through proxies that the test
	// cuts: a partition between a region and the coordinators.
	tox := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var cuts []*toxiproxy.Proxy
	var viaProxy []string
	for i, addr := range addrs {
		p := toxiproxy.NewProxy(tox, fmt.Sprintf("coordinator-%d", i), "127.0.0.1:0", addr)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		cuts, viaProxy = append(cuts, p), append(viaProxy, p.Listen)
	}
	cut := proxies(cuts)
	var rs []*region
	for _, name := range regions {
		to := addrs
		if name == "ap-south" {
			to = viaProxy
		}
		rs = append(rs, startRegion(t, name, cfg, to, store))
	}
	// Before any assignment: the initial split, 1/3 each.
	waitShares(t, rs, "initial split", 5*time.Second, func(s []float64) bool {
		return near(s[0], 1.0/3) && near(s[1], 1.0/3) && near(s[2], 1.0/3)
	})

	traffic := startLoad(t, rs)
	traffic.active.Store("us-east", true)
	took := waitShares(t, rs, "demand in us-east", 10*time.Second, func(s []float64) bool {
		return near(s[0], 0.8) && near(s[1], 0.1) && near(s[2], 0.1)
	})
	t.Logf("us-east took its share in %v (%.1f periods)", took, float64(took)/float64(period))

	// Demand moves from us-east to eu-west. Each region offers half of L
	// when active: eu-west gets what it uses plus headroom (0.55) at
	// least; us-east keeps at most its claim (a decayed peak of its
	// demand, 0.5) out of what no region needs (coordinator.Allocate).
	traffic.active.Store("us-east", false)
	traffic.active.Store("eu-west", true)
	took = waitShares(t, rs, "demand shift to eu-west", 10*time.Second, func(s []float64) bool {
		return s[1] > 0.53 && s[0] < 0.55 && near(s[2], 0.1)
	})
	t.Logf("after a 100%% demand shift, eu-west had its use and headroom in %v (%.1f periods)", took, float64(took)/float64(period))

	// The leader dies; the standby takes over and regions keep deciding.
	leader, standby := a, b
	if b.srv.Leading("api") {
		leader, standby = b, a
	}
	start := time.Now()
	leader.stop()
	for !standby.srv.Leading("api") {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the standby did not take over within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("standby led %v after the leader died (session TTL 2s)", time.Since(start))

	// ap-south is cut off from the coordinators: it keeps its share and
	// keeps deciding; the others rebalance among themselves.
	cut.Stop()
	cutAt := time.Now()
	frozen := rs[2].share()
	traffic.active.Store("eu-west", false)
	traffic.active.Store("us-east", true)
	traffic.active.Store("ap-south", true)
	waitShares(t, rs, "rebalance without ap-south", 15*time.Second, func(s []float64) bool {
		return s[0] > 0.53 // its use plus headroom; eu-west's claim may keep the rest
	})
	// It holds its share until its grant expires (granted at most a grant
	// TTL before the cut), then nothing: the others may have been raised
	// out of it since.
	if got := rs[2].share(); got != frozen && got != 0 {
		t.Fatalf("%v after it was cut off, the region's share moved from %v to %v", time.Since(cutAt), frozen, got)
	}
	// Healed, ap-south's demand counts again: it gets a share of its own.
	traffic.active.Store("us-east", false)
	if err := cut.Start(); err != nil {
		t.Fatal(err)
	}
	waitShares(t, rs, "ap-south healed", 15*time.Second, func(s []float64) bool {
		return s[2] > 0.53
	})
	if n := traffic.errs.Load(); n != 0 {
		t.Fatalf("%d decisions failed while coordinators failed over", n)
	}

	// Everything restarts: regions resume from the persisted assignment,
	// not from the initial split.
	for _, r := range rs {
		r.stop()
	}
	standby.stop()
	want := []float64{rs[0].share(), rs[1].share()}
	c := startCoordinator(t, endpoint, cfg)
	var again []*region
	for _, name := range regions[:2] {
		again = append(again, startRegion(t, name, cfg, []string{c.addr}, store))
	}
	waitShares(t, again, "shares after a full restart", grantTTL+5*time.Second, // the new leader waits for the old instances' grants to expire
		func(s []float64) bool {
			return near(s[0], want[0]) && near(s[1], want[1])
		})
}

// proxies cut and heal several toxiproxy proxies at once.
type proxies []*toxiproxy.Proxy

func (ps proxies) Stop() {
	for _, p := range ps {
		p.Stop()
	}
}

func (ps proxies) Start() error {
	for _, p := range ps {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

// grantTTL is the tests' grant lifetime: an instance cut off from the
// coordinators holds nothing this long after its last renewal.
const grantTTL = 5 * time.Second

func near(a, b float64) bool { return a-b < 0.05 && b-a < 0.05 }

func TestSetConfigRestartsLeadership(t *testing.T) {
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	c := startCoordinator(t, endpoint, cfg)
	store := etcdstore.New(etcdClient(t, endpoint), "")
	r := startRegion(t, "us-east", cfg, []string{c.addr}, store)
	for _, name := range regions[1:] {
		startRegion(t, name, cfg, []string{c.addr}, store)
	}
	startLoad(t, []*region{r}).active.Store("us-east", true) // demand makes the coordinator persist
	waitTerm := func(after int64) int64 {
		t.Helper()
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			if snap, err := store.Snapshot(context.Background(), "api"); err == nil && snap.Term > after {
				return snap.Term
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("no assignment persisted by a term after %d", after)
			}
		}
	}
	term := waitTerm(0)
	bad, err := allot.ParseConfig("other.yaml", []byte("domain: other\nregions: [a]\nlimits:\n  - {name: x, rate: 1/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.srv.SetConfig(bad); err == nil {
		t.Fatal("a config without the coordinated domain was taken")
	}
	next, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig+"  - {name: second, match: {user: \"*\"}, rate: 10/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.srv.SetConfig(next); err != nil {
		t.Fatal(err)
	}
	if later := waitTerm(term); later <= term {
		t.Fatalf("term %d after the reload, was %d", later, term)
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if got := r.share(); got > 0 && got <= 1 {
			break
		} else if time.Since(start) > 5*time.Second {
			t.Fatalf("share after the reload: %v", got)
		}
	}
}
