package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/redistest"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/server"
)

const sdkConfig = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 400/s}
  - {name: hourly, match: {tenant: "*"}, rate: 1000/h, on_failure: local}
  - {name: open, match: {route: "*"}, rate: 10/h, on_failure: open}
  - {name: closed, match: {plan: "*"}, rate: 1000/h, on_failure: closed}
  - {name: login, match: {login: "*"}, rate: 5/h, enforcement: exact}
  - name: tokens
    match: {org: "*"}
    unit: tokens
    rate: 10000/m
`

// enforcer is one regional enforcer serving on loopback.
type enforcer struct {
	addr string
	svc  *server.Service
	gs   *grpc.Server
}

func startEnforcer(t *testing.T, yaml string, f func(*allot.Config, *regional.Engine) *regional.Enforcer) *enforcer {
	t.Helper()
	cfg, err := allot.ParseConfig("sdk.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	eng := regional.New(cfg, regional.Options{})
	opts := server.Options{Region: "r"}
	if f != nil {
		opts.Enforcer = f(cfg, eng)
	}
	svc := server.New(eng, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return &enforcer{addr: l.Addr().String(), svc: svc, gs: gs}
}

// remaining asks the enforcer's engine what a key has left.
func (e *enforcer) remaining(t *testing.T, d allot.Descriptor) int64 {
	t.Helper()
	var dec allot.Decision
	if err := e.svc.Engine().Check(time.Now(), "api", d, 0, &dec); err != nil {
		t.Fatal(err)
	}
	return dec.Statuses[0].Remaining
}

func newClient(t *testing.T, addrs ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Addrs: addrs, SyncInterval: 50 * time.Millisecond, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func one(k, v string) []allot.Descriptor { return []allot.Descriptor{{{Key: k, Value: v}}} }

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hammer runs workers goroutines per client, each asking d until stop,
// and returns the admitted count.
func hammer(cs []*client.Client, workers int, ds []allot.Descriptor, stop <-chan struct{}) (admitted, rejected int64) {
	var a, r atomic.Int64
	var wg sync.WaitGroup
	for _, c := range cs {
		for range workers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					d := c.Allow(context.Background(), "api", ds, 1)
					if d.Err != nil {
						panic(d.Err)
					}
					if d.Allowed {
						a.Add(1)
					} else {
						r.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return a.Load(), r.Load()
}

// TestManyClientsStayWithinTheLimit: 8 gateways hammer one 400/s key.
// Every admitted request was charged to the enforcer's bucket, in a lease
// at most one lease TTL earlier, so admitted ≤ burst + rate·(T + TTL).
func TestManyClientsStayWithinTheLimit(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	var cs []*client.Client
	for range 8 {
		cs = append(cs, newClient(t, e.addr))
	}
	stop := make(chan struct{})
	start := time.Now()
	time.AfterFunc(1500*time.Millisecond, func() { close(stop) })
	admitted, rejected := hammer(cs, 4, one("user", "hot"), stop)
	elapsed := time.Since(start)
	bound := 400 + 400*(elapsed+server.DefaultLeaseTTL).Seconds()
	var rpcs, local int64
	for _, c := range cs {
		s := c.Stats()
		rpcs += s.CheckRPCs + s.LeaseRPCs
		local += s.LocalDecided
	}
	t.Logf("admitted %d rejected %d in %v (bound %.0f); %d RPCs for %d requests (%.4f per request), %d decided locally",
		admitted, rejected, elapsed, bound, rpcs, admitted+rejected, float64(rpcs)/float64(admitted+rejected), local)
	if float64(admitted) > bound {
		t.Fatalf("admitted %d > bound %.0f", admitted, bound)
	}
	// Not capped at the naive even split (one eighth each): the gateways
	// together admit well above what one gateway's eighth would.
	if float64(admitted) < 2*(400+400*elapsed.Seconds())/8 {
		t.Fatalf("admitted %d: leases do not follow demand", admitted)
	}
}

// TestLeasedOverRedis: two enforcer instances of a region share a real
// redis-server with leased enforcement; four gateways across both stay
// within the limit.
func TestLeasedOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	const yaml = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 300/s, enforcement: leased}
`
	var es []*enforcer
	for i := range 2 {
		es = append(es, startEnforcer(t, yaml, func(_ *allot.Config, eng *regional.Engine) *regional.Enforcer {
			st, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			f := regional.NewEnforcer(eng, st, regional.EnforcerOptions{Region: "r", Instance: fmt.Sprint("i", i), StoreTimeout: time.Second})
			t.Cleanup(func() { f.Close(context.Background(), time.Now()) })
			return f
		}))
	}
	cs := []*client.Client{newClient(t, es[0].addr), newClient(t, es[0].addr), newClient(t, es[1].addr), newClient(t, es[1].addr)}
	stop := make(chan struct{})
	start := time.Now()
	time.AfterFunc(1500*time.Millisecond, func() { close(stop) })
	admitted, rejected := hammer(cs, 4, one("user", "r"), stop)
	elapsed := time.Since(start)
	// Redis leases of the enforcers and gateway leases each hold tokens
	// charged up to one TTL (1s each) before they are spent.
	bound := 300 + 300*(elapsed+2*server.DefaultLeaseTTL).Seconds()
	t.Logf("admitted %d rejected %d in %v, bound %.0f", admitted, rejected, elapsed, bound)
	if float64(admitted) > bound {
		t.Fatalf("admitted %d > bound %.0f", admitted, bound)
	}
	if admitted < 300 {
		t.Fatalf("admitted %d < one burst", admitted)
	}
}

