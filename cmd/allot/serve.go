package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/httpx"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/configwatch"
	"github.com/allot-dev/allot/regional/coordclient"
	"github.com/allot-dev/allot/regional/node"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/server"
)

// regionFlags are the flags of every command that serves a region.
type regionFlags struct {
	config       string
	region       string
	grpcAddr     string
	httpAddr     string
	advertise    string // gRPC address others reach this enforcer at
	advertiseWeb string // HTTP address others reach it at
	maxKeys      int
	logLevel     string
	coordinators string
	instance     string
	etcd         string
	reportEvery  time.Duration
	redis        string
	redisCluster bool
	storeTimeout time.Duration
	leaseTTL     time.Duration
	persistEvery time.Duration
	persistSlack float64
	tls          tlsFlags
	// anonymousRoles and grants decide callers' roles (--anonymous-roles,
	// --grant-roles; docs/security.md, "Roles").
	anonymousRoles string
	grants         []tlsx.Grant
}

// registerRoles adds --anonymous-roles, with anonymous as its default,
// and --grant-roles.
func (f *regionFlags) registerRoles(fs *flag.FlagSet, anonymous string) {
	fs.StringVar(&f.anonymousRoles, "anonymous-roles", anonymous, "roles of callers without an allot identity (plain text, TLS without a client certificate): comma-separated check, gateway, refund, viewer, operator, or none")
	fs.Func("grant-roles", "URI=ROLE[,ROLE...]: adds roles to the certificate identity URI, or to every identity under a prefix ending in /* (repeatable)", func(s string) error {
		g, err := tlsx.ParseGrant(s)
		if err != nil {
			return err
		}
		f.grants = append(f.grants, g)
		return nil
	})
}

// policy is the callers' roles the flags say.
func (f *regionFlags) policy() (*tlsx.Policy, error) {
	anon, err := tlsx.ParseRoles(f.anonymousRoles)
	if err != nil {
		return nil, fmt.Errorf("--anonymous-roles: %w", err)
	}
	return &tlsx.Policy{Anonymous: anon, Grants: f.grants}, nil
}

// httpTimeouts are the timeouts of every HTTP server the commands start
// (regional, coordinator, dev, demo); tests shorten them.
var httpTimeouts = httpx.Default

func (f *regionFlags) register(fs *flag.FlagSet, grpcAddr, httpAddr string) {
	fs.StringVar(&f.config, "config", "", "limits file (allot or Envoy ratelimit format); default: the built-in "+examples.LimitsName)
	fs.StringVar(&f.grpcAddr, "grpc-addr", grpcAddr, "gRPC listen address (allot.v1.RateLimiter and Envoy's RateLimitService)")
	fs.StringVar(&f.httpAddr, "http-addr", httpAddr, "HTTP listen address (/v1/check, /healthz, /readyz, /metrics)")
	fs.IntVar(&f.maxKeys, "max-keys", regional.DefaultMaxKeys, "bound of the key table")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.reportEvery, "report-interval", time.Second, "how often demand is reported to the coordinator")
}

func (f *regionFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})), nil
}

