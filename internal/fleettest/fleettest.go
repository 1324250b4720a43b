// Package fleettest runs an allot fleet inside a test process: an
// embedded etcd, the coordinator's Admin API on a loopback gRPC server,
// and regions that follow the configuration in etcd
// (regional/configwatch), each serving allot.v1.RateLimiter and the
// read-only Admin API on its own loopback gRPC server and registered in
// etcd. Everything is stopped by the test's cleanup.
package fleettest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/admin"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/configwatch"
	"github.com/allot-dev/allot/regional/server"
)

// Fleet is a running fleet.
type Fleet struct {
	Store   *etcdstore.Store
	Admin   string // the Admin API's gRPC address
	Client  allotv1.AdminClient
	Regions []*Region
}

// Region is one region of a Fleet.
type Region struct {
	Name     string
	Addr     string // gRPC: allot.v1.RateLimiter and the read-only Admin API
	Engine   *regional.Engine
	Service  *server.Service
	Follower *configwatch.Follower
	Registry *prometheus.Registry
	Limiter  allotv1.RateLimiterClient
}

// Start starts a fleet whose configuration version 1 is yaml, with one
// region per name.
func Start(t testing.TB, yaml string, regions ...string) *Fleet {
	t.Helper()
	ctx := t.Context()
	client, peer := "http://"+freeAddr(t), "http://"+freeAddr(t)
	etcd, err := etcdstore.StartEmbedded(t.TempDir(), client, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	f := &Fleet{Store: etcdstore.New(cli, "", etcdstore.WithSessionTTL(time.Second))}
	if _, err := f.Store.ApplyConfig(ctx, 0, etcdstore.ConfigVersion{Time: time.Now().UTC(), Author: "fleettest", Summary: "initial", YAML: yaml}); err != nil {
		t.Fatal(err)
	}

	srv := admin.New(admin.Options{Store: f.Store})
	t.Cleanup(srv.Close)
	f.Admin = serve(t, func(gs grpc.ServiceRegistrar, _ string) { srv.Register(gs) })
	f.Client = allotv1.NewAdminClient(dial(t, f.Admin))

	for _, name := range regions {
		f.Regions = append(f.Regions, startRegion(t, f.Store, name))
	}
	return f
}

func startRegion(t testing.TB, store *etcdstore.Store, name string) *Region {
	t.Helper()
	r := &Region{Name: name, Registry: prometheus.NewRegistry()}
	r.Follower = configwatch.New(configwatch.Options{Store: store, Apply: func(cfg *allot.Config) { r.Service.SetConfig(cfg) }})
	cfg, err := r.Follower.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r.Engine = regional.New(cfg, regional.Options{})
	r.Service = server.New(r.Engine, server.Options{Region: name, Registry: r.Registry})
	version := func() (int64, error) { st := r.Follower.State(); return st.Version, st.Refused }
	r.Addr = serve(t, func(gs grpc.ServiceRegistrar, addr string) {
		r.Service.RegisterGRPC(gs)
		r.Service.RegisterAdmin(gs, server.AdminOptions{Addr: addr, ConfigVersion: version})
	})
	r.Limiter = allotv1.NewRateLimiterClient(dial(t, r.Addr))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Follower.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	reg, err := store.Register(t.Context(), etcdstore.Region{Region: name, Addr: r.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	return r
}

// serve starts a gRPC server on a loopback port with what register
// registers (given the address), and returns its address.
func serve(t testing.TB, register func(gs grpc.ServiceRegistrar, addr string)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs, l.Addr().String())
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// Poll calls ok every 200µs until it returns true, and fails t if
// it has not within d. It returns how long it took.
func Poll(t testing.TB, d time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return time.Since(start)
}
