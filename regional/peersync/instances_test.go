package peersync_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// TestInstancesOverGRPC: region a runs two instances that share a
// CountStore; region b dials only the first (as a load balancer would
// pick one). b sees a's slot as the sum of both instances, and the
// second instance of a, which b never sends to, learns b's count
// through the store.
func TestInstancesOverGRPC(t *testing.T) {
	cfg, err := allot.ParseConfig("peers.yaml", []byte(sharedYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Domains[0].Regions = []string{"a", "b"}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	la1, la2, lb := listen(), listen(), listen()
	var counts regional.MemoryCounts
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	start := func(region, instance string, l net.Listener, peers map[string]string, store regional.CountStore) *regional.Engine {
		e := regional.New(cfg, regional.Options{})
		s, err := peersync.New(peersync.Options{Region: region, Instance: instance, Engine: e, Peers: peers, Counts: store})
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		s.Register(gs)
		go gs.Serve(l)
		t.Cleanup(func() { gs.Stop(); s.Close() })
		wg.Go(func() { s.Run(ctx) })
		return e
	}
	a1 := start("a", "a1", la1, map[string]string{"b": lb.Addr().String()}, &counts)
	a2 := start("a", "a2", la2, map[string]string{"b": lb.Addr().String()}, &counts)
	b := start("b", "b1", lb, map[string]string{"a": la1.Addr().String()}, nil)

	user := allot.Descriptor{{Key: "user", Value: "1"}}
	waitFor(t, 5*time.Second, "peers heard", func() bool {
		for _, e := range []*regional.Engine{a1, a2, b} {
			if e.SyncStats()[0].Fallback {
				return false
			}
		}
		return true
	})
	// Start at the beginning of a window, so that all of it counts in one.
	for time.Now().UnixMilli()%400 > 100 {
		time.Sleep(5 * time.Millisecond)
	}
	now := time.Now()
	w, _ := b.Window("api", "global", now)
	var dec allot.Decision
	charge := func(e *regional.Engine, n int) {
		for range n {
			if err := e.Check(now, "api", user, 1, &dec); err != nil || !dec.Allowed {
				t.Fatalf("check: %v %+v", err, dec)
			}
		}
	}
	charge(a1, 100)
	charge(a2, 50)
	charge(b, 30)
	waitFor(t, 300*time.Millisecond, "b sees a's slot as the sum of its instances", func() bool {
		v, err := b.SharedView("api", "global", "global:user=1", w)
		return err == nil && v["a"] == 150
	})
	waitFor(t, 300*time.Millisecond, "a2 learns b's count through the store", func() bool {
		a2.Check(time.Now(), "api", user, 0, &dec) // a check refreshes the key from the store
		v, err := a2.SharedView("api", "global", "global:user=1", w)
		return err == nil && v["b"] == 30 && v["a"] == 150
	})
}