func runRegional(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot regional", "usage: allot regional --config FILE --region NAME [flags]\n\n"+
		"Serves one region's enforcer. SIGHUP reloads --config; SIGINT/SIGTERM stop gracefully.", stderr)
	var f regionFlags
	f.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	f.tls.register(fs)
	fs.StringVar(&f.region, "region", "", "name of the region this enforcer serves (required)")
	fs.StringVar(&f.coordinators, "coordinator", "", "coordinators' gRPC addresses, comma-separated; without it the region holds whole limits")
	fs.StringVar(&f.instance, "instance", "", "this enforcer's id at the coordinator, unique in its region (default: the host name and a random suffix, new at every start; an instance holds nothing until the coordinator grants it a part)")
	fs.StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated: the fleet's configuration (without --config) and registration for allotctl")
	fs.StringVar(&f.redis, "redis", "", "regional Redis for leased and exact limits: ADDR, or a Cluster's seed nodes ADDR,ADDR... with --redis-cluster; without it they are enforced in memory")
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "--redis names a Redis Cluster")
	fs.DurationVar(&f.storeTimeout, "store-timeout", regional.DefaultStoreTimeout, "deadline of each regional store call on the request path; past it, a limit's on_failure decides")
	fs.StringVar(&f.advertise, "advertise", "", "gRPC address other processes reach this enforcer at, registered in etcd for allotctl and peers (default: the gRPC listen address; set it when listening on 0.0.0.0 or behind NAT)")
	fs.StringVar(&f.advertiseWeb, "advertise-http", "", "HTTP address registered in etcd (default: the HTTP listen address)")
	fs.DurationVar(&f.persistEvery, "persist-interval", regional.DefaultPersistInterval, "with --redis and a stable instance id (the TLS certificate's, or --instance): how often the counts of split-mode local sliding windows longer than a minute are persisted, so that a restart mid-window restores them; 0 turns it off (a restarted instance then admits nothing of such a window until the next)")
	fs.Float64Var(&f.persistSlack, "persist-slack", regional.DefaultPersistSlack, "fraction of a key's allowance in the window that may be admitted beyond what is persisted (at least 1): lost at a restart")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", server.DefaultLeaseTTL, "how long a gateway (the Go SDK) may spend a Lease grant before its unused tokens come back; it also bounds how long a silent gateway is counted")
	// viewer: a plain-text fleet's coordinators read the region's Usage
	// and Status anonymously; over TLS, Admin needs a certificate anyway.
	f.registerRoles(fs, "check,viewer")
	f.tls.registerEtcd(fs)
	f.tls.registerRedis(fs)
	peerList := fs.String("peers", "", "the other regions and their enforcers' gRPC address, NAME=ADDR,...: shared-mode counters and loans (allot.v1.Peer)")
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	if f.region == "" {
		return errors.New("regional: --region is required")
	}
	if f.config == "" && f.etcd == "" {
		return errors.New("regional: --config or --etcd is required (allot dev runs the built-in example)")
	}
	if !(f.persistSlack > 0 && f.persistSlack <= 1) || f.persistEvery < 0 {
		return fmt.Errorf("regional: --persist-slack %v, --persist-interval %v: want a slack in (0, 1] and an interval ≥ 0", f.persistSlack, f.persistEvery)
	}
	peers, err := parsePeers(*peerList, f.region)
	if err != nil {
		return fmt.Errorf("regional: %w", err)
	}
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	authz, err := f.policy()
	if err != nil {
		return fmt.Errorf("regional: %w", err)
	}
	sec, err := f.regionLinks(log, peers)
	if err != nil {
		return err
	}
	var store *etcdstore.Store
	if f.etcd != "" {
		cli, err := etcdClient(f.etcd, sec.etcd, sec.etcdDial...)
		if err != nil {
			return err
		}
		defer cli.Close()
		store = etcdstore.New(cli, "")
	}
	// With --etcd and no --config, the region follows the fleet's
	// configuration in etcd (allotctl limits apply) and registers itself.
	var cfg *allot.Config
	if f.config == "" {
		cfg, err = configwatch.New(configwatch.Options{Store: store}).Load(ctx)
	} else {
		cfg, err = loadConfig(f.config)
	}
	if err != nil {
		return err
	}
	node, err := startRegion(ctx, regionSpec{
		name: f.region, cfg: cfg, grpcAddr: f.grpcAddr, httpAddr: f.httpAddr, advertise: f.advertise, advertiseHTTP: f.advertiseWeb, maxKeys: f.maxKeys,
		coordinators: splitList(f.coordinators), instance: f.instance, store: store, follow: f.config == "", reportEvery: f.reportEvery, log: log,
		redis: splitList(f.redis), redisCluster: f.redisCluster, storeTimeout: f.storeTimeout, leaseTTL: f.leaseTTL, peers: peers, sec: sec, authz: authz,
		persistEvery: f.persistEvery, persistSlack: f.persistSlack,
	})
	if err != nil {
		return err
	}
	printRegion(stdout, node, cfg)
	if f.config == "" {
		return serveUntilDone(ctx, log, nil, []*regionNode{node})
	}
	return serveUntilDone(ctx, log, func() error { return reloadFile(log, f.config, node) }, []*regionNode{node})
}

