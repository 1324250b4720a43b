package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/deploy/local"
)

// Options configure a chaos run.
type Options struct {
	// Bin is the allot binary; Config the limits file (testdata/limits.yaml
	// is what the flows below expect).
	Bin, Config string
	// Dir receives the cluster (logs/, cluster.json), the decision log
	// (decisions.jsonl), the chaos events (events.jsonl) and the report.
	Dir string
	// Duration of the load (default 60s); the chaos schedule plays in
	// cycles of about CyclePeriod within it.
	Duration time.Duration
	// Scale multiplies the rates of DefaultFlows (default 1: about 700
	// requests per second over all regions).
	Scale float64
	// Deadline of every request (default 1s: 10 × the store timeout, and
	// 4 × the enforcers' timeout of background store calls, which Settle
	// and Release make; slack for a loaded 2-core CI machine running the
	// client under the race detector) and the enforcers' --store-timeout
	// (default 100ms; 25ms and then 40ms calls to a healthy Redis timed
	// out often enough on a loaded 2-core CI machine to keep the breaker
	// flapping for more than 30 s after a Redis restart: 2 runs of 2 with
	// 40ms, while the rest of the suite ran beside it). A request that waits on anything unbounded (a peer,
	// a coordinator, a dead Redis) misses it; the summary gives the
	// latency percentiles.
	Deadline, StoreTimeout time.Duration
	// Progress receives a line per step; nil discards.
	Progress io.Writer
	Seed     uint64
	// Instances per region (default 2).
	Instances int
	// LogLevel of the enforcers and coordinators (default info).
	LogLevel string
	// Insecure runs the cluster in plain text on loopback instead of
	// mutual TLS on every link (local.Options.Insecure).
	Insecure bool
}

// DefaultFlows is the traffic of a run, for testdata/limits.yaml: each
// key is offered more than its limit, so that every limit binds.
var DefaultFlows = []Flow{
	{Domain: "api", Limit: "split-exact", DescKey: "user", Prefix: "u", Keys: 3, Rate: 180},    // 60/s per key, L 40
	{Domain: "api", Limit: "split-leased", DescKey: "tenant", Prefix: "t", Keys: 2, Rate: 260}, // 130/s per key, L 100
	{Domain: "api", Limit: "split-local", DescKey: "session", Prefix: "s", Keys: 1, Rate: 80},  // 80/s per key, L 50
	{Domain: "api", Limit: "shared", DescKey: "app", Prefix: "a", Keys: 3, Rate: 240},          // 80/s per key, L 60
	{Domain: "llm", Limit: "tokens", DescKey: "org", Prefix: "o", Keys: 2, Rate: 24, Reserve: true},
}

// DefaultWeights is how the traffic splits among the regions.
var DefaultWeights = map[string]float64{"us-east": 0.5, "eu-west": 0.3, "ap-south": 0.2}

// Result is a run's report and where its files are.
type Result struct {
	Report    *Report
	Decisions string // the decision log
	Events    string
	Dir       string
}

// run is one chaos run's state.
type run struct {
	o       Options
	c       *local.Cluster
	tox     *toxiproxy.ApiServer
	proxies map[[2]string]*toxiproxy.Proxy // (from process or region, to process)
	load    *Load
	events  *Log
	scrapes []Scrape
	http    *http.Client // scrapes /metrics
	start   time.Time
	log     func(format string, args ...any)
}

