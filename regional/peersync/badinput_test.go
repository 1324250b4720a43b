package peersync_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/crdt"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// startOne serves region a's Peer API with peers b and c (not running).
func startOne(t *testing.T, cfgText string) (allotv1.PeerClient, *prometheus.Registry) {
	t.Helper()
	cfg, err := allot.ParseConfig("peers.yaml", []byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := peersync.New(peersync.Options{Region: "a", Engine: regional.New(cfg, regional.Options{}),
		Peers: map[string]string{"b": "127.0.0.1:1", "c": "127.0.0.1:1"}, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	go gs.Serve(l)
	t.Cleanup(func() { gs.Stop(); s.Close() })
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return allotv1.NewPeerClient(cc), reg
}

func rejections(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "allot_peer_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return got
}

const mixedYAML = sharedYAML + `  - {name: split, match: {tenant: "*"}, rate: 100/1s}
`

func hello(region string) *allotv1.SyncHello {
	return &allotv1.SyncHello{Region: region, Instance: "test"}
}

// TestSyncBadInput: what a peer sends wrong is refused with a clear
// status, or a rejection when the stream may go on, and counted.
func TestSyncBadInput(t *testing.T) {
	client, reg := startOne(t, mixedYAML)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := uint64(time.Now().UnixMilli() / 400)
	good := func(origin string) []byte {
		return crdt.AppendBatch(nil, []crdt.Delta{{Key: "user=1", Window: w, Origin: origin, Seq: 1, Value: 3}})
	}
	// Streams that end with a status.
	for _, c := range []struct {
		name string
		msgs []*allotv1.SyncMessage
		code codes.Code
	}{
		{"no hello", []*allotv1.SyncMessage{{SentUnixNano: 1}}, codes.InvalidArgument},
		{"unknown region", []*allotv1.SyncMessage{{Hello: hello("mars")}}, codes.PermissionDenied},
		{"own region", []*allotv1.SyncMessage{{Hello: hello("a")}}, codes.PermissionDenied},
		{"garbage bytes", []*allotv1.SyncMessage{{Hello: hello("b")},
			{Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: []byte("\x01\xff\xff\xff garbage")}}}}, codes.InvalidArgument},
		{"another region's slot", []*allotv1.SyncMessage{{Hello: hello("b"),
			Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: good("c")}}}}, codes.InvalidArgument},
	} {
		st, err := client.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.msgs {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		var got error
		for got == nil {
			_, got = st.Recv()
		}
		if status.Code(got) != c.code {
			t.Errorf("%s: got %v, want %v", c.name, got, c.code)
		} else {
			t.Logf("%s: %v", c.name, got)
		}
	}

	// Batches refused with a rejection; the stream goes on.
	st, err := client.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&allotv1.SyncMessage{Hello: hello("b")}); err != nil {
		t.Fatal(err)
	}
	bad := []*allotv1.DeltaBatch{
		{Domain: "nope", Limit: "global", Deltas: good("b")},
		{Domain: "api", Limit: "nope", Deltas: good("b")},
		{Domain: "api", Limit: "split", Deltas: good("b")},
	}
	if err := st.Send(&allotv1.SyncMessage{Batches: bad}); err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for len(reasons) < len(bad) {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("the stream ended after a refused batch: %v", err)
		}
		for _, rj := range m.GetRejections() {
			reasons[rj.GetReason()] = true
			t.Logf("refused: %s: %s", rj.GetReason(), rj.GetMessage())
		}
	}
	// A good batch on the same stream is taken.
	if err := st.Send(&allotv1.SyncMessage{Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Deltas: good("b"), Full: true, Seq: 1}}}); err != nil {
		t.Fatal(err)
	}

	// Lend.
	for _, c := range []struct {
		req  *allotv1.LendRequest
		code codes.Code
	}{
		{&allotv1.LendRequest{Region: "mars", Domain: "api", Limit: "split", Key: "split:tenant=x", Amount: 1}, codes.PermissionDenied},
		{&allotv1.LendRequest{Region: "b", Domain: "nope", Limit: "split", Key: "split:tenant=x", Amount: 1}, codes.NotFound},
		{&allotv1.LendRequest{Region: "b", Domain: "api", Limit: "global", Key: "global:user=1", Amount: 1}, codes.FailedPrecondition},
		{&allotv1.LendRequest{Region: "b", Domain: "api", Limit: "split", Key: "garbage", Amount: 1}, codes.InvalidArgument},
		{&allotv1.LendRequest{Region: "b", Domain: "api", Limit: "split", Key: "split:tenant=x", Amount: -5}, codes.InvalidArgument},
	} {
		if _, err := client.Lend(ctx, c.req); status.Code(err) != c.code {
			t.Errorf("lend %v: got %v, want %v", c.req, err, c.code)
		}
	}

	want := map[string]float64{"no_hello": 1, "unknown_region": 3, "malformed": 1, "wrong_origin": 1,
		"unknown_domain": 2, "unknown_limit": 1, "not_shared": 1, "not_lendable": 1, "bad_key": 1, "bad_amount": 1}
	var got map[string]float64
	waitFor(t, 5*time.Second, "rejections counted", func() bool {
		got = rejections(t, reg)
		for r, n := range want {
			if got[r] != n {
				return false
			}
		}
		return true
	})
	t.Logf("rejections: %v", got)
}
