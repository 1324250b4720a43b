package peersync_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// A graceful stop of an instance's gRPC server does not wait for the
// peers' Sync streams it serves, which never end by themselves: Shutdown
// ends them (found with allot cluster down: every enforcer linked to
// peers took the whole 10s shutdown timeout and was then stopped hard).
func TestShutdownEndsServedStreams(t *testing.T) {
	cfg, err := allot.ParseConfig("peers.yaml", []byte(`
domain: api
regions: [a, b]
limits:
  - {name: global, match: {user: "*"}, rate: 1000/1s, mode: shared, sync_interval: 50ms}
`))
	if err != nil {
		t.Fatal(err)
	}
	ls := map[string]net.Listener{}
	for _, n := range []string{"a", "b"} {
		if ls[n], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	type node struct {
		s   *peersync.Syncer
		gs  *grpc.Server
		reg *prometheus.Registry
	}
	nodes := map[string]*node{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for n, peer := range map[string]string{"a": "b", "b": "a"} {
		reg := prometheus.NewRegistry()
		s, err := peersync.New(peersync.Options{Region: n, Engine: regional.New(cfg, regional.Options{}),
			Peers: map[string]string{peer: ls[peer].Addr().String()}, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		s.Register(gs)
		go gs.Serve(ls[n])
		go func() { s.Run(ctx); s.Close(); done <- struct{}{} }()
		nodes[n] = &node{s: s, gs: gs, reg: reg}
	}
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		for _, n := range nodes {
			n.gs.Stop()
		}
	})
	// b's stream to a is up: a serves it.
	deadline := time.Now().Add(10 * time.Second)
	for gauge(nodes["b"].reg, "allot_peer_connected") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("b never linked to a")
		}
		time.Sleep(5 * time.Millisecond)
	}
	a := nodes["a"]
	a.s.Shutdown()
	stopped := make(chan struct{})
	go func() { a.gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop still waits 5s after Shutdown: the served stream did not end")
	}
}

// gauge is the sum of the series of gauge name in reg.
func gauge(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetGauge().GetValue()
			}
		}
	}
	return v
}