// TestCloseReturnsUnusedTokens: a lease's unused tokens go back on Close.
func TestCloseReturnsUnusedTokens(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	c, err := client.New(client.Config{Addrs: []string{e.addr}, SyncInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d := one("tenant", "acme")
	for range 30 {
		if dec := c.Allow(context.Background(), "api", d, 1); !dec.Allowed {
			t.Fatal(dec)
		}
	}
	eventually(t, "a lease", func() bool {
		c.Allow(context.Background(), "api", d, 0)
		return c.Stats().LocalDecided > 0
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// 1000/h refills about 0.3 per second: what is left is 1000 minus
	// what was spent.
	if got := e.remaining(t, d[0]); got < 1000-30-1 {
		t.Fatalf("remaining %d after Close, want ≈ 970", got)
	}
	if dec := c.Allow(context.Background(), "api", d, 1); !errors.Is(dec.Err, client.ErrClosed) {
		t.Fatalf("after Close: %+v", dec)
	}
}

// TestGatewayThatDisappears: a gateway dies holding a lease. Its tokens
// stay charged (they may have been spent) but it stops being counted
// after the lease TTL, and the others go on.
func TestGatewayThatDisappears(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	a := newClient(t, e.addr)
	b := newClient(t, e.addr)
	d := one("tenant", "t1")
	for range 50 {
		a.Allow(context.Background(), "api", d, 1)
		b.Allow(context.Background(), "api", d, 1)
	}
	eventually(t, "both counted", func() bool { return b.Gateways() == 2 })
	client.Crash(a)
	eventually(t, "the dead gateway forgotten after the lease TTL", func() bool { return b.Gateways() == 1 })
	if dec := b.Allow(context.Background(), "api", d, 1); !dec.Allowed {
		t.Fatalf("survivor rejected: %+v", dec)
	}
	if got := e.remaining(t, d[0]); got > 1000-100 {
		t.Fatalf("remaining %d: the dead gateway's spent tokens came back", got)
	}
}

// TestFailoverBetweenEnforcers: the first enforcer stops; decisions go on
// at the second without errors once the client has failed over.
func TestFailoverBetweenEnforcers(t *testing.T) {
	e1 := startEnforcer(t, sdkConfig, nil)
	e2 := startEnforcer(t, sdkConfig, nil)
	c := newClient(t, e1.addr, e2.addr)
	d := one("login", "x") // exact: every request reaches an enforcer
	if dec := c.Allow(context.Background(), "api", d, 1); !dec.Allowed || dec.Source != client.SourceEnforcer {
		t.Fatalf("%+v", dec)
	}
	e1.gs.Stop()
	eventually(t, "answers from the second enforcer", func() bool {
		dec := c.Allow(context.Background(), "api", d, 1)
		return dec.Err == nil && dec.Source == client.SourceEnforcer
	})
	if c.Stats().Failovers == 0 {
		t.Fatal("no failover counted")
	}
}

// TestOnFailurePolicies: with no enforcer answering, each limit's
// on_failure decides: open allows, closed rejects, local spends a bucket
// of the region's allowance ÷ gateways.
func TestOnFailurePolicies(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	c := newClient(t, e.addr)
	for _, k := range []string{"route", "plan", "tenant"} {
		d := one(k, "v")
		c.Allow(context.Background(), "api", d, 1)
		eventually(t, k+" leased", func() bool {
			c.Allow(context.Background(), "api", d, 0)
			return c.Allow(context.Background(), "api", d, 0).Source == client.SourceLease
		})
	}
	e.gs.Stop()
	// Spend the leases (and let them end) until the policies decide.
	decide := func(k string, hits int64) client.Decision {
		var dec client.Decision
		eventually(t, k+" in fallback", func() bool {
			dec = c.Allow(context.Background(), "api", one(k, "v"), hits)
			return dec.Source == client.SourceFallback
		})
		return dec
	}
	if dec := decide("route", 1); !dec.Allowed || !errors.Is(dec.Err, client.ErrUnavailable) {
		t.Fatalf("open: %+v", dec)
	}
	if dec := decide("plan", 1); dec.Allowed || dec.Limit != "closed" {
		t.Fatalf("closed: %+v", dec)
	}
	// local: 1000/h over one gateway; a request above it is refused.
	if dec := decide("tenant", 1); !dec.Allowed {
		t.Fatalf("local: %+v", dec)
	}
	if dec := c.Allow(context.Background(), "api", one("tenant", "v"), 1001); dec.Allowed || dec.Source != client.SourceFallback {
		t.Fatalf("local above the allowance: %+v", dec)
	}
}

// TestExactLimitsGoToTheEnforcer: concurrent requests on an exact limit
// are decided by the enforcer (batched) and admit exactly the limit.
func TestExactLimitsGoToTheEnforcer(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	c := newClient(t, e.addr)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			dec := c.Allow(context.Background(), "api", one("login", "bob"), 1)
			if dec.Err != nil || dec.Source != client.SourceEnforcer {
				t.Error(dec)
			}
			if dec.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 5 {
		t.Fatalf("admitted %d, want exactly 5", admitted.Load())
	}
	t.Logf("40 exact requests in %d Check calls", c.Stats().CheckRPCs)
}

func TestBadInput(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	c := newClient(t, e.addr)
	for name, tc := range map[string]struct {
		domain string
		ds     []allot.Descriptor
		hits   int64
	}{
		"empty domain":     {"", one("user", "a"), 1},
		"no descriptors":   {"api", nil, 1},
		"empty descriptor": {"api", []allot.Descriptor{{}}, 1},
		"negative hits":    {"api", one("user", "a"), -1},
		"huge hits":        {"api", one("user", "a"), allot.MaxAmount + 1},
		"unknown domain":   {"nope", one("user", "a"), 1},
	} {
		dec := c.Allow(context.Background(), tc.domain, tc.ds, tc.hits)
		if dec.Allowed || !errors.Is(dec.Err, client.ErrBadRequest) {
			t.Errorf("%s: %+v", name, dec)
		}
	}
	if got := e.remaining(t, allot.Descriptor{{Key: "user", Value: "a"}}); got != 400 {
		t.Fatalf("bad input charged: remaining %d", got)
	}
	if n := c.Stats().Keys; n != 0 {
		t.Fatalf("%d request shapes remembered from bad input", n)
	}
	if _, err := client.New(client.Config{}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("New without addresses: %v", err)
	}
}

// TestReservations go to the enforcer that made them.
func TestReservations(t *testing.T) {
	e := startEnforcer(t, sdkConfig, nil)
	c := newClient(t, e.addr)
	ctx := context.Background()
	r, err := c.Reserve(ctx, &allotv1.ReserveRequest{Domain: "api", Descriptors: []*allotv1.Descriptor{{Entries: []*allotv1.Entry{{Key: "org", Value: "o"}}}}, PromptTokens: 100, MaxTokens: 1000})
	if err != nil || !r.Allowed {
		t.Fatalf("%v %v", r, err)
	}
	s, err := c.Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 100, OutputTokens: 20})
	if err != nil || s.Settlement.SettledTokens != 120 {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := c.Settle(ctx, &allotv1.SettleRequest{ReservationId: "nope"}); !errors.Is(err, client.ErrUnknownReservation) {
		t.Fatalf("unknown reservation: %v", err)
	}
}