// reloadFile gives the nodes the configuration in path, unless it is bad.
func reloadFile(log *slog.Logger, path string, nodes ...*regionNode) error {
	next, err := loadConfig(path)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		n.setConfig(next)
	}
	log.Info("config reloaded", "source", next.Source, "domains", len(next.Domains))
	return nil
}

// regionSpec says how to start one region's enforcer.
type regionSpec struct {
	name               string
	cfg                *allot.Config
	grpcAddr, httpAddr string
	// advertise and advertiseHTTP are registered in etcd instead of the
	// listen addresses when set.
	advertise, advertiseHTTP string
	maxKeys                  int
	coordinators             []string
	instance                 string           // the instance's id at the coordinator; empty: made up at start
	store                    *etcdstore.Store // nil: no persisted assignment to start from
	follow                   bool             // follow the configuration in etcd (store) and register for allotctl
	reportEvery              time.Duration
	log                      *slog.Logger
	redis                    []string // the regional store; none: leased and exact limits in memory
	redisCluster             bool
	storeTimeout             time.Duration
	leaseTTL                 time.Duration
	peers                    map[string]string // other regions → gRPC address (peers.go)
	sec                      linkSecurity      // TLS of the listeners and links (tls.go)
	authz                    *tlsx.Policy      // callers' roles
	// persistEvery and persistSlack configure the persistence of long
	// windows (persist.go); 0: none.
	persistEvery time.Duration
	persistSlack float64
}

// regionNode is one region's running enforcer.
type regionNode struct {
	name string
	// ready, when coordinated, says whether the instance holds a grant
	// (/readyz); nil: always ready.
	ready func() error
	// leave, when coordinated, gives up what the instance holds at a
	// graceful stop (nil: nothing to give up).
	leave func()
	svc   *server.Service
	// setConfig gives the node a new configuration (and, when
	// coordinated, re-reads its assignments).
	setConfig func(*allot.Config)
	gs        *grpc.Server
	hs        *http.Server
	grpcAddr  string
	httpAddr  string
	sec       security // what its listeners speak
	errc      chan error
	stopLink  context.CancelFunc
	linkDone  chan struct{}
	stopRS    func() // gives leases back and closes the regional store
	// stopPeers ends the peers' streams this node serves, which would
	// hold a graceful stop until its timeout (set by startPeers).
	stopPeers func()
	// stopPersist persists the long windows a last time and stops, before
	// the instance gives its shares up (persist.go).
	stopPersist func()
}

