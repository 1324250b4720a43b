package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/coordclient"
	"github.com/allot-dev/allot/regional/server"
)

// regionFlags are the flags of every command that serves a region.
type regionFlags struct {
	config       string
	region       string
	grpcAddr     string
	httpAddr     string
	maxKeys      int
	logLevel     string
	coordinators string
	etcd         string
	reportEvery  time.Duration
}

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
	fs := flag.NewFlagSet("allot regional", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f regionFlags
	f.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	fs.StringVar(&f.region, "region", "", "name of the region this enforcer serves (required)")
	fs.StringVar(&f.coordinators, "coordinator", "", "coordinators' gRPC addresses, comma-separated; without it the region holds whole limits")
	fs.StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated: the persisted assignment is applied at start")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot regional --config FILE --region NAME [flags]\n\nServes one region's enforcer. SIGHUP reloads --config; SIGINT/SIGTERM stop gracefully.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.region == "" {
		return errors.New("regional: --region is required")
	}
	if f.config == "" {
		return errors.New("regional: --config is required (allot dev runs the built-in example)")
	}
	if f.etcd != "" && f.coordinators == "" {
		return errors.New("regional: --etcd needs --coordinator")
	}
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		return err
	}
	var store *etcdstore.Store
	if f.etcd != "" {
		cli, err := etcdClient(f.etcd)
		if err != nil {
			return err
		}
		defer cli.Close()
		store = etcdstore.New(cli, "")
	}
	node, err := startRegion(ctx, regionSpec{
		name: f.region, cfg: cfg, grpcAddr: f.grpcAddr, httpAddr: f.httpAddr, maxKeys: f.maxKeys,
		coordinators: splitList(f.coordinators), store: store, reportEvery: f.reportEvery, log: log,
	})
	if err != nil {
		return err
	}
	printRegion(stdout, node, cfg)
	return serveUntilDone(ctx, log, f.config, []*regionNode{node})
}

// regionSpec says how to start one region's enforcer.
type regionSpec struct {
	name               string
	cfg                *allot.Config
	grpcAddr, httpAddr string
	maxKeys            int
	coordinators       []string
	store              *etcdstore.Store // nil: no persisted assignment to start from
	reportEvery        time.Duration
	log                *slog.Logger
}

// regionNode is one region's running enforcer.
type regionNode struct {
	name     string
	svc      *server.Service
	gs       *grpc.Server
	hs       *http.Server
	grpcAddr string
	httpAddr string
	errc     chan error
	stopLink context.CancelFunc
	linkDone chan struct{}
}

// startRegion serves one region: it listens, applies the persisted or
// initial shares when coordinated, and starts serving and reporting.
func startRegion(ctx context.Context, spec regionSpec) (*regionNode, error) {
	log := spec.log.With("region", spec.name)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engine := regional.New(spec.cfg, regional.Options{MaxKeys: spec.maxKeys})
	svc := server.New(engine, server.Options{Region: spec.name, Registry: reg, Logger: log})

	n := &regionNode{name: spec.name, svc: svc, errc: make(chan error, 2), stopLink: func() {}, linkDone: make(chan struct{})}
	close(n.linkDone)
	if len(spec.coordinators) > 0 {
		opts := coordclient.Options{Region: spec.name, Engine: engine, Addrs: spec.coordinators, ReportEvery: spec.reportEvery, Logger: log, Registry: reg}
		if spec.store != nil {
			opts.Snapshot = spec.store.Snapshot
		}
		client, err := coordclient.New(opts)
		if err != nil {
			return nil, err
		}
		if err := client.Start(ctx); err != nil { // shares before traffic
			client.Close()
			return nil, err
		}
		lctx, cancel := context.WithCancel(context.Background())
		n.stopLink, n.linkDone = cancel, make(chan struct{})
		go func() { client.Run(lctx); client.Close(); close(n.linkDone) }()
	}

	gl, err := net.Listen("tcp", spec.grpcAddr)
	if err != nil {
		n.stopLink()
		return nil, fmt.Errorf("region %s: grpc listen: %w", spec.name, err)
	}
	hl, err := net.Listen("tcp", spec.httpAddr)
	if err != nil {
		gl.Close()
		n.stopLink()
		return nil, fmt.Errorf("region %s: http listen: %w", spec.name, err)
	}
	n.gs = grpc.NewServer()
	svc.RegisterGRPC(n.gs)
	n.hs = &http.Server{Handler: svc.HTTPHandler(server.HTTPOptions{Gatherer: reg}), ReadHeaderTimeout: 5 * time.Second}
	n.grpcAddr, n.httpAddr = gl.Addr().String(), hl.Addr().String()
	go func() { n.errc <- n.gs.Serve(gl) }()
	go func() { n.errc <- n.hs.Serve(hl) }()
	log.Info("serving", "grpc", n.grpcAddr, "http", n.httpAddr, "coordinators", strings.Join(spec.coordinators, ","))
	return n, nil
}

// stop shuts the node down gracefully (10 s at most).
func (n *regionNode) stop() error {
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { n.gs.GracefulStop(); close(done) }()
	err := n.hs.Shutdown(shut)
	select {
	case <-done:
	case <-shut.Done():
		n.gs.Stop()
	}
	n.stopLink()
	<-n.linkDone
	return err
}

// serveUntilDone reloads every node's config on SIGHUP and stops them when
// ctx ends or one fails.
func serveUntilDone(ctx context.Context, log *slog.Logger, configPath string, nodes []*regionNode) error {
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
			next, err := loadConfig(configPath)
			if err != nil {
				log.Error("reload refused; the previous config stays in force", "err", err)
				continue
			}
			for _, n := range nodes {
				n.svc.SetConfig(next)
			}
			log.Info("config reloaded", "source", next.Source, "domains", len(next.Domains))
		case err := <-failed:
			stopAll()
			return err
		case <-ctx.Done():
			log.Info("shutting down")
			return stopAll()
		}
	}
}

func printRegion(w io.Writer, n *regionNode, cfg *allot.Config) {
	fmt.Fprintf(w, "allot: region %s serving %d domain(s) from %s\n", n.name, len(cfg.Domains), cfg.Source)
	fmt.Fprintf(w, "  gRPC  %s  (allot.v1.RateLimiter, envoy.service.ratelimit.v3.RateLimitService)\n", n.grpcAddr)
	fmt.Fprintf(w, "  HTTP  http://%s  (POST /v1/check, /healthz, /readyz, /metrics)\n", n.httpAddr)
}

func etcdClient(endpoints string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: splitList(endpoints), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
