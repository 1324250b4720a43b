package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/admin"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional/server"
)

// runDev starts the embedded default: an embedded etcd, one coordinator
// and several regions in one process.
func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allot dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f regionFlags
	f.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	regions := fs.String("regions", "us-east,eu-west,ap-south", "regions to run; region i listens on the first region's ports + 10·i")
	coordAddr := fs.String("coordinator-addr", "127.0.0.1:8070", "the coordinator's gRPC listen address")
	etcdAddr := fs.String("etcd-addr", "127.0.0.1:2479", "the embedded etcd's client address (its peer address is the next port)")
	dataDir := fs.String("data-dir", "", "the embedded etcd's data folder; default: a temporary folder removed at exit")
	period := fs.Duration("rebalance-period", 2*time.Second, "how often the coordinator recomputes shares")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot dev [flags]\n\nThe embedded default: an embedded etcd, a coordinator and three regions in one process,\nenforcing the built-in example limits in memory. SIGHUP reloads --config.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	names := splitList(*regions)
	if len(names) == 0 {
		return fmt.Errorf("dev: --regions is empty")
	}
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		return err
	}
	coordinated := coordinatedDomains(cfg, names)

	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "allot-dev-etcd-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	peer, err := offsetAddr(*etcdAddr, 1)
	if err != nil {
		return fmt.Errorf("dev: --etcd-addr: %w", err)
	}
	if peer == *etcdAddr {
		peer = "127.0.0.1:0"
	}
	etcd, err := etcdstore.StartEmbedded(dir, "http://"+*etcdAddr, "http://"+peer)
	if err != nil {
		return fmt.Errorf("dev: embedded etcd: %w", err)
	}
	defer etcd.Close()
	endpoint := etcd.Clients[0].Addr().String()
	cli, err := etcdClient(endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	store := etcdstore.New(cli, "")
	version, err := seedConfig(ctx, store, f.config)
	if err != nil {
		return err
	}

	// The coordinator's gRPC server: the Admin API (allotctl), and
	// allot.v1.Coordinator when some domain spans the dev regions.
	gl, err := net.Listen("tcp", *coordAddr)
	if err != nil {
		return fmt.Errorf("dev: coordinator listen: %w", err)
	}
	coordAddrUsed := gl.Addr().String()
	gs := grpc.NewServer(server.Recovery(log)...)
	adm := admin.New(admin.Options{Store: store, Logger: log})
	defer adm.Close()
	adm.Register(gs)
	var coordAdvertise string
	if len(coordinated) > 0 {
		coordAdvertise = coordAddrUsed
		srv, err := service.New(service.Options{
			Store: store, Config: cfg, Domains: coordinated, Advertise: coordAdvertise,
			Coordinator: coordinator.Config{Period: *period}, Logger: log.With("component", "coordinator"),
		})
		if err != nil {
			gl.Close()
			return err
		}
		srv.Register(gs)
		cctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { srv.Run(cctx); done <- struct{}{} }()
		go func() { followConfig(cctx, store, srv, version, log); done <- struct{}{} }()
		defer func() { cancel(); <-done; <-done }()
	}
	go gs.Serve(gl)
	defer gs.Stop()

	var nodes []*regionNode
	for i, name := range names {
		grpcAddr, err := offsetAddr(f.grpcAddr, 10*i)
		if err != nil {
			return fmt.Errorf("dev: --grpc-addr: %w", err)
		}
		httpAddr, err := offsetAddr(f.httpAddr, 10*i)
		if err != nil {
			return fmt.Errorf("dev: --http-addr: %w", err)
		}
		spec := regionSpec{name: name, cfg: cfg, grpcAddr: grpcAddr, httpAddr: httpAddr, maxKeys: f.maxKeys, reportEvery: f.reportEvery, log: log}
		// Shared-mode counters and loans between the regions (peers.go).
		spec.peers = devPeers(names, f.grpcAddr, i)
		spec.store, spec.follow = store, true // regions follow the configuration in etcd and register
		if coordAdvertise != "" {
			spec.coordinators = []string{coordAdvertise}
		}
		n, err := startRegion(ctx, spec)
		if err != nil {
			for _, n := range nodes {
				n.stop()
			}
			return err
		}
		nodes = append(nodes, n)
	}
	printDev(stdout, cfg, nodes, coordAddrUsed, coordAdvertise, endpoint, coordinated, version)
	// SIGHUP stores the file as a new version, which every region and the
	// coordinator follow; a bad file is refused before it reaches etcd.
	return serveUntilDone(ctx, log, func() error {
		if _, err := loadConfig(f.config); err != nil {
			return err
		}
		v, err := seedConfig(ctx, store, f.config)
		if err == nil {
			log.Info("config stored in etcd", "version", v)
		}
		return err
	}, nodes)
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

func printDev(w io.Writer, cfg *allot.Config, nodes []*regionNode, adminAddr, coord, etcd string, coordinated []string, version int64) {
	fmt.Fprintf(w, "allot dev: %d regions enforcing %s, configuration version %d in etcd\n", len(nodes), cfg.Source, version)
	for _, n := range nodes {
		fmt.Fprintf(w, "  region %-9s gRPC %-16s HTTP http://%s\n", n.name, n.grpcAddr, n.httpAddr)
	}
	if coord != "" {
		fmt.Fprintf(w, "  coordinator      gRPC %-16s domains %v, shares rebalanced from demand\n", coord, coordinated)
	}
	fmt.Fprintf(w, "  admin API        gRPC %-16s allotctl status | limits apply FILE | override set ... (--addr %s)\n", adminAddr, adminAddr)
	fmt.Fprintf(w, "  etcd (embedded)  %s\n", etcd)
	first := nodes[0]
	fmt.Fprintf(w, "\nTry it: user 42 may send 30/s with a burst of 15 over all regions; %s starts with 35%% of it,\n", first.name)
	fmt.Fprintf(w, "so the 6th request in a row gets a 429:\n")
	fmt.Fprintf(w, "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%%{http_code}\\n' -X POST http://%s/v1/check \\\n", first.httpAddr)
	fmt.Fprintf(w, "    -H 'Content-Type: application/json' -d '{\"domain\":\"api\",\"descriptors\":[{\"user\":\"42\"}]}'; done\n")
	fmt.Fprintf(w, "Metrics: http://%s/metrics   Stop with Ctrl-C.\n", first.httpAddr)
}