// startRegion serves one region: it listens, applies the persisted or
// initial shares when coordinated, and starts serving and reporting.
func startRegion(ctx context.Context, spec regionSpec) (*regionNode, error) {
	// Components given the region (the server, the peer syncer, the
	// Enforcer) name it on their lines themselves; log is for the others.
	log := spec.log.With("region", spec.name)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engine := regional.New(spec.cfg, regional.Options{MaxKeys: spec.maxKeys})
	// The engine runs on the coordinator's time, as the instance's node
	// measures it (node.Node.Now): every call into it reads clock.
	var nodeOf atomic.Pointer[node.Node]
	clock := func() time.Time {
		if n := nodeOf.Load(); n != nil {
			return n.Now(time.Now())
		}
		return time.Now()
	}
	enforcer, stopRS, err := startRegionalStore(ctx, spec, engine, clock, reg, log, spec.log)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			stopRS()
		}
	}()
	// The instance's core, shared by its coordinator link and its peer
	// syncer; with peers and --redis, the region's instances share their
	// counts in the regional store.
	counts, closeCounts, err := peerCounts(spec, log)
	if err != nil {
		return nil, err
	}
	stopRS = func(stop func()) func() { return func() { stop(); closeCounts() } }(stopRS)
	instance, err := certInstance(spec.sec.src, spec.name, spec.instance)
	if err != nil {
		return nil, err
	}
	marks, closeMarks, err := persistMarks(spec, instance, log)
	if err != nil {
		return nil, err
	}
	stopRS = func(stop func()) func() { return func() { stop(); closeMarks() } }(stopRS)
	inode, err := node.New(node.Options{Region: spec.name, Instance: cmp.Or(instance, coordclient.NewInstanceID()), Engine: engine, Counts: counts,
		Marks: marks, Persist: regional.PersistOptions{Slack: spec.persistSlack, Interval: spec.persistEvery}})
	if err != nil {
		return nil, err
	}
	nodeOf.Store(inode)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "allot_regional_clock_offset_seconds",
		Help: "What the instance adds to its clock to read the coordinator's, as measured from its reports' echoes (0 before any)."},
		func() float64 { return inode.Now(time.Unix(0, 0)).Sub(time.Unix(0, 0)).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "allot_regional_clock_error_seconds",
			Help: "The most the instance's reading of the coordinator's clock may be off (half a round trip); -1 before any measurement."},
			func() float64 {
				if sk := inode.Skew(); sk >= 0 {
					return sk.Seconds()
				}
				return -1
			}))
	// Before the first grant and before serving: /readyz is false until
	// the counts of the windows in progress are restored.
	restorePersisted(ctx, inode, log)
	stopPersist := runPersist(inode, spec.persistEvery, log)
	stopRS = func(stop func()) func() { return func() { stopPersist(); stop() } }(stopRS)
	svc := server.New(engine, server.Options{Region: spec.name, Registry: reg, Logger: spec.log, Enforcer: enforcer, LeaseTTL: spec.leaseTTL, Authorization: spec.authz, Now: clock})
	rctx, stopReservations := context.WithCancel(context.Background())
	go svc.RunReservations(rctx, 0) // settles LLM token reservations past their TTL
	stopRS = func(stop func()) func() { return func() { stopReservations(); stop() } }(stopRS)

	n := &regionNode{name: spec.name, svc: svc, errc: make(chan error, 2), stopLink: func() {}, linkDone: make(chan struct{}), stopRS: stopRS, stopPeers: func() {},
		stopPersist: stopPersist}
	close(n.linkDone)
	// apply gives the region a new configuration; a coordinated region
	// also rebuilds its assignment state (set below).
	apply := svc.SetConfig
	var follower *configwatch.Follower
	if spec.follow {
		follower = configwatch.New(configwatch.Options{Store: spec.store, Apply: func(cfg *allot.Config) { apply(cfg) }, Logger: log})
	}
	var applied func(string) (int64, uint64)
	var ready func() error
	if len(spec.coordinators) > 0 {
		opts := coordclient.Options{Node: inode, Addrs: spec.coordinators, ReportEvery: spec.reportEvery, Logger: log, Registry: reg, Credentials: spec.sec.creds()}
		client, err := coordclient.New(opts)
		if err != nil {
			return nil, err
		}
		if err := client.Start(ctx); err != nil { // shares before traffic
			client.Close()
			return nil, err
		}
		applied, ready = client.Applied, client.Ready
		apply = func(cfg *allot.Config) {
			svc.SetConfig(cfg)
			if err := client.Reconfigure(context.Background()); err != nil {
				log.Warn("assignments not re-read after a configuration change", "err", err)
			}
		}
		n.leave = func() {
			// The leave counts as taken once its stream stayed up for half
			// a second (coordclient); one that broke is said again.
			lctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			client.Leave(lctx)
			cancel()
		}
		lctx, cancel := context.WithCancel(context.Background())
		n.stopLink, n.linkDone = cancel, make(chan struct{})
		go func() { client.Run(lctx); client.Close(); close(n.linkDone) }()
	}

	n.setConfig = func(cfg *allot.Config) { apply(cfg) }
	n.ready = ready
	gl, err := spec.sec.listen("grpc", spec.grpcAddr)
	if err != nil {
		n.stopLink()
		return nil, fmt.Errorf("region %s: grpc listen: %w", spec.name, err)
	}
	hl, err := spec.sec.listen("http", spec.httpAddr)
	if err != nil {
		gl.Close()
		n.stopLink()
		return nil, fmt.Errorf("region %s: http listen: %w", spec.name, err)
	}
	n.grpcAddr, n.httpAddr, n.sec = gl.Addr().String(), hl.Addr().String(), spec.sec.security
	aopts := server.AdminOptions{Addr: cmp.Or(spec.advertise, n.grpcAddr), Applied: applied}
	if spec.store != nil {
		aopts.Shares = spec.store.DefaultShares
	}
	if follower != nil {
		aopts.ConfigVersion = func() (int64, error) { st := follower.State(); return st.Version, st.Refused }
	}
	if n.gs, err = spec.sec.grpcServer(log, false); err != nil {
		gl.Close()
		hl.Close()
		n.stopLink()
		return nil, err
	}
	svc.RegisterGRPC(n.gs)
	svc.RegisterAdmin(n.gs, aopts)
	if err := startPeers(spec, inode, n, reg, spec.log); err != nil {
		gl.Close()
		hl.Close()
		n.stopLink()
		return nil, err
	}
	n.hs = httpx.Server(svc.HTTPHandler(server.HTTPOptions{Gatherer: reg, Ready: ready, Status: svc.StatusHandler(aopts)}), httpTimeouts)
	go func() { n.errc <- n.gs.Serve(gl) }()
	go func() { n.errc <- spec.sec.serveHTTP(n.hs, hl) }()
	if follower != nil {
		fctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { follower.Run(fctx); close(done) }()
		registration, err := spec.store.Register(ctx, etcdstore.Region{Region: spec.name, Addr: cmp.Or(spec.advertise, n.grpcAddr), HTTP: cmp.Or(spec.advertiseHTTP, n.httpAddr)})
		if err != nil {
			stop()
			<-done
			n.gs.Stop()
			n.hs.Close()
			n.stopLink()
			return nil, fmt.Errorf("region %s: register in etcd: %w", spec.name, err)
		}
		prev := n.stopRS
		n.stopRS = func() { registration.Close(); stop(); <-done; prev() }
	}
	log.Info("serving", "grpc", n.grpcAddr, "http", n.httpAddr, "coordinators", strings.Join(spec.coordinators, ","))
	started = true
	return n, nil
}

