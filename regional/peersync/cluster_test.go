package peersync_test

import (
	"context"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// node is one region: an engine, its Syncer and gRPC server, and the
// traffic it is sent.
type node struct {
	name   string
	engine *regional.Engine
	syncer *peersync.Syncer
	reg    *prometheus.Registry

	mu       sync.Mutex
	admitted map[uint64]int64 // by window
	rate     int              // requests per millisecond
}

// cluster is regions over real gRPC on loopback, each direction between
// two regions through a toxiproxy proxy of its own, so that a test can
// cut a region off.
type cluster struct {
	t       *testing.T
	nodes   []*node
	proxies map[[2]string]*toxiproxy.Proxy // (from, to)
	period  time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startCluster(t *testing.T, cfgText string, names []string, shares []float64) *cluster {
	t.Helper()
	cfg, err := allot.ParseConfig("peers.yaml", []byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, proxies: map[[2]string]*toxiproxy.Proxy{}, period: cfg.Domains[0].Limits[0].Rate.Period, stop: make(chan struct{})}
	listeners := map[string]net.Listener{}
	for _, n := range names {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[n] = l
	}
	tox := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			p := toxiproxy.NewProxy(tox, from+">"+to, "127.0.0.1:0", listeners[to].Addr().String())
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Stop)
			c.proxies[[2]string{from, to}] = p
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	for i, n := range names {
		e := regional.New(cfg, regional.Options{})
		for _, l := range cfg.Domains[0].Limits {
			if err := e.SetShare(time.Now(), cfg.Domains[0].Name, l.Name, shares[i]); err != nil {
				t.Fatal(err)
			}
		}
		peers := map[string]string{}
		for _, p := range names {
			if p != n {
				peers[p] = c.proxies[[2]string{n, p}].Listen
			}
		}
		reg := prometheus.NewRegistry()
		s, err := peersync.New(peersync.Options{Region: n, Instance: n + "-1", Engine: e, Peers: peers, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		s.Register(gs)
		go gs.Serve(listeners[n])
		runs.Go(func() { s.Run(ctx) })
		t.Cleanup(gs.Stop)
		c.nodes = append(c.nodes, &node{name: n, engine: e, syncer: s, reg: reg, admitted: map[uint64]int64{}})
	}
	t.Cleanup(func() {
		close(c.stop)
		c.wg.Wait()
		cancel()
		runs.Wait()
		for _, n := range c.nodes {
			n.syncer.Close()
		}
	})
	return c
}

// traffic sends each node n.rate requests (cost 1) per millisecond for
// user 1, and counts what is admitted per window.
func (c *cluster) traffic() {
	for _, n := range c.nodes {
		c.wg.Go(func() {
			var dec allot.Decision
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-c.stop:
					return
				case <-tick.C:
				}
				n.mu.Lock()
				rate := n.rate
				n.mu.Unlock()
				for range rate {
					now := time.Now()
					if err := n.engine.Check(now, "api", allot.Descriptor{{Key: "user", Value: "1"}}, 1, &dec); err != nil {
						c.t.Error(err)
						return
					}
					if dec.Allowed {
						n.mu.Lock()
						n.admitted[uint64(now.UnixNano()/int64(c.period))]++
						n.mu.Unlock()
					}
				}
			}
		})
	}
}

func (n *node) setRate(r int) {
	n.mu.Lock()
	n.rate = r
	n.mu.Unlock()
}

func (c *cluster) window(t time.Time) uint64 { return uint64(t.UnixNano() / int64(c.period)) }

// totals returns the global admitted count of every complete window in
// [from, to).
func (c *cluster) totals(from, to time.Time) []int64 {
	var out []int64
	for w := c.window(from) + 1; w < c.window(to); w++ {
		sum := int64(0)
		for _, n := range c.nodes {
			n.mu.Lock()
			sum += n.admitted[w]
			n.mu.Unlock()
		}
		out = append(out, sum)
	}
	return out
}

func (c *cluster) admittedBy(n *node, from, to time.Time) []int64 {
	var out []int64
	for w := c.window(from) + 1; w < c.window(to); w++ {
		n.mu.Lock()
		out = append(out, n.admitted[w])
		n.mu.Unlock()
	}
	return out
}

// waitWindows sleeps until k complete windows have passed since now:
// the traffic runs on the wall clock, so the test waits with it.
func (c *cluster) waitWindows(k int) (from, to time.Time) {
	from = time.Now()
	for c.window(time.Now()) < c.window(from)+uint64(k)+1 {
		time.Sleep(10 * time.Millisecond)
	}
	return from, time.Now()
}

// cut stops (or restarts) every proxy to and from region name.
func (c *cluster) cut(name string, off bool) {
	for k, p := range c.proxies {
		if k[0] != name && k[1] != name {
			continue
		}
		if off {
			p.Stop()
		} else if err := p.Start(); err != nil {
			c.t.Fatal(err)
		}
	}
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func stats(n *node) regional.SyncStats { return n.engine.SyncStats()[0] }

const sharedYAML = `
domain: api
regions: [a, b, c]
limits:
  - {name: global, match: {user: "*"}, rate: 400/400ms, mode: shared, algorithm: sliding_window, sync_interval: 50ms}
`

var abc = []string{"a", "b", "c"}
var thirds = []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}

// TestSharedOverGRPC: three regions as separate servers on loopback,
// through toxiproxy. In steady state the global total stays within the
// overshoot bound; when the traffic moves between regions it follows;
// a cut-off region makes every region fall back, and the total stays
// within L + rate × stale_after × (regions − 1); after healing the
// regions leave the fallback and their views of every slot converge.
func TestSharedOverGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three regions for seconds")
	}
	c := startCluster(t, sharedYAML, abc, thirds)
	for _, n := range c.nodes {
		n.setRate(1) // 1000/s each: 3 × L (1000/s)
	}
	waitFor(t, 5*time.Second, "every region hears its peers", func() bool {
		for _, n := range c.nodes {
			if n.engine.SyncStats()[0].Fallback || len(n.engine.LastHeard("api", "global")) != 2 {
				return false
			}
			for _, at := range n.engine.LastHeard("api", "global") {
				if at.IsZero() {
					return false
				}
			}
		}
		return true
	})
	c.traffic()
	c.waitWindows(1) // warm-up: the previous window is full
	from, to := c.waitWindows(3)
	st := stats(c.nodes[0])
	bound := st.OvershootBound(10 * time.Millisecond)
	tot := c.totals(from, to)
	t.Logf("steady state: windows %v (L = 400, overshoot bound %.0f)", tot, bound)
	for _, n := range tot {
		if float64(n) > 400+bound {
			t.Fatalf("steady state: a window admitted %d, bound %.0f", n, 400+bound)
		}
		if n < 360 {
			t.Errorf("steady state: a window admitted only %d of 400", n)
		}
	}

	// The traffic moves to b.
	c.nodes[0].setRate(0)
	c.nodes[2].setRate(0)
	c.nodes[1].setRate(2)
	c.waitWindows(1)
	from, to = c.waitWindows(2)
	moved := c.admittedBy(c.nodes[1], from, to)
	t.Logf("after the traffic moved to b: b admitted %v per window", moved)
	for _, n := range moved {
		if n < 360 || float64(n) > 400+bound {
			t.Errorf("b admitted %d in a window after the move", n)
		}
	}
	for _, n := range c.nodes {
		n.setRate(1)
	}
	c.waitWindows(1)

	// c is cut off.
	cutAt := time.Now()
	c.cut("c", true)
	took := waitFor(t, 3*time.Second, "every region falls back", func() bool {
		for _, n := range c.nodes {
			if !stats(n).Fallback {
				return false
			}
		}
		return true
	})
	t.Logf("regions fell back %v after the cut (stale_after %v)", took, st.StaleAfter)
	_, to = c.waitWindows(2)
	tot = c.totals(cutAt.Add(-c.period), to) // from the window of the cut
	limit := 400 + st.PartitionBound()
	t.Logf("partitioned: windows %v (bound %.0f)", tot, limit)
	for _, n := range tot {
		if float64(n) > limit {
			t.Fatalf("partitioned: a window admitted %d, bound %.0f", n, limit)
		}
	}

	// Healed: the regions leave the fallback and converge.
	for _, n := range c.nodes {
		n.setRate(0)
	}
	healed := time.Now()
	c.cut("c", false)
	waitFor(t, 5*time.Second, "every region leaves the fallback", func() bool {
		for _, n := range c.nodes {
			if stats(n).Fallback {
				return false
			}
		}
		return true
	})
	recovered := time.Since(healed)
	w, _ := c.nodes[0].engine.Window("api", "global", time.Now())
	converged := waitFor(t, 5*time.Second, "the views converge", func() bool {
		var first map[string]uint64
		for _, n := range c.nodes {
			for _, win := range []uint64{w - 1, w} {
				v, err := n.engine.SharedView("api", "global", "global:user=1", win)
				if err != nil {
					t.Fatal(err)
				}
				if win == w && first == nil {
					first = v
				} else if win == w && !maps.Equal(first, v) {
					return false
				}
			}
		}
		return true
	})
	t.Logf("after healing: fallback ended in %v, views equal %v later (%v after the heal)", recovered, converged, time.Since(healed))
}

