package service_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
)

// TestInstancesOfARegion runs two enforcer instances of us-east at once:
// neither kicks the other off (each keeps one stream), both get the
// region's assignments, and the region gets its share from the demand of
// both.
func TestInstancesOfARegion(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, a coordinator and four region instances")
	}
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	var connects atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.New(service.Options{
		Store: etcdstore.New(etcdClient(t, endpoint), "", etcdstore.WithSessionTTL(2*time.Second)), Config: cfg,
		Advertise: l.Addr().String(), TickEvery: 20 * time.Millisecond,
		Coordinator: coordinator.Config{Period: period, HalfLife: period / 4, DeadAfter: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		connects.Add(1)
		return h(s, ss)
	}))
	srv.Register(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go srv.Run(ctx)
	for start := time.Now(); !srv.Leading("api"); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("no leadership within 10s")
		}
	}
	store := etcdstore.New(etcdClient(t, endpoint), "")
	addrs := []string{l.Addr().String()}
	usA := startRegion(t, "us-east", cfg, addrs, store)
	usB := startRegion(t, "us-east", cfg, addrs, store)
	eu := startRegion(t, "eu-west", cfg, addrs, store)
	ap := startRegion(t, "ap-south", cfg, addrs, store)

	traffic := startLoad(t, []*region{usA, usB})
	traffic.active.Store("us-east", true)
	start := time.Now()
	for {
		a, b, e, p := usA.share(), usB.share(), eu.share(), ap.share()
		if a+e+p > 1+1e-9 || b+e+p > 1+1e-9 {
			t.Fatalf("applied shares sum above 1: us-east %v and %v, eu-west %v, ap-south %v", a, b, e, p)
		}
		if near(a, 0.8) && near(b, 0.8) && near(e, 0.1) && near(p, 0.1) {
			t.Logf("both instances of us-east took its share in %v", time.Since(start))
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("shares not moved to us-east within 10s: us-east %v and %v, eu-west %v, ap-south %v", a, b, e, p)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Let several periods pass: a kicked instance would reconnect.
	time.Sleep(10 * period)
	if n := connects.Load(); n != 4 {
		t.Fatalf("%d Connect streams for 4 instances: instances were kicked off and reconnected", n)
	}
	if n := traffic.errs.Load(); n != 0 {
		t.Fatalf("%d decisions failed", n)
	}
}
