package peersync_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/crdt"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// identityYAML has windows of an hour, so that a test's instants share one.
const identityYAML = `
domain: api
regions: [a, b, c]
limits:
  - {name: global, match: {user: "*"}, rate: 400/1h, mode: shared, algorithm: sliding_window, sync_interval: 50ms}
  - {name: split, match: {tenant: "*"}, rate: 100/1h}
`

// tlsRegion is region a's Peer API served over TLS as allot regional
// serves it (client certificates verified when given, required for Peer),
// with peers b and c (not running).
type tlsRegion struct {
	pki    *testpki.PKI
	addr   string
	engine *regional.Engine
	reg    *prometheus.Registry
}

func startTLSRegion(t *testing.T) *tlsRegion {
	t.Helper()
	cfg, err := allot.ParseConfig("identity.yaml", []byte(identityYAML))
	if err != nil {
		t.Fatal(err)
	}
	r := &tlsRegion{pki: testpki.New(t), engine: regional.New(cfg, regional.Options{}), reg: prometheus.NewRegistry()}
	if err := r.engine.SetShare(time.Now(), "api", "split", 1); err != nil {
		t.Fatal(err)
	}
	s, err := peersync.New(peersync.Options{Region: "a", Instance: "a1", Engine: r.engine,
		Peers: map[string]string{"b": "127.0.0.1:1", "c": "127.0.0.1:1"}, Registry: r.reg})
	if err != nil {
		t.Fatal(err)
	}
	src, err := tlsx.NewSource(tlsx.Files(r.pki.Issue(t, "a", testpki.Leaf{IPs: testpki.Loopback,
		URIs: []string{"spiffe://allot/region/a/instance/a1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.VerifyClientCertIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)...)
	s.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(func() { gs.Stop(); s.Close() })
	r.addr = l.Addr().String()
	return r
}

// client dials a's Peer API with a certificate naming uri.
func (r *tlsRegion) client(t *testing.T, name, uri string) allotv1.PeerClient {
	t.Helper()
	src, err := tlsx.NewSource(tlsx.Files(r.pki.Issue(t, name, testpki.Leaf{URIs: []string{uri}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(r.addr, src.DialOption(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return allotv1.NewPeerClient(cc)
}

// syncHello opens a Sync stream, sends first and returns the status the
// stream ends with, or nil once the server answers with its hello.
func syncHello(t *testing.T, c allotv1.PeerClient, first *allotv1.SyncMessage) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(first); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		return err
	}
	if m.GetHello().GetRegion() != "a" {
		t.Fatalf("a answered with %v, want its hello", m)
	}
	return nil
}

// remaining charges one hit of tenant to a's split limit and returns
// what a still admits for it.
func (r *tlsRegion) remaining(t *testing.T, tenant string) int64 {
	t.Helper()
	var dec allot.Decision
	if err := r.engine.Check(time.Now(), "api", allot.Descriptor{{Key: "tenant", Value: tenant}}, 1, &dec); err != nil {
		t.Fatal(err)
	}
	for _, st := range dec.Statuses {
		if st.Name == "split" {
			return st.Remaining
		}
	}
	t.Fatalf("no status of split in %+v", dec)
	return 0
}

// TestSyncIdentity: over TLS, a Sync stream speaks for the region (and
// the instance) its certificate names: a hello that names another region
// or instance, or a certificate of no region, is refused with
// PERMISSION_DENIED and counted, and nothing of the stream is merged.
func TestSyncIdentity(t *testing.T) {
	r := startTLSRegion(t)
	b := r.client(t, "b", "spiffe://allot/region/b/instance/b1")
	w := uint64(time.Now().UnixNano() / int64(time.Hour))
	// b's certificate, a hello of c carrying c's count of user 42: were
	// it taken, a would reject user 42 for the rest of the window.
	forged := &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "c", Instance: "b1"},
		Batches: []*allotv1.DeltaBatch{{Domain: "api", Limit: "global", Full: true, Seq: 1,
			Deltas: crdtBatch(t, "user=42", w, "c", 400)}}}
	refused := []struct {
		name   string
		client allotv1.PeerClient
		first  *allotv1.SyncMessage
	}{
		{"another region", b, forged},
		{"another instance", b, &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b", Instance: "b2"}}},
		{"an operator", r.client(t, "alice", "spiffe://allot/operator/alice"), &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b"}}},
		{"a gateway of b", r.client(t, "gw", "spiffe://allot/region/b/gateway/gw1"), &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b"}}},
		{"a coordinator", r.client(t, "coord", "spiffe://allot/coordinator/c1"), &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b"}}},
		{"no identity", r.client(t, "anon", "https://example.com/not-spiffe"), &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: "b"}}},
	}
	for _, c := range refused {
		if err := syncHello(t, c.client, c.first); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: got %v, want PermissionDenied", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	if at := r.engine.LastHeard("api", "global")["c"]; !at.IsZero() {
		t.Errorf("a heard from c at %v: the forged stream was taken", at)
	}
	var dec allot.Decision
	if err := r.engine.Check(time.Now(), "api", allot.Descriptor{{Key: "user", Value: "42"}}, 1, &dec); err != nil {
		t.Fatal(err)
	}
	if !dec.Allowed {
		t.Errorf("user 42 rejected after a forged Sync: %+v", dec)
	}
	// b's own hello, with or without its instance, is taken.
	for _, h := range []*allotv1.SyncHello{{Region: "b", Instance: "b1"}, {Region: "b"}} {
		if err := syncHello(t, b, &allotv1.SyncMessage{Hello: h}); err != nil {
			t.Errorf("b's hello %v: %v", h, err)
		}
	}
	if got := rejections(t, r.reg)["identity"]; got != float64(len(refused)) {
		t.Errorf("identity rejections: %v, want %d (all: %v)", got, len(refused), rejections(t, r.reg))
	}
}

// TestLendIdentity: over TLS, a loan is asked by the region the caller's
// certificate names: a Lend naming another region is refused with
// PERMISSION_DENIED, counted, and takes nothing from the key.
func TestLendIdentity(t *testing.T) {
	r := startTLSRegion(t)
	b := r.client(t, "b", "spiffe://allot/region/b/instance/b1")
	alice := r.client(t, "alice", "spiffe://allot/operator/alice")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := uint64(time.Now().UnixNano() / int64(time.Hour))
	before := r.remaining(t, "x")
	for i := range 7 {
		req := &allotv1.LendRequest{Region: "c", Domain: "api", Limit: "split", Key: "split:tenant=x", Window: w, Amount: 100, LoanId: uint64(i + 1)}
		if resp, err := b.Lend(ctx, req); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("forged Lend %d (b's certificate, region c): got %v, %v; want PermissionDenied", i, resp, err)
		}
	}
	req := &allotv1.LendRequest{Region: "b", Domain: "api", Limit: "split", Key: "split:tenant=x", Window: w, Amount: 100, LoanId: 100}
	if resp, err := alice.Lend(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Lend with an operator's certificate: got %v, %v; want PermissionDenied", resp, err)
	}
	if after := r.remaining(t, "x"); after != before-1 {
		t.Fatalf("tenant x: %d remaining after the forged Lend calls, want %d (one more hit)", after, before-1)
	}
	if st := r.engine.SyncStats(); len(st) > 0 {
		for _, s := range st {
			if s.LoansMade != 0 || s.Lent != 0 {
				t.Errorf("%s: lent %d in %d loans to forged asks", s.Limit, s.Lent, s.LoansMade)
			}
		}
	}
	if got := rejections(t, r.reg)["identity"]; got != 8 {
		t.Errorf("identity rejections: %v, want 8", got)
	}
	// b's own ask is served.
	req = &allotv1.LendRequest{Region: "b", Domain: "api", Limit: "split", Key: "split:tenant=x", Window: w, Amount: 10, LoanId: 200}
	resp, err := b.Lend(ctx, req)
	if err != nil || resp.GetGranted() != 10 {
		t.Fatalf("b's own Lend: %v, %v; want 10 granted", resp, err)
	}
	t.Logf("b's own Lend: %v", resp)
}

// crdtBatch encodes one delta: origin's count of key in window w.
func crdtBatch(t *testing.T, key string, w uint64, origin string, v uint64) []byte {
	t.Helper()
	return crdt.AppendBatch(nil, []crdt.Delta{{Key: key, Window: w, Origin: origin, Seq: 1, Value: v}})
}