// stop shuts the node down gracefully (10 s at most).
func (n *regionNode) stop() error {
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	n.stopPeers()
	go func() { n.gs.GracefulStop(); close(done) }()
	err := n.hs.Shutdown(shut)
	select {
	case <-done:
	case <-shut.Done():
		n.gs.Stop()
	}
	n.stopPersist() // with the shares still held: the least share in force stays
	if n.leave != nil {
		n.leave() // no request is served any more
	}
	n.stopLink()
	<-n.linkDone
	n.stopRS()
	return err
}

// startRegionalStore connects to the regional Redis, if any, and returns
// the Enforcer that uses it, and a function that gives back its leases
// and disconnects. It keeps the Enforcer's membership and leases up to
// date until then.
func startRegionalStore(ctx context.Context, spec regionSpec, engine *regional.Engine, clock func() time.Time, reg prometheus.Registerer, log, plain *slog.Logger) (*regional.Enforcer, func(), error) {
	if len(spec.redis) == 0 {
		for _, d := range spec.cfg.Domains {
			for _, l := range d.Limits {
				if l.Enforcement != allot.Local {
					log.Info("no --redis: leased and exact limits are enforced in memory, per instance", "domain", d.Name, "limit", l.Name)
				}
			}
		}
		return nil, func() {}, nil
	}
	redis.SetLogger(redisLog{log}) // go-redis logs each failed dial: debug, not stderr
	store, err := redisstore.New(redisstore.Options{Addrs: spec.redis, Cluster: spec.redisCluster,
		TLS: spec.sec.redis, TLSFor: spec.sec.redisFor, Username: spec.sec.redisUser, Password: spec.sec.redisPassword,
		Prefix: redisstore.DefaultPrefix + spec.name + ":", Registry: reg, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if err := store.Ping(pctx); err != nil {
		log.Warn("regional store unreachable at start; leased and exact limits follow on_failure until it answers", "redis", strings.Join(spec.redis, ","), "err", err)
	}
	cancel()
	host, _ := os.Hostname()
	f := regional.NewEnforcer(engine, store, regional.EnforcerOptions{Region: spec.name,
		Instance: fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32()), StoreTimeout: spec.storeTimeout, Logger: plain})
	tctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			f.Tick(tctx, clock())
			select {
			case <-t.C:
			case <-tctx.Done():
				return
			}
		}
	}()
	return f, func() {
		stop()
		<-done
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := f.Close(cctx, clock()); err != nil {
			log.Warn("regional store: leases not given back at shutdown", "err", err)
		}
		store.Close()
	}, nil
}

