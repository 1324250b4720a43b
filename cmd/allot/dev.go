package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/admin"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/tlsx"
)

// devFlags are allot dev's flags; allot demo has them too.
type devFlags struct {
	regionFlags
	regions   string
	coordAddr string
	etcdAddr  string
	dataDir   string
	period    time.Duration
	// keepConfig: a configuration already in etcd (an earlier run's, in
	// --data-dir) stays in force at start unless --config names a file.
	// allot dev keeps it; allot demo, whose story is written for the
	// built-in example, does not.
	keepConfig bool
	// devTLS are the TLS flags: certificates allot dev issues (devtls.go).
	devTLS devTLSFlags
	// anonymousSet: --anonymous-roles was given (with TLS, the default
	// narrows to check).
	anonymousSet bool
	// demo: allot demo, whose client gets a certificate too.
	demo bool
}

func (f *devFlags) register(fs *flag.FlagSet) {
	f.regionFlags.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	// Plain text on loopback: the Go SDK's gateway mode, Envoy's refunds
	// (where a domain allows them) and allotctl's reads work anonymously.
	f.registerRoles(fs, "check,gateway,refund,viewer")
	fs.StringVar(&f.regions, "regions", "us-east,eu-west,ap-south", "regions to run; region i listens on the first region's ports + 10·i")
	fs.StringVar(&f.coordAddr, "coordinator-addr", "127.0.0.1:8070", "the coordinator's gRPC listen address")
	fs.StringVar(&f.etcdAddr, "etcd-addr", "127.0.0.1:2479", "the embedded etcd's client address (its peer address is the next port)")
	fs.StringVar(&f.dataDir, "data-dir", "", "the embedded etcd's data folder, kept across restarts: configuration versions, overrides, plans and shares; default: a temporary folder removed at exit (nothing is kept)")
	fs.DurationVar(&f.period, "rebalance-period", 2*time.Second, "how often the coordinator recomputes shares")
	f.devTLS.register(fs)
}

// parsed notes, after fs is parsed, what defaults the flags given change.
func (f *devFlags) parsed(fs *flag.FlagSet) {
	fs.Visit(func(fl *flag.Flag) { f.anonymousSet = f.anonymousSet || fl.Name == "anonymous-roles" })
}

// runDev starts the embedded default: an embedded etcd, one coordinator
// and several regions in one process.
func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot dev", "usage: allot dev [flags]\n\nThe embedded default: an embedded etcd, a coordinator and three regions in one process,\n"+
		"enforcing the built-in example limits in memory. SIGHUP reloads --config.\n\n"+
		"It is ephemeral by default: etcd's data (configuration versions, overrides, plans, shares) is in a\n"+
		"temporary folder removed at exit, and the next start is back at configuration version 1. With\n"+
		"--data-dir DIR it is kept in DIR: a restart keeps the configuration in force there (and its version)\n"+
		"unless --config names a file, which is then stored as a new version if it differs.", stderr)
	var f devFlags
	f.register(fs)
	f.keepConfig = true
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	f.parsed(fs)
	c, err := startDev(ctx, &f, stderr, nil)
	if err != nil {
		return err
	}
	defer c.close()
	waitGranted(ctx, c.nodes, 10*time.Second, stderr)
	printDev(stdout, c)
	return c.serve(ctx, f.config)
}

// devLinks, when given to startDev, chooses the addresses through which
// a region reaches the coordinators and its peers: allot demo puts links
// it can cut in between. It gets the direct coordinator addresses (none
// when no domain is coordinated).
type devLinks func(region string, coordinators []string) (via []string, peers map[string]string, err error)

// devCluster is the embedded default, running. Its regions' nodes are
// stopped by serve; close releases the rest.
type devCluster struct {
	cfg            *allot.Config
	log            *slog.Logger
	store          *etcdstore.Store
	nodes          []*regionNode
	adminAddr      string // the coordinator's gRPC address (Admin API)
	coordAdvertise string // the same when some domain is coordinated, else ""
	etcd           string // the embedded etcd's client address
	coordinated    []string
	version        int64    // the configuration version in force in etcd at start
	dataDir        string   // etcd's data folder; "" when temporary (ephemeral)
	kept           bool     // the configuration in etcd was kept (an earlier run's)
	sec            security // TLS of the coordinator's listener and links (and the demo's dashboard), or plain text
	tls            *devTLS  // the certificates issued; nil: plain text
	cleanup        []func() // run in reverse order by close
}