// Run starts a local cluster with toxiproxy proxies on its links, puts
// load on it while the chaos schedule runs, stops everything and checks
// the decision log. The schedule is played in cycles of about
// CyclePeriod; in each, at fractions of the cycle:
//
//	0.10  kill the leader of domain api (SIGKILL); time until etcd names
//	      another; restart the killed coordinator as a standby
//	0.25  partition a region (ap-south first): cut its peer links, both
//	      ways, and its links to the coordinators (not to etcd)
//	0.28  cut one instance (us-east-1 first) from the coordinators while
//	      its region's other instance stays connected, for the grant TTL
//	      (4 s) + 2 s: its grant expires, then it reconnects
//	0.42  heal the partition; time until every instance has its peers linked and no
//	      shared-mode limit in fallback
//	0.52  kill a region's Redis (SIGKILL; eu-west first)
//	0.62  restart it; time until no limit of the region is in fallback
//	0.70  slow a region's Redis (each reply 2 × the store timeout late:
//	      every call on the request path times out; ap-south first)
//	0.76  remove the latency
//	0.82  restart an enforcer instance (us-east-2 first): drained (no new
//	      requests, the ones in flight answered, its reservations ended),
//	      scraped, stopped with SIGTERM, started and put back in service
//
// Each cycle moves every target to the next region or instance. An error
// means the run could not be carried out; broken rules are in the Report.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Duration <= 0 {
		o.Duration = time.Minute
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.Deadline <= 0 {
		o.Deadline = time.Second
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = 100 * time.Millisecond
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	cfg, err := allot.LoadConfigFile(o.Config)
	if err != nil {
		return nil, err
	}
	r := &run{o: o, proxies: map[[2]string]*toxiproxy.Proxy{}, start: time.Now()}
	var logMu sync.Mutex
	r.log = func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(o.Progress, "chaos %6.1fs: %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
	}
	res := &Result{Dir: o.Dir, Decisions: filepath.Join(o.Dir, "decisions.jsonl"), Events: filepath.Join(o.Dir, "events.jsonl")}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	decisions, err := CreateLog(res.Decisions)
	if err != nil {
		return nil, err
	}
	if r.events, err = CreateLog(res.Events); err != nil {
		decisions.Close()
		return nil, err
	}

	r.c, err = local.New(local.Options{
		Dir: filepath.Join(o.Dir, "cluster"), Bin: o.Bin, Config: o.Config, Instances: o.Instances, Insecure: o.Insecure,
		RegionalArgs: []string{"--store-timeout", o.StoreTimeout.String(), "--log-level", o.LogLevel},
		// A grant TTL of 4 s, so that an instance cut off from the
		// coordinators for a step outlives its grant.
		CoordinatorArgs: []string{"--rebalance-period", "1s", "--grant-ttl", grantTTL.String(), "--log-level", o.LogLevel},
		Dial:            r.dial,
	})
	if err == nil {
		r.tox = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		err = r.startProxies()
	}
	defer func() {
		for _, p := range r.proxies {
			p.Stop()
		}
	}()
	if err == nil {
		r.log("starting %d processes and %d proxies in %s", len(r.c.Procs), len(r.proxies), r.c.Opts.Dir)
		err = r.c.Start(ctx)
	}
	if r.c != nil {
		defer r.c.StopAll(10 * time.Second)
	}
	var clientTLS *tls.Config
	if err == nil {
		// Every link runs mutual TLS (the cluster's default, its CA made
		// by Start; unless Insecure); the load and the scrapes present the
		// operator's certificate and verify the processes against the CA.
		clientTLS, err = r.c.ClientTLS()
		r.http = &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	}
	if err == nil {
		err = r.settle(ctx)
	}
	if err == nil {
		var targets []Target
		for _, p := range r.c.ByRole(local.Regional, "") {
			targets = append(targets, Target{Name: p.Name, Region: p.Region, Addr: p.Addr})
		}
		r.load, err = NewLoad(LoadOptions{Flows: scaled(DefaultFlows, o.Scale), Weights: DefaultWeights, Deadline: o.Deadline,
			ReserveTTL: 2 * time.Second, Log: decisions, Seed: o.Seed, TLS: clientTLS}, targets)
	}
	if err == nil {
		err = r.chaos(ctx)
	}
	if r.load != nil {
		r.log("load stopped; %d requests not sent (no instance in service, or too many in flight)", r.load.Dropped.Load())
	}
	if cerr := decisions.Close(); err == nil {
		err = cerr
	}
	if cerr := r.events.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, err
	}

	recs, err := ReadFile[Record](res.Decisions)
	if err != nil {
		return res, err
	}
	events, err := ReadFile[Event](res.Events)
	if err != nil {
		return res, err
	}
	exported := map[string]float64{}
	for _, sc := range r.scrapes {
		for _, s := range sc.Samples {
			if s.Name == "allot_peer_overshoot_bound" {
				k := s.Labels["domain"] + "/" + s.Labels["limit"]
				exported[k] = max(exported[k], s.Value)
			}
		}
	}
	res.Report = Check(Input{Limits: Specs(cfg, exported), Records: recs, Scrapes: r.scrapes, Events: events})
	out := res.Report.Table() + "\n" + strings.Join(res.Report.Violations, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(o.Dir, "report.md"), []byte(out), 0o644); err != nil {
		return res, err
	}
	return res, nil
}