// serveUntilDone calls reload on SIGHUP and stops the nodes when ctx ends
// or one fails. A nil reload means the configuration follows etcd.
func serveUntilDone(ctx context.Context, log *slog.Logger, reload func() error, nodes []*regionNode) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	failed := make(chan error, 1)
	for _, n := range nodes {
		go func() {
			if err := <-n.errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
				select {
				case failed <- fmt.Errorf("region %s: serve: %w", n.name, err):
				default:
				}
			}
		}()
	}
	stopAll := func() error {
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.stop())
		}
		return errors.Join(errs...)
	}
	for {
		select {
		case <-hup:
			if reload == nil {
				log.Warn("SIGHUP ignored: the configuration follows etcd; change it with allotctl limits apply")
			} else if err := reload(); err != nil {
				log.Error("reload refused; the previous config stays in force", "err", err)
			}
		case err := <-failed:
			stopAll()
			return err
		case <-ctx.Done():
			log.Info("shutting down")
			return stopAll()
		}
	}
}

// redisLog sends go-redis's own log lines to slog at debug level.
type redisLog struct{ log *slog.Logger }

func (r redisLog) Printf(_ context.Context, format string, v ...any) {
	r.log.Debug(fmt.Sprintf(format, v...), "component", "go-redis")
}

func printRegion(w io.Writer, n *regionNode, cfg *allot.Config) {
	fmt.Fprintf(w, "allot: region %s serving %d domain(s) from %s\n", n.name, len(cfg.Domains), cfg.Source)
	fmt.Fprintf(w, "  gRPC  %s  (allot.v1.RateLimiter, envoy.service.ratelimit.v3.RateLimitService)\n", n.grpcAddr)
	fmt.Fprintf(w, "  HTTP  %s://%s  (POST /v1/check, /healthz, /readyz, /metrics)\n", n.sec.scheme(), n.httpAddr)
	fmt.Fprintf(w, "  transport: %s\n", n.sec.banner())
}

// etcdClient connects to etcd at endpoints, with TLS when tlsCfg is set
// (its client certificate read at every handshake).
// etcdClient is a client of the etcd at endpoints; dial, when given (the
// links' etcdDial), makes each connection TLS with the CA bundle and
// certificate in force then, after tlsCfg's credentials (the last wins).
func etcdClient(endpoints string, tlsCfg *tls.Config, dial ...grpc.DialOption) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: splitList(endpoints), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: tlsCfg,
		DialOptions: dial})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", endpoints, err)
	}
	return cli, nil
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// offsetAddr moves addr's port by d (port 0 stays 0).
func offsetAddr(addr string, d int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("port of %q: %w", addr, err)
	}
	if p == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+d)), nil
}

// certInstance is the instance of an enforcer of region whose certificate
// (src; nil: plain text) names it: the coordinator and the peers refuse a
// stream whose hello names another region or instance. --instance, when
// given, must be the certificate's; without TLS it is instance as given.
func certInstance(src *tlsx.Source, region, instance string) (string, error) {
	if src == nil {
		return instance, nil
	}
	id, err := src.Identity()
	switch {
	case err != nil:
		return "", fmt.Errorf("region %s: the TLS certificate names no enforcer (spiffe://allot/region/%s/instance/ID): %w", region, region, err)
	case id.Region != region || id.Instance == "":
		return "", fmt.Errorf("region %s: the TLS certificate %s is not an enforcer instance of %s (spiffe://allot/region/%s/instance/ID)", region, id.URI, region, region)
	case instance != "" && instance != id.Instance:
		return "", fmt.Errorf("region %s: --instance %s, but the TLS certificate names instance %s", region, instance, id.Instance)
	}
	return id.Instance, nil
}
