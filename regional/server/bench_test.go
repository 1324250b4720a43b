package server

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// BenchmarkGRPCCheck measures allot.v1.RateLimiter/Check end to end over
// loopback: a real gRPC server on the example limits and the wall clock,
// parallel clients on a few shared connections, one item per call,
// descriptor user=<n> over 10,000 keys. The client's cost is counted too,
// on the same cores, as it is in a gateway's sidecar.
func BenchmarkGRPCCheck(b *testing.B) {
	const (
		keys  = 10_000
		conns = 4
	)
	cfg, err := allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	if err != nil {
		b.Fatal(err)
	}
	svc := New(regional.New(cfg, regional.Options{}), Options{Region: "bench"})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(l)
	b.Cleanup(gs.Stop)
	clients := make([]allotv1.RateLimiterClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients[i] = allotv1.NewRateLimiterClient(cc)
	}

	var worker atomic.Uint64
	b.SetParallelism(32) // 32 × GOMAXPROCS calls in flight keep the server busy
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := worker.Add(1)
		client := clients[id%conns]
		rng := rand.New(rand.NewPCG(id, 0))
		user := &allotv1.Entry{Key: "user"}
		req := &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{
			Domain:      "api",
			Descriptors: []*allotv1.Descriptor{{Entries: []*allotv1.Entry{user}}},
		}}}
		for pb.Next() {
			user.Value = strconv.Itoa(rng.IntN(keys))
			if _, err := client.Check(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}
