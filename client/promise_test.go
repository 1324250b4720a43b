package client_test

import (
	"context"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// TestLeasedRemainingIsAdmitted: a Decision's Remaining from a leased key
// promises the next requests of this gateway when no other traffic
// reaches the key, whichever of a Check answer and a grant in flight
// arrives first. The enforcer's clock stands still (nothing refills) and
// its answers are delayed at random, so that the sync loop's grants and
// returns cross the Checks the gateway sends once its grants are spent.
func TestLeasedRemainingIsAdmitted(t *testing.T) {
	cfg, err := allot.ParseConfig("promise.yaml", []byte(`
domain: api
regions: [us-east, eu-west]
limits:
  - {name: per-user, match: {user: "*"}, rate: 600/1m, burst: 400}
`))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0)
	eng := regional.New(cfg, regional.Options{})
	if err := eng.SetShare(at, "api", "per-user", 0.5); err != nil {
		t.Fatal(err)
	}
	svc := server.New(eng, server.Options{Region: "us-east", Now: func() time.Time { return at }})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	delay := make(chan time.Duration, 1)
	delay <- 0
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		d := <-delay
		delay <- time.Duration(rng.IntN(3000)) * time.Microsecond
		time.Sleep(d)
		return resp, err
	}))
	svc.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)

	c, err := client.New(client.Config{Addrs: []string{l.Addr().String()}, SyncInterval: 2 * time.Millisecond, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ds := one("user", "42")
	promised, admitted, leased := -1, 0, 0
	for i := 0; i < 400; i++ {
		d := c.Allow(context.Background(), "api", ds, 1)
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		if i <= promised && !d.Allowed {
			t.Fatalf("request %d rejected (%s), but an earlier answer promised requests up to %d; %d admitted", i, d.Source, promised, admitted)
		}
		if d.Allowed {
			admitted++
		}
		if d.Source == client.SourceLease {
			leased++
		}
		promised = max(promised, i+int(d.Remaining))
		if i%8 == 0 {
			time.Sleep(time.Millisecond) // let grants and returns go by
		}
	}
	if admitted > 200 || leased == 0 {
		t.Errorf("%d admitted on a quota of 200 that does not refill, %d from leases", admitted, leased)
	}
}