const splitYAML = `
domain: api
regions: [a, b, c]
limits:
  - {name: global, match: {user: "*"}, rate: 360/400ms, algorithm: sliding_window, sync_interval: 50ms}
`

// TestBorrowingOverGRPC: split mode, a third of 360 per 400ms each. The traffic
// is in a alone: while a is cut off it admits its share; once healed it
// borrows the unused allowance of b and c and admits more; when the
// traffic moves to b, b borrows. No window ever exceeds L.
func TestBorrowingOverGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three regions for seconds")
	}
	start := time.Now()
	c := startCluster(t, splitYAML, abc, thirds)
	c.cut("a", true)
	c.nodes[0].setRate(2)
	c.traffic()
	waitFor(t, 3*time.Second, "a hears no peer", func() bool {
		for _, at := range c.nodes[0].engine.LastHeard("api", "global") {
			if !at.IsZero() && time.Since(at) < 150*time.Millisecond {
				return false
			}
		}
		return true
	})
	asked := stats(c.nodes[0]).LoansAsked // before a knew it was cut off
	from, to := c.waitWindows(2)
	alone := c.admittedBy(c.nodes[0], from, to)
	if n := stats(c.nodes[0]).LoansAsked - asked; n != 0 {
		t.Errorf("a asked %d loans while cut off", n)
	}
	c.cut("a", false)
	c.waitWindows(1)
	from, to = c.waitWindows(2)
	borrowing := c.admittedBy(c.nodes[0], from, to)
	st := stats(c.nodes[0])
	t.Logf("a admitted %v per window alone, %v borrowing (asked %d, granted %d, refused %d, borrowed %d)",
		alone, borrowing, st.LoansAsked, st.LoansGranted, st.LoansRefused, st.Borrowed)
	for i := range alone {
		if alone[i] > 120 {
			t.Errorf("a admitted %d alone, above its share 120", alone[i])
		}
		if borrowing[i] < 180 {
			t.Errorf("a admitted only %d with borrowing", borrowing[i])
		}
	}

	c.nodes[0].setRate(0)
	c.nodes[1].setRate(2)
	c.waitWindows(1)
	from, to = c.waitWindows(2)
	moved := c.admittedBy(c.nodes[1], from, to)
	t.Logf("after the traffic moved to b: b admitted %v per window", moved)
	for _, n := range moved {
		if n < 180 {
			t.Errorf("b admitted only %d with borrowing", n)
		}
	}
	for _, n := range c.totals(start, time.Now()) {
		if n > 360 {
			t.Fatalf("split mode: a window admitted %d > L = 360", n)
		}
	}
}