func scaled(flows []Flow, k float64) []Flow {
	out := slices.Clone(flows)
	for i := range out {
		out[i].Rate *= k
	}
	return out
}

// grantTTL is the coordinators' --grant-ttl in a chaos run.
const grantTTL = 4 * time.Second

// startProxies puts a toxiproxy proxy on every link chaos cuts or slows:
// each enforcer instance to its peer instance in every other region and
// to each coordinator, and each region to its Redis.
func (r *run) startProxies() error {
	add := func(from string, to *local.Proc) error {
		p := toxiproxy.NewProxy(r.tox, from+">"+to.Name, "127.0.0.1:0", to.Addr)
		if err := p.Start(); err != nil {
			return fmt.Errorf("chaos: proxy %s: %w", p.Name, err)
		}
		r.proxies[[2]string{from, to.Name}] = p
		return nil
	}
	o := r.c.Opts
	for _, p := range r.c.ByRole(local.Regional, "") {
		for _, region := range o.Regions {
			if region == p.Region {
				continue
			}
			// the peer instance local.Cluster links p to
			peer := r.c.Proc(fmt.Sprintf("%s-%d", region, (p.Index-1)%o.Instances+1))
			if err := add(p.Name, peer); err != nil {
				return err
			}
		}
		for _, coord := range r.c.ByRole(local.Coordinator, "") {
			if err := add(p.Name, coord); err != nil {
				return err
			}
		}
	}
	for _, region := range o.Regions {
		if err := add(region, r.c.Proc("redis-"+region)); err != nil {
			return err
		}
	}
	return nil
}

// partitionProxies are the proxies of region's links to its peers (both
// ways) and to the coordinators.
func (r *run) partitionProxies(region string) []*toxiproxy.Proxy {
	var out []*toxiproxy.Proxy
	for k, p := range r.proxies {
		fromRegion, to := k[0], r.c.Proc(k[1])
		if from := r.c.Proc(k[0]); from != nil {
			fromRegion = from.Region
		}
		switch {
		case to.Role == local.Regional && (fromRegion == region || to.Region == region):
			out = append(out, p)
		case to.Role == local.Coordinator && fromRegion == region:
			out = append(out, p)
		}
	}
	return out
}

// settle waits until the cluster is steady: every instance linked to its
// peers and out of fallback.
func (r *run) settle(ctx context.Context) error {
	start := time.Now()
	err := r.poll(ctx, time.Minute, func() error { return r.linked(ctx, r.c.ByRole(local.Regional, "")) })
	if err != nil {
		return fmt.Errorf("chaos: the cluster did not settle: %w", err)
	}
	r.log("cluster steady in %v", time.Since(start).Round(time.Millisecond))
	return nil
}

// linked checks that every instance of ps has every peer connected and no
// shared-mode limit in fallback.
func (r *run) linked(ctx context.Context, ps []*local.Proc) error {
	for _, p := range ps {
		ss, err := r.metrics(ctx, p)
		if err != nil {
			return err
		}
		if n := Sum(ss, "allot_peer_connected", nil); int(n) != len(r.c.Opts.Regions)-1 {
			return fmt.Errorf("%s: %v of %d peers connected", p.Name, n, len(r.c.Opts.Regions)-1)
		}
		if n := Sum(ss, "allot_peer_fallback_active", nil); n != 0 {
			return fmt.Errorf("%s: %v shared-mode limits in fallback", p.Name, n)
		}
	}
	return nil
}