// startDev starts the embedded default described by f: an embedded etcd,
// the coordinator and f's regions, linked directly or through links.
func startDev(ctx context.Context, f *devFlags, stderr io.Writer, links devLinks) (_ *devCluster, err error) {
	names := splitList(f.regions)
	if len(names) == 0 {
		return nil, fmt.Errorf("dev: --regions is empty")
	}
	log, err := f.logger(stderr)
	if err != nil {
		return nil, err
	}
	authz, err := f.policy()
	if err != nil {
		return nil, fmt.Errorf("dev: %w", err)
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		return nil, err
	}
	// The embedded etcd serves plain text, also beside TLS: its clients
	// are this process and allotctl on this host.
	if !tlsx.IsLoopback(f.etcdAddr) {
		return nil, fmt.Errorf("dev: --etcd-addr %s: the embedded etcd serves plain text, on loopback only", f.etcdAddr)
	}
	if f.devTLS.dir != "" && !f.devTLS.enabled() {
		return nil, errors.New("dev: --tls-dir needs --tls")
	}
	// One command: without --tls, allot dev (and demo) choose plain text
	// themselves, as --insecure would: every listener and link must then
	// be on loopback, which the defaults are.
	c := &devCluster{log: log, dataDir: f.dataDir, sec: security{insecure: true}}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if f.devTLS.enabled() {
		// A certificate per region, the coordinator and the clients: each
		// region speaks for itself only (devtls.go).
		if c.tls, err = issueDevTLS(&f.devTLS, names, f.demo, log); err != nil {
			return nil, fmt.Errorf("dev: %w", err)
		}
		c.cleanup = append(c.cleanup, c.tls.cleanup)
		c.sec = c.tls.security(holderCoordinator)
		if !f.anonymousSet {
			// Over TLS, a caller without a certificate only checks: the
			// Go SDK's gateway mode has the gateway's certificate.
			authz.Anonymous = tlsx.RoleCheck
		}
		if f.demo {
			// The demo's dashboard reads the regions' Status and Usage.
			authz.Grants = append(authz.Grants, tlsx.Grant{URI: devDemoURI, Roles: tlsx.RoleViewer})
		}
	}
	sec := c.sec

	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "allot-dev-etcd-"); err != nil {
			return nil, err
		}
		c.cleanup = append(c.cleanup, func() { os.RemoveAll(dir) })
	}
	peer, err := offsetAddr(f.etcdAddr, 1)
	if err != nil {
		return nil, fmt.Errorf("dev: --etcd-addr: %w", err)
	}
	if peer == f.etcdAddr {
		peer = "127.0.0.1:0"
	}
	etcd, err := etcdstore.StartEmbedded(dir, "http://"+f.etcdAddr, "http://"+peer)
	if err != nil {
		return nil, fmt.Errorf("dev: embedded etcd: %w", err)
	}
	c.cleanup = append(c.cleanup, etcd.Close)
	c.etcd = etcd.Clients[0].Addr().String()
	cli, err := etcdClient(c.etcd, nil) // the embedded etcd: plain text on loopback
	if err != nil {
		return nil, err
	}
	c.cleanup = append(c.cleanup, func() { cli.Close() })
	c.store = etcdstore.New(cli, "")
	if f.keepConfig && f.config == "" {
		var kept *allot.Config
		if kept, c.version, err = keptConfig(ctx, c.store); err != nil {
			return nil, err
		}
		if kept != nil {
			cfg, c.kept = kept, true
		}
	}
	if !c.kept {
		if c.version, err = seedConfig(ctx, c.store, f.config); err != nil {
			return nil, err
		}
	}
	c.cfg, c.coordinated = cfg, coordinatedDomains(cfg, names)

	// The coordinator's gRPC server: the Admin API (allotctl), and
	// allot.v1.Coordinator when some domain spans the dev regions.
	gl, err := sec.listen("coordinator grpc", f.coordAddr)
	if err != nil {
		return nil, fmt.Errorf("dev: coordinator listen: %w", err)
	}
	c.adminAddr = gl.Addr().String()
	gs, err := sec.grpcServer(log, true)
	if err != nil {
		gl.Close()
		return nil, fmt.Errorf("dev: %w", err)
	}
	adm := admin.New(admin.Options{Store: c.store, Logger: log, Credentials: sec.creds(), Authorization: &tlsx.Policy{Grants: f.grants}})
	c.cleanup = append(c.cleanup, adm.Close)
	adm.Register(gs)
	if len(c.coordinated) > 0 {
		c.coordAdvertise = c.adminAddr
		srv, err := service.New(service.Options{
			Store: c.store, Config: cfg, Domains: c.coordinated, Advertise: c.coordAdvertise,
			Coordinator: coordinator.Config{Period: f.period}, Logger: log.With("component", "coordinator"),
		})
		if err != nil {
			gl.Close()
			return nil, err
		}
		srv.Register(gs)
		cctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { srv.Run(cctx); done <- struct{}{} }()
		go func() { followConfig(cctx, c.store, srv, c.version, log); done <- struct{}{} }()
		c.cleanup = append(c.cleanup, func() { cancel(); <-done; <-done })
	}
	go gs.Serve(gl)
	c.cleanup = append(c.cleanup, gs.Stop)

	for i, name := range names {
		grpcAddr, err := offsetAddr(f.grpcAddr, 10*i)
		if err != nil {
			return nil, fmt.Errorf("dev: --grpc-addr: %w", err)
		}
		httpAddr, err := offsetAddr(f.httpAddr, 10*i)
		if err != nil {
			return nil, fmt.Errorf("dev: --http-addr: %w", err)
		}
		rsec := sec // plain text
		if c.tls != nil {
			rsec = c.tls.security("region/" + name) // its own certificate: it speaks for itself only
		}
		spec := regionSpec{name: name, cfg: cfg, grpcAddr: grpcAddr, httpAddr: httpAddr, maxKeys: f.maxKeys, reportEvery: f.reportEvery, log: log, sec: linkSecurity{security: rsec}, authz: authz}
		// Shared-mode counters and loans between the regions (peers.go).
		spec.peers = devPeers(names, f.grpcAddr, i)
		spec.store, spec.follow = c.store, true // regions follow the configuration in etcd and register
		if c.coordAdvertise != "" {
			spec.coordinators = []string{c.coordAdvertise}
		}
		if links != nil {
			if spec.coordinators, spec.peers, err = links(name, spec.coordinators); err != nil {
				return nil, fmt.Errorf("dev: region %s: %w", name, err)
			}
		}
		n, err := startRegion(ctx, spec)
		if err != nil {
			for _, n := range c.nodes {
				n.stop()
			}
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	return c, nil
}

// serve serves until ctx ends, then stops the regions. SIGHUP stores the
// file at path as a new version, which every region and the coordinator
// follow; a bad file is refused before it reaches etcd.
func (c *devCluster) serve(ctx context.Context, path string) error {
	return serveUntilDone(ctx, c.log, func() error {
		if _, err := loadConfig(path); err != nil {
			return err
		}
		v, err := seedConfig(ctx, c.store, path)
		if err == nil {
			c.log.Info("config stored in etcd", "version", v)
		}
		return err
	}, c.nodes)
}

// close stops the coordinator and etcd; serve has stopped the regions.
func (c *devCluster) close() {
	for i := len(c.cleanup) - 1; i >= 0; i-- {
		c.cleanup[i]()
	}
	c.cleanup = nil
}

// seedConfig makes the file dev starts with (or the built-in example) the
// current configuration version in etcd, a new version unless it already
// is, so that the regions, the coordinator and allotctl follow etcd from
// there. It returns the version.
func seedConfig(ctx context.Context, store *etcdstore.Store, path string) (int64, error) {
	yaml, source := examples.LimitsYAML, examples.LimitsName
	if path != "" {
		var err error
		if yaml, err = os.ReadFile(path); err != nil {
			return 0, fmt.Errorf("dev: %w", err)
		}
		source = path
	}
	cur, err := store.Version(ctx, 0)
	switch {
	case errors.Is(err, etcdstore.ErrNoConfig):
	case err != nil:
		return 0, fmt.Errorf("dev: read the config version in etcd: %w", err)
	case cur.YAML == string(yaml):
		return cur.Version, nil
	}
	v, err := store.ApplyConfig(ctx, cur.Version, etcdstore.ConfigVersion{
		Time: time.Now().UTC(), Author: "allot dev", Summary: "allot dev started with " + source, YAML: string(yaml)})
	if err != nil {
		return 0, fmt.Errorf("dev: store the config in etcd: %w", err)
	}
	return v.Version, nil
}

// keptConfig returns the configuration in force in etcd and its version,
// or nil when etcd holds none (a new data folder). It is named after the
// built-in example when it is the example.
func keptConfig(ctx context.Context, store *etcdstore.Store) (*allot.Config, int64, error) {
	cur, err := store.Version(ctx, 0)
	switch {
	case errors.Is(err, etcdstore.ErrNoConfig):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("dev: read the config version in etcd: %w", err)
	}
	name := fmt.Sprintf("etcd:config@%d", cur.Version)
	if cur.YAML == string(examples.LimitsYAML) {
		name = examples.LimitsName
	}
	cfg, err := allot.ParseConfig(name, []byte(cur.YAML))
	if err != nil {
		return nil, 0, fmt.Errorf("dev: the configuration in --data-dir (version %d) does not load; start with --config FILE to store another: %w", cur.Version, err)
	}
	return cfg, cur.Version, nil
}

// followConfig makes the coordinator follow the configuration in etcd,
// from the version after the one it started with, as `allot coordinator`
// does.
func followConfig(ctx context.Context, store *etcdstore.Store, srv *service.Server, started int64, log *slog.Logger) {
	store.WatchFleet(ctx, func(fl etcdstore.Fleet) {
		if fl.YAML == nil || fl.Version == started {
			return
		}
		started = fl.Version
		next, err := allot.ParseConfig(fmt.Sprintf("etcd:config@%d", fl.Version), fl.YAML)
		if err == nil {
			err = srv.SetConfig(next)
		}
		if err != nil {
			log.Error("config in etcd refused by the coordinator; the previous one stays in force", "version", fl.Version, "err", err)
		}
	})
}

// coordinatedDomains are the domains whose regions include every region
// of the dev cluster; the others are enforced whole in each region.
func coordinatedDomains(cfg *allot.Config, regions []string) []string {
	var out []string
	for _, d := range cfg.Domains {
		all := len(d.Regions) > 0
		for _, r := range regions {
			all = all && slices.Contains(d.Regions, r)
		}
		if all {
			out = append(out, d.Name)
		}
	}
	return out
}

func printDev(w io.Writer, c *devCluster) {
	printCluster(w, "allot dev", c)
	if c.kept && c.cfg.Source != examples.LimitsName {
		fmt.Fprintf(w, "\nThe configuration kept in %s is in force (allotctl limits history); --config FILE would store FILE instead.\n", c.dataDir)
		fmt.Fprintf(w, "Metrics: %s://%s/metrics   Stop with Ctrl-C.\n", c.sec.scheme(), c.nodes[0].httpAddr)
		return
	}
	first := c.nodes[0]
	fmt.Fprintf(w, "\nTry it: user 42 may send 30/s with a burst of 15 over all regions; %s starts with 35%% of it,\n", first.name)
	fmt.Fprintf(w, "so the 6th request in a row gets a 429:\n")
	curl := "curl -s"
	if c.tls != nil {
		curl += " --cacert " + c.tls.ca
	}
	fmt.Fprintf(w, "  for i in 1 2 3 4 5 6; do %s -o /dev/null -w '%%{http_code}\\n' -X POST %s://%s/v1/check \\\n", curl, c.sec.scheme(), first.httpAddr)
	fmt.Fprintf(w, "    -H 'Content-Type: application/json' -d '{\"domain\":\"api\",\"descriptors\":[{\"user\":\"42\"}]}'; done\n")
	fmt.Fprintf(w, "Metrics: %s://%s/metrics   Stop with Ctrl-C.\n", c.sec.scheme(), first.httpAddr)
}

// printCluster prints what c serves where, under the command's name.
func printCluster(w io.Writer, name string, c *devCluster) {
	fmt.Fprintf(w, "%s: %d regions enforcing %s, configuration version %d in etcd\n", name, len(c.nodes), c.cfg.Source, c.version)
	switch {
	case c.dataDir == "":
		fmt.Fprintf(w, "  ephemeral: etcd's data (configuration versions, overrides, plans, shares) is removed at exit;\n")
		fmt.Fprintf(w, "  the next start is back at version 1. --data-dir DIR keeps it across restarts.\n")
	case c.kept:
		fmt.Fprintf(w, "  state kept in %s (--data-dir): version %d is the configuration an earlier run left in force\n", c.dataDir, c.version)
	default:
		fmt.Fprintf(w, "  state kept in %s (--data-dir): configuration versions, overrides, plans and shares survive a restart\n", c.dataDir)
	}
	for _, n := range c.nodes {
		fmt.Fprintf(w, "  region %-9s gRPC %-16s HTTP %s://%s\n", n.name, n.grpcAddr, c.sec.scheme(), n.httpAddr)
	}
	if c.coordAdvertise != "" {
		fmt.Fprintf(w, "  coordinator      gRPC %-16s domains %v, shares rebalanced from demand\n", c.coordAdvertise, c.coordinated)
	}
	ctlFlags := "--addr " + c.adminAddr
	if c.tls == nil {
		ctlFlags = "--insecure " + ctlFlags // allotctl's plain text is explicit too
	}
	fmt.Fprintf(w, "  admin API        gRPC %-16s allotctl status | limits apply FILE | override set ... (%s)\n", c.adminAddr, ctlFlags)
	fmt.Fprintf(w, "  etcd (embedded)  %s\n", c.etcd)
	if c.tls == nil {
		fmt.Fprintf(w, "  transport        plain text, on loopback only (no --insecure needed here; other addresses are refused): --tls serves mutual TLS\n")
		return
	}
	ca := "a throwaway CA made at this start"
	if !c.tls.throwaway {
		ca = "the CA of --tls-ca"
	}
	fmt.Fprintf(w, "  transport        mutual TLS on every link but etcd's; certificates in %s, issued by %s:\n", c.tls.dir, ca)
	fmt.Fprintf(w, "                   one per region (%s), the coordinator (%s),\n", devRegionURI("REGION"), devCoordinatorURI)
	fmt.Fprintf(w, "                   an operator (%s) and a gateway (%s)", devOperatorURI, devGatewayURI)
	if _, ok := c.tls.files[holderDemo]; ok {
		fmt.Fprintf(w, ", the demo (%s)", devDemoURI)
	}
	fmt.Fprintf(w, "\n")
	op := c.tls.files[holderOperator]
	fmt.Fprintf(w, "  allotctl         export ALLOT_TLS_CA=%s ALLOT_TLS_CERT=%s ALLOT_TLS_KEY=%s\n", op.CA, op.Cert, op.Key)
	gw := c.tls.files[holderGateway]
	fmt.Fprintf(w, "  Go SDK gateway   client.Config.TLS from ALLOT_TLS_CA=%s ALLOT_TLS_CERT=%s ALLOT_TLS_KEY=%s\n", gw.CA, gw.Cert, gw.Key)
}

// waitGranted waits until every coordinated node holds a grant (an
// instance admits nothing before), for at most d.
func waitGranted(ctx context.Context, nodes []*regionNode, d time.Duration, stderr io.Writer) {
	deadline := time.Now().Add(d)
	for _, n := range nodes {
		for n.ready != nil && n.ready() != nil {
			if time.Now().After(deadline) || ctx.Err() != nil {
				fmt.Fprintf(stderr, "region %s: %v\n", n.name, n.ready())
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
