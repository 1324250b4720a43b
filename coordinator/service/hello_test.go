package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/coordclient"
	"github.com/allot-dev/allot/regional/node"
)

// TestFirstGrantEchoesTheHello: over gRPC, an instance whose reports are
// an hour apart knows its clock from its first grant, which echoes its
// hello (Hello.sent_at): its engine runs with the window guard, set once
// the clock's error is known within half of it, before any report's echo
// could have told it.
func TestFirstGrantEchoesTheHello(t *testing.T) {
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	c := startCoordinator(t, startEtcd(t), cfg)
	e := regional.New(cfg, regional.Options{})
	cl, err := coordclient.New(coordclient.Options{Region: "us-east", Engine: e, Addrs: []string{c.addr}, ReportEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	for start := time.Now(); cl.Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no grant within 10s: %v", cl.Ready())
		}
	}
	if g := e.WindowGuard(); g != node.WindowGuard {
		t.Fatalf("window guard %v after the first grant, want %v: the clock is not known", g, node.WindowGuard)
	}
}