// poll calls ok every 50ms until it returns nil, or fails when within
// passes.
func (r *run) poll(ctx context.Context, within time.Duration, ok func() error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		err := ok()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", within, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *run) event(e Event) {
	if e.At == 0 {
		e.At = time.Now().UnixNano()
	}
	r.events.Write(&e)
	msg := e.Name
	if e.Target != "" {
		msg += " " + e.Target
	}
	if e.Took > 0 {
		msg += fmt.Sprintf(" (%v)", e.Took.Round(time.Millisecond))
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	r.log("%s", msg)
}

// recoverWithin bounds the wait for each recovery the schedule times.
const recoverWithin = 30 * time.Second

// peerState describes the peer links of ps, from their metrics: for an
// event that did not recover.
func (r *run) peerState(ctx context.Context, ps []*local.Proc) string {
	var out []string
	for _, p := range ps {
		ss, err := r.metrics(ctx, p)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", p.Name, err))
			continue
		}
		var parts []string
		for _, s := range ss {
			switch s.Name {
			case "allot_peer_connected", "allot_peer_sync_lag_seconds", "allot_peer_dropped_messages_total", "allot_peer_resyncs_total":
				parts = append(parts, fmt.Sprintf("%s%v=%g", strings.TrimPrefix(s.Name, "allot_peer_"), labels(s.Labels), s.Value))
			case "allot_peer_fallback_active", "allot_peer_sequence_gaps_total", "allot_peer_stale_fallbacks_total":
				parts = append(parts, fmt.Sprintf("%s{%s}=%g", strings.TrimPrefix(s.Name, "allot_peer_"), s.Labels["limit"], s.Value))
			}
		}
		out = append(out, p.Name+": "+strings.Join(parts, " "))
	}
	return strings.Join(out, "; ")
}

func labels(m map[string]string) string {
	var kv []string
	for _, k := range []string{"peer", "direction"} {
		if v, ok := m[k]; ok {
			kv = append(kv, v)
		}
	}
	return "{" + strings.Join(kv, ",") + "}"
}

// CyclePeriod is about how long one cycle of the schedule lasts: a run
// of Duration D plays round(D / CyclePeriod) cycles (at least one).
const CyclePeriod = 60 * time.Second

