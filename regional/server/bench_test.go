package server

import (
	"crypto/tls"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// BenchmarkGRPCCheck measures allot.v1.RateLimiter/Check end to end over
// loopback: a real gRPC server on the example limits and the wall clock,
// parallel clients on a few shared connections, one item per call,
// descriptor user=<n> over 10,000 keys. The client's cost is counted too,
// on the same cores, as it is in a gateway's sidecar.
func BenchmarkGRPCCheck(b *testing.B) {
	benchGRPCCheck(b, Options{Region: "bench"}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// BenchmarkGRPCCheckTLS is BenchmarkGRPCCheck in plain text and over TLS
// in one run, each with allot regional's roles (anonymous callers check):
// plain; tls, a gateway without a client certificate (the server asks for
// one and verifies it when given, as allot regional serves); mtls, a
// gateway with one (spiffe://allot/gateway/gw1), whose identity every
// call reads. The connections are made before the timer starts: a
// handshake is not counted (BenchmarkPeerConnect in internal/tlsx is).
func BenchmarkGRPCCheckTLS(b *testing.B) {
	pki := testpki.New(b)
	srv, err := tlsx.NewSource(tlsx.Files(pki.Issue(b, "server", testpki.Leaf{IPs: testpki.Loopback})), tlsx.Options{})
	if err != nil {
		b.Fatal(err)
	}
	tlsOpts, err := srv.ServerOptions(tls.VerifyClientCertIfGiven)
	if err != nil {
		b.Fatal(err)
	}
	tlsOpts = append(tlsOpts, tlsx.RequireClientCert(tlsx.MutualServices...)...)
	anon, err := tlsx.NewSource(tlsx.Files{CA: pki.CAFile}, tlsx.Options{})
	if err != nil {
		b.Fatal(err)
	}
	gw, err := tlsx.NewSource(tlsx.Files(pki.Issue(b, "gw", testpki.Leaf{URIs: []string{"spiffe://allot/gateway/gw1"}})), tlsx.Options{})
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{Region: "bench", Authorization: &tlsx.Policy{Anonymous: tlsx.RoleCheck | tlsx.RoleViewer}}
	b.Run("plain", func(b *testing.B) {
		benchGRPCCheck(b, opts, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	})
	b.Run("tls", func(b *testing.B) { benchGRPCCheck(b, opts, tlsOpts, anon.DialOption("")) })
	b.Run("mtls", func(b *testing.B) { benchGRPCCheck(b, opts, tlsOpts, gw.DialOption("")) })
}

// benchGRPCCheck runs BenchmarkGRPCCheck's load on a server of opts with
// serverOpts, its clients dialling with dial. Besides ns/op it reports
// checks/s and the 99th percentile of a call's latency (p99-µs).
func benchGRPCCheck(b *testing.B, opts Options, serverOpts []grpc.ServerOption, dial grpc.DialOption) {
	const (
		keys  = 10_000
		conns = 4
	)
	cfg, err := allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	if err != nil {
		b.Fatal(err)
	}
	svc := New(regional.New(cfg, regional.Options{}), opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(serverOpts...)
	svc.RegisterGRPC(gs)
	go gs.Serve(l)
	b.Cleanup(gs.Stop)
	clients := make([]allotv1.RateLimiterClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient(l.Addr().String(), dial)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients[i] = allotv1.NewRateLimiterClient(cc)
		if _, err := clients[i].Check(b.Context(), &allotv1.CheckRequest{}); err != nil && status.Code(err) == codes.Unavailable {
			b.Fatal(err) // connected (and handshaken) before the timer starts
		}
	}

	var worker atomic.Uint64
	var mu sync.Mutex
	var lat []time.Duration
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
		var mine []time.Duration
		for pb.Next() {
			user.Value = strconv.Itoa(rng.IntN(keys))
			start := time.Now()
			if _, err := client.Check(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	}
}
