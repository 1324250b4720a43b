package tlsx_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/crdt"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// The cost of TLS on cross-region sync (docs/security.md, "The cost of
// TLS"): region a's real Peer API (peersync) on a loopback gRPC server,
// called as region b, in plain text and over mutual TLS as allot regional
// serves it (tls.VerifyClientCertIfGiven, RequireClientCert for Peer,
// certificates of ECDSA P-256). Client and server share the machine's
// cores, as two regions' enforcers do not.
//
//	go test -run '^$' -bench 'Peer' -benchtime 3s -count 3 ./internal/tlsx/

// peerBenchYAML: a shared limit whose counts b sends, and a split one
// whose allowance a lends; windows of an hour, so that a run shares one.
const peerBenchYAML = `
domain: api
regions: [a, b]
limits:
  - {name: global, match: {user: "*"}, rate: 1000000000/1h, mode: shared, algorithm: sliding_window, sync_interval: 1s}
  - {name: split, match: {tenant: "*"}, rate: 1000000000/1h}
`

// peerBench is region a serving Peer, and a client of it as region b.
type peerBench struct {
	client allotv1.PeerClient
	addr   string
	dial   grpc.DialOption // b's transport
}

func startPeerBench(b *testing.B, mutual bool) *peerBench {
	b.Helper()
	cfg, err := allot.ParseConfig("bench.yaml", []byte(peerBenchYAML))
	if err != nil {
		b.Fatal(err)
	}
	engine := regional.New(cfg, regional.Options{})
	if err := engine.SetShare(time.Now(), "api", "split", 1); err != nil {
		b.Fatal(err)
	}
	s, err := peersync.New(peersync.Options{Region: "a", Instance: "a1", Engine: engine,
		Peers: map[string]string{"b": "127.0.0.1:1"}, Heartbeat: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	var opts []grpc.ServerOption
	pb := &peerBench{dial: grpc.WithTransportCredentials(insecure.NewCredentials())}
	if mutual {
		pki := testpki.New(b)
		srv, err := tlsx.NewSource(tlsx.Files(pki.Issue(b, "a", testpki.Leaf{IPs: testpki.Loopback,
			URIs: []string{"spiffe://allot/region/a/instance/a1"}})), tlsx.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if opts, err = srv.ServerOptions(tls.VerifyClientCertIfGiven); err != nil {
			b.Fatal(err)
		}
		opts = append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)
		cli, err := tlsx.NewSource(tlsx.Files(pki.Issue(b, "b", testpki.Leaf{URIs: []string{"spiffe://allot/region/b/instance/b1"}})), tlsx.Options{})
		if err != nil {
			b.Fatal(err)
		}
		pb.dial = cli.DialOption("")
	}
	gs := grpc.NewServer(opts...)
	s.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go gs.Serve(l)
	b.Cleanup(func() { gs.Stop(); s.Close() })
	pb.addr = l.Addr().String()
	cc, err := grpc.NewClient(pb.addr, pb.dial)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	pb.client = allotv1.NewPeerClient(cc)
	return pb
}

// transports are the two sides of every benchmark.
var transports = []struct {
	name   string
	mutual bool
}{{"plain", false}, {"mtls", true}}

// reportP99 reports the 99th percentile of ds as p99-µs.
func reportP99(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkPeerSync: one Sync stream from b to a, as a sync tick sends
// it: each op is a message of a batch of 100 deltas (100 users' counts of
// b in the shared limit), and a's answer to it (a second batch, of a limit
// a does not know, makes a reply: a rejection), so an op is a whole round
// trip through a's decoding and merging. p99-µs is the 99th percentile of
// the ops' round trips.
func BenchmarkPeerSync(b *testing.B) {
	const keys = 100
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			pb := startPeerBench(b, tr.mutual)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := pb.client.Sync(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Send(&allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b", Instance: "b1"}}); err != nil {
				b.Fatal(err)
			}
			if m, err := st.Recv(); err != nil || m.GetHello() == nil {
				b.Fatalf("a's hello: %v, %v", m, err)
			}
			w := uint64(time.Now().UnixNano() / int64(time.Hour))
			unknown := &allotv1.DeltaBatch{Domain: "api", Limit: "no-such-limit", Full: true, Seq: 1,
				Deltas: crdt.AppendBatch(nil, []crdt.Delta{{Key: "user=0", Window: w, Origin: "b", Seq: 1, Value: 1}})}
			ds := make([]crdt.Delta, keys)
			var size int
			rtts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				for k := range ds {
					ds[k] = crdt.Delta{Key: fmt.Sprintf("user=%d", k), Window: w, Origin: "b", Seq: uint64(i + 1), Value: uint64(i + 1)}
				}
				m := &allotv1.SyncMessage{SentUnixNano: time.Now().UnixNano(), Batches: []*allotv1.DeltaBatch{
					{Domain: "api", Limit: "global", Full: i == 0, Seq: uint64(i + 1), Deltas: crdt.AppendBatch(nil, ds)}, unknown}}
				size = len(m.Batches[0].Deltas)
				start := time.Now()
				if err := st.Send(m); err != nil {
					b.Fatal(err)
				}
				reply, err := st.Recv()
				if err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(start))
				if len(reply.GetRejections()) == 0 {
					b.Fatalf("op %d: a answered %v, want a rejection of no-such-limit", i, reply)
				}
			}
			b.StopTimer()
			b.SetBytes(int64(size))
			reportP99(b, rtts)
		})
	}
}

// BenchmarkPeerLend: b's loan asks to a (unary Lend calls on one
// connection), each a round trip: what a key short of allowance waits
// for.
func BenchmarkPeerLend(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			pb := startPeerBench(b, tr.mutual)
			ctx := context.Background()
			w := uint64(time.Now().UnixNano() / int64(time.Hour))
			rtts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				resp, err := pb.client.Lend(ctx, &allotv1.LendRequest{Region: "b", Domain: "api", Limit: "split",
					Key: fmt.Sprintf("split:tenant=%d", i%1000), Window: w, Amount: 1, LoanId: uint64(i + 1)})
				if err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(start))
				if resp.GetGranted() != 1 {
					b.Fatalf("loan %d: %v, want 1 granted", i, resp)
				}
			}
			b.StopTimer()
			reportP99(b, rtts)
		})
	}
}

// BenchmarkPeerConnect: b connects to a anew and opens its Sync stream
// (a TCP connection, with TLS its handshake and the verification of both
// certificates, then the hellos): what a peer pays after a partition or
// a restart, per peer and instance.
func BenchmarkPeerConnect(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			pb := startPeerBench(b, tr.mutual)
			rtts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				cc, err := grpc.NewClient(pb.addr, pb.dial)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				st, err := allotv1.NewPeerClient(cc).Sync(ctx)
				if err == nil {
					err = st.Send(&allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b", Instance: "b1"}})
				}
				if err == nil {
					_, err = st.Recv()
				}
				rtts = append(rtts, time.Since(start))
				cancel()
				cc.Close()
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportP99(b, rtts)
		})
	}
}