// chaos runs the load and the schedule, cycle after cycle, then stops
// the load and scrapes every instance.
func (r *run) chaos(ctx context.Context) error {
	d := r.o.Duration
	begin := time.Now()
	r.load.Start()
	defer r.load.Close()
	defer r.load.Abort() // on an error: no request after the cluster stops
	cycles := max(1, int((d+CyclePeriod/2)/CyclePeriod))
	r.event(Event{Name: "load_started", Detail: fmt.Sprintf("%v at scale %v, deadline %v, %d chaos cycles", d, r.o.Scale, r.o.Deadline, cycles)})
	store, closeStore, err := r.c.Store()
	if err != nil {
		return err
	}
	defer closeStore()
	per := d / time.Duration(cycles)
	for i := range cycles {
		if err := r.cycle(ctx, store, i, begin.Add(time.Duration(i)*per), per); err != nil {
			return err
		}
	}
	if err := r.until(ctx, begin.Add(d)); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.load.Stop(sctx); err != nil {
		return err
	}
	r.event(Event{Name: "load_stopped"})
	for _, p := range r.c.ByRole(local.Regional, "") {
		if err := r.scrape(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// cycle plays the schedule once from begin over d. Cycle i turns the
// targets: the first partitions ap-south, kills eu-west's Redis, slows
// ap-south's and restarts us-east's last instance; the next ones take
// the next regions and instances.
func (r *run) cycle(ctx context.Context, store *etcdstore.Store, i int, begin time.Time, d time.Duration) error {
	regions := r.c.Opts.Regions
	at := func(k int) string { return regions[(k+i)%len(regions)] }
	cutRegion, redisRegion, slowRegion := at(len(regions)-1), at(1), at(len(regions)-1)
	instances := r.c.ByRole(local.Regional, "")
	n := r.c.Opts.Instances
	restart := r.c.Proc(fmt.Sprintf("%s-%d", regions[i%len(regions)], ((n-1-i/len(regions))%n+n)%n+1))
	var cut, alone []*toxiproxy.Proxy
	// One instance of a region is cut off from the coordinators while the
	// other stays connected, for longer than its grant lasts.
	lone := r.c.Proc(fmt.Sprintf("%s-%d", at(0), i%n+1))
	slow := r.proxies[[2]string{slowRegion, "redis-" + slowRegion}]
	steps := []struct {
		at   float64
		name string
		do   func() error
	}{
		{0.10, "kill the leader", func() error { return r.killLeader(ctx, store) }},
		{0.25, "partition " + cutRegion, func() error {
			cut = r.partitionProxies(cutRegion)
			for _, p := range cut {
				p.Stop()
			}
			r.event(Event{Name: "partitioned", Target: cutRegion, Detail: fmt.Sprintf("%d links cut (peers both ways, coordinators)", len(cut))})
			return nil
		}},
		{0.28, "cut " + lone.Name + " from the coordinators", func() error {
			for _, coord := range r.c.ByRole(local.Coordinator, "") {
				if p := r.proxies[[2]string{lone.Name, coord.Name}]; p != nil {
					alone = append(alone, p)
					p.Stop()
				}
			}
			r.event(Event{Name: "instance_cut", Target: lone.Name, Detail: "from the coordinators; its region's other instances stay connected"})
			return nil
		}},
		{0.28 + float64(grantTTL+2*time.Second)/float64(d), "reconnect " + lone.Name, func() error {
			for _, p := range alone {
				if err := p.Start(); err != nil {
					return err
				}
			}
			r.event(Event{Name: "instance_reconnected", Target: lone.Name})
			return nil
		}},
		{0.42, "heal " + cutRegion, func() error {
			t0 := time.Now()
			for _, p := range cut {
				if err := p.Start(); err != nil {
					return err
				}
			}
			err := r.poll(ctx, recoverWithin, func() error { return r.linked(ctx, instances) })
			e := Event{Name: EventPartitionHeal, Target: cutRegion, Took: time.Since(t0)}
			if err != nil {
				e.Failed = err.Error() + "; " + r.peerState(ctx, instances)
			}
			r.event(e)
			return ctx.Err()
		}},
		{0.52, "kill " + redisRegion + "'s Redis", func() error {
			r.c.Kill(r.c.Proc("redis-" + redisRegion))
			r.event(Event{Name: "redis_killed", Target: "redis-" + redisRegion})
			return nil
		}},
		{0.62, "restart " + redisRegion + "'s Redis", func() error { return r.restartRedis(ctx, redisRegion) }},
		{0.70, "slow " + slowRegion + "'s Redis", func() error {
			lat := 2 * r.o.StoreTimeout / time.Millisecond
			_, err := slow.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(`{"name": "slow", "type": "latency", "attributes": {"latency": %d}}`, lat)))
			r.event(Event{Name: "redis_slow", Target: "redis-" + slowRegion, Detail: fmt.Sprintf("+%dms on each reply", lat)})
			return err
		}},
		{0.76, slowRegion + "'s Redis back to speed", func() error {
			err := slow.Toxics.RemoveToxic(ctx, "slow")
			r.event(Event{Name: "redis_fast", Target: "redis-" + slowRegion})
			return err
		}},
		{0.82, "restart " + restart.Name, func() error { return r.restartInstance(ctx, restart) }},
	}
	for _, s := range steps {
		if err := r.until(ctx, begin.Add(time.Duration(s.at*float64(d)))); err != nil {
			return err
		}
		if err := s.do(); err != nil {
			return fmt.Errorf("cycle %d: %s: %w", i+1, s.name, err)
		}
	}
	return nil
}

// killLeader kills the leader of domain api (SIGKILL), times until etcd
// names another, and restarts the killed one as a standby.
func (r *run) killLeader(ctx context.Context, store *etcdstore.Store) error {
	leader, err := r.c.Leader(ctx, store, "api")
	if err != nil || leader == nil {
		return fmt.Errorf("chaos: no leader of api to kill (%v)", err)
	}
	r.c.Kill(leader)
	t0 := time.Now()
	var next *local.Proc
	err = r.poll(ctx, recoverWithin, func() error {
		p, err := r.c.Leader(ctx, store, "api")
		if err != nil {
			return err
		}
		if p == nil || p == leader {
			return errors.New("no other leader yet")
		}
		next = p
		return nil
	})
	e := Event{Name: EventLeaderKilled, Target: leader.Name, Took: time.Since(t0)}
	if err != nil {
		e.Failed = err.Error()
	} else {
		e.Detail = "new leader " + next.Name
	}
	r.event(e)
	if err := r.c.Restart(ctx, leader); err != nil {
		return err
	}
	r.event(Event{Name: "coordinator_restarted", Target: leader.Name})
	return nil
}

// restartRedis starts region's Redis again and times until no limit of
// the region's instances is in fallback.
func (r *run) restartRedis(ctx context.Context, region string) error {
	if err := r.c.Restart(ctx, r.c.Proc("redis-"+region)); err != nil {
		return err
	}
	t0 := time.Now()
	err := r.poll(ctx, recoverWithin, func() error {
		for _, q := range r.c.ByRole(local.Regional, region) {
			ss, err := r.metrics(ctx, q)
			if err != nil {
				return err
			}
			if n := Sum(ss, "allot_regional_fallback_active", nil); n != 0 {
				return fmt.Errorf("%s: %v limits in fallback", q.Name, n)
			}
		}
		return nil
	})
	e := Event{Name: EventFallbackLeft, Target: region, Took: time.Since(t0)}
	if err != nil {
		e.Failed = err.Error()
	}
	r.event(e)
	return ctx.Err()
}

// until waits for the schedule's instant t.
func (r *run) until(ctx context.Context, t time.Time) error {
	wait := time.Until(t)
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scrape keeps p's counters as the end of its current life.
func (r *run) scrape(ctx context.Context, p *local.Proc) error {
	ss, err := r.metrics(ctx, p)
	if err != nil {
		return fmt.Errorf("chaos: scrape %s: %w", p.Name, err)
	}
	r.scrapes = append(r.scrapes, Scrape{Instance: p.Name, Life: p.Life, Samples: ss})
	return nil
}

// restartInstance drains p, scrapes it, stops it with SIGTERM, starts it
// again and puts it back in service.
func (r *run) restartInstance(ctx context.Context, p *local.Proc) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.load.Drain(dctx, p.Name); err != nil {
		return err
	}
	if err := r.scrape(ctx, p); err != nil {
		return err
	}
	t0 := time.Now()
	graceful := r.c.Stop(p, 10*time.Second)
	stopped := time.Since(t0)
	if err := r.c.Restart(ctx, p); err != nil {
		return err
	}
	linked := r.poll(ctx, recoverWithin, func() error { return r.linked(ctx, []*local.Proc{p}) })
	if err := r.load.Resume(dctx, p.Name, p.Life); err != nil {
		return err
	}
	e := Event{Name: "instance_restarted", Target: p.Name, Took: time.Since(t0),
		Detail: fmt.Sprintf("stopped by SIGTERM in %v, now life %d", stopped.Round(time.Millisecond), p.Life)}
	switch {
	case !graceful:
		e.Failed = "did not stop within 10s of SIGTERM: killed"
	case linked != nil:
		e.Failed = "not linked to its peers after its restart: " + linked.Error() + "; " + r.peerState(ctx, []*local.Proc{p})
	}
	r.event(e)
	return ctx.Err()
}

// metrics scrapes p's /metrics, over TLS with the cluster's operator
// certificate unless the cluster is plain text.
func (r *run) metrics(ctx context.Context, p *local.Proc) ([]Sample, error) {
	return Fetch(ctx, r.http, r.c.Scheme()+"://"+p.HTTP+"/metrics")
}

// dial routes the links that chaos cuts through proxies.
func (r *run) dial(from, to *local.Proc) string {
	if from == nil {
		return ""
	}
	if p := r.proxies[[2]string{from.Name, to.Name}]; p != nil {
		return p.Listen
	}
	if p := r.proxies[[2]string{from.Region, to.Name}]; p != nil {
		return p.Listen
	}
	return ""
}
