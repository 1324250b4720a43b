package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/admin"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/httpx"
	"github.com/allot-dev/allot/internal/tlsx"
)

// coordinatorFlags are the flags of `allot coordinator`.
type coordinatorFlags struct {
	etcd      string
	domains   string
	config    string
	grpcAddr  string
	httpAddr  string
	advertise string
	period    time.Duration
	grantTTL  time.Duration
	logLevel  string
	tls       tlsFlags
	grants    []tlsx.Grant // --grant-roles: roles at the Admin API beyond an identity's kind
}

func runCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot coordinator", "usage: allot coordinator --etcd ENDPOINTS [flags]\n\n"+
		"Campaigns in etcd to lead each domain and, while leading, splits its limits among regions.\n"+
		"Serves the Admin API (allotctl): versioned limits, overrides and plans in etcd, usage and status.", stderr)
	var f coordinatorFlags
	fs.StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated (required)")
	fs.StringVar(&f.domains, "domains", "", "domains to coordinate, comma-separated (default: every domain of the config)")
	fs.StringVar(&f.config, "config", "", "limits file; default: the config stored in etcd, else the built-in "+examples.LimitsName)
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:8070", "gRPC listen address (allot.v1.Coordinator, and allot.v1.Admin for allotctl)")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:8071", "HTTP listen address (/metrics, /healthz)")
	fs.StringVar(&f.advertise, "advertise", "", "address regions reach this coordinator at (default: the gRPC listen address)")
	fs.DurationVar(&f.period, "rebalance-period", 2*time.Second, "how often shares are recomputed")
	fs.DurationVar(&f.grantTTL, "grant-ttl", coordinator.DefaultGrantTTL, "how long an instance's grant lasts unrenewed: an instance cut off from every coordinator this long holds nothing, and what a vanished instance held is reclaimed after it (plus 500ms of tolerated clock skew); a new leader raises nothing for as long")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	f.tls.register(fs)
	f.tls.registerEtcd(fs)
	fs.Func("grant-roles", "URI=ROLE[,ROLE...]: over TLS, adds Admin API roles (viewer: reads, operator: writes) to the certificate identity URI, or to every identity under a prefix ending in /* (repeatable); an operator's certificate reads and writes, a coordinator's reads", func(s string) error {
		g, err := tlsx.ParseGrant(s)
		if err != nil {
			return err
		}
		f.grants = append(f.grants, g)
		return nil
	})
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	if f.etcd == "" {
		return errors.New("coordinator: --etcd is required")
	}
	log, err := (&regionFlags{logLevel: f.logLevel}).logger(stderr)
	if err != nil {
		return err
	}
	sec, err := f.tls.load(log)
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	etcdTLS, etcdDial, err := f.tls.etcdTLS(log)
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if etcdTLS == nil {
		if err := sec.plainLink("--etcd", splitList(f.etcd)...); err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(f.etcd, ","), DialTimeout: 5 * time.Second, TLS: etcdTLS,
		DialOptions: etcdDial}) // each connection verified against the CA bundle in force then
	if err != nil {
		return fmt.Errorf("coordinator: etcd: %w", err)
	}
	defer cli.Close()
	store := etcdstore.New(cli, "")
	cfg, rev, err := fleetConfig(ctx, store, f.config)
	if err != nil {
		return err
	}
	gl, err := sec.listen("grpc", f.grpcAddr)
	if err != nil {
		return fmt.Errorf("coordinator: grpc listen: %w", err)
	}
	hl, err := sec.listen("http", f.httpAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("coordinator: http listen: %w", err)
	}
	if f.advertise == "" {
		f.advertise = gl.Addr().String()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var domains []string
	if f.domains != "" {
		domains = strings.Split(f.domains, ",")
	}
	srv, err := service.New(service.Options{
		Store: store, Config: cfg, Domains: domains, Advertise: f.advertise,
		Coordinator: coordinator.Config{Period: f.period}, GrantTTL: f.grantTTL,
		Logger: log, Registry: reg,
	})
	if err != nil {
		return err
	}
	gs, err := sec.grpcServer(log, true)
	if err != nil {
		gl.Close()
		hl.Close()
		return fmt.Errorf("coordinator: %w", err)
	}
	srv.Register(gs)
	adm := admin.New(admin.Options{Store: store, Logger: log, Credentials: sec.creds(), Registry: reg,
		Authorization: &tlsx.Policy{Grants: f.grants}})
	defer adm.Close()
	adm.Register(gs)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	hs := httpx.Server(mux, httpTimeouts)
	go gs.Serve(gl)
	go sec.serveHTTP(hs, hl)
	fmt.Fprintf(stdout, "allot: coordinator serving gRPC %s (advertised %s; allot.v1.Coordinator and allot.v1.Admin for allotctl), HTTP %s://%s, etcd %s; %s\n",
		gl.Addr(), f.advertise, sec.scheme(), hl.Addr(), f.etcd, sec.banner())
	if f.config == "" {
		// The fleet's config lives in etcd: follow it. A bad one is refused
		// and the one in force stays.
		go store.WatchConfig(ctx, func(yaml []byte, at int64) {
			if at == rev {
				return // the one loaded at start
			}
			rev = at
			next, err := allot.ParseConfig(fmt.Sprintf("etcd:config@%d", rev), yaml)
			if err == nil {
				err = srv.SetConfig(next)
			}
			if err != nil {
				log.Error("config in etcd refused; the previous one stays in force", "revision", rev, "err", err)
				return
			}
			log.Info("config from etcd in force", "revision", rev)
		})
	}
	err = srv.Run(ctx)
	gs.GracefulStop()
	hs.Close()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// fleetConfig is the limits configuration of a fleet: the file when one
// is given, else the one stored in etcd (with its revision), else the
// built-in example.
func fleetConfig(ctx context.Context, store *etcdstore.Store, path string) (*allot.Config, int64, error) {
	if path != "" {
		cfg, err := allot.LoadConfigFile(path)
		return cfg, 0, err
	}
	yaml, rev, err := store.Config(ctx)
	switch {
	case errors.Is(err, etcdstore.ErrNoConfig):
		cfg, err := loadConfig("")
		return cfg, 0, err
	case err != nil:
		return nil, 0, fmt.Errorf("read the config from etcd: %w", err)
	}
	cfg, err := allot.ParseConfig(fmt.Sprintf("etcd:config@%d", rev), yaml)
	return cfg, rev, err
}
