package service_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestConnectIdentity: over mutual TLS, a Connect stream speaks for the
// region and instance its certificate names. A hello that names another
// region or instance (or none, which would claim the region's whole
// share), or a certificate of no enforcer, is refused with
// PERMISSION_DENIED; on an accepted stream, a later message naming
// another region or instance ends it with PERMISSION_DENIED. Each is
// counted (allot_coordinator_rejections_total{reason="identity"}).
func TestConnectIdentity(t *testing.T) {
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	reg := prometheus.NewRegistry()
	pki := testpki.New(t)
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "coordinator", testpki.Leaf{IPs: testpki.Loopback,
		URIs: []string{"spiffe://allot/coordinator/c1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.RequireAndVerifyClientCert) // as allot coordinator serves
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.New(service.Options{Store: etcdstore.New(etcdClient(t, endpoint), ""), Config: cfg, Advertise: l.Addr().String(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
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
	client := func(name, uri string) allotv1.CoordinatorClient {
		s, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, name, testpki.Leaf{URIs: []string{uri}})), tlsx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(l.Addr().String(), s.DialOption(""))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return allotv1.NewCoordinatorClient(cc)
	}
	hello := func(region, instance string) *allotv1.RegionMessage {
		return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Hello{Hello: &allotv1.Hello{Domain: "api", Region: region, Instance: instance}}}
	}
	report := func(region, limit string) *allotv1.RegionMessage {
		return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Report{Report: &allotv1.DemandReport{
			Domain: "api", Region: region, At: timestamppb.Now(), Limits: []*allotv1.LimitDemand{{Limit: limit, Admitted: 1}}}}}
	}
	ack := func(region string) *allotv1.RegionMessage {
		return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Ack{Ack: &allotv1.AssignmentAck{Domain: "api", Region: region, Term: 1, Version: 1}}}
	}
	i1 := client("i1", "spiffe://allot/region/us-east/instance/i1")
	// open sends msgs on a new stream and returns the first answer's
	// error: nil when the server answered (a rejection, an assignment)
	// and the stream is still up.
	// A stream that stays up is given 5s (a test that fails must not hang).
	open := func(c allotv1.CoordinatorClient, msgs ...*allotv1.RegionMessage) (allotv1.Coordinator_ConnectClient, error) {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t.Cleanup(cancel)
		st, err := c.Connect(sctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			// A stream the server already ended answers Send with io.EOF;
			// its status comes from Recv.
			if err := st.Send(m); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		_, err = st.Recv()
		return st, err
	}

	refused := []struct {
		name   string
		client allotv1.CoordinatorClient
		hello  *allotv1.RegionMessage
	}{
		{"another instance", i1, hello("us-east", "i2")},
		{"another region", i1, hello("eu-west", "i1")},
		{"no instance (the region's whole share)", i1, hello("us-east", "")},
		{"an operator", client("alice", "spiffe://allot/operator/alice"), hello("us-east", "i1")},
		{"a gateway of us-east", client("gw", "spiffe://allot/region/us-east/gateway/gw1"), hello("us-east", "")},
	}
	for _, c := range refused {
		// An accepted stream answers the report with a rejection.
		if _, err := open(c.client, c.hello, report(c.hello.GetHello().GetRegion(), "no-such-limit")); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: got %v, want PermissionDenied", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}

	// i1's own stream is accepted (a report of an unknown limit is
	// answered with a rejection, the stream goes on); then an ack or a
	// report naming another region, or a hello naming another instance,
	// ends it.
	later := []struct {
		name string
		msg  *allotv1.RegionMessage
	}{
		{"an ack of another region", ack("eu-west")},
		{"a report of another region", report("eu-west", "global")},
		{"a hello of another instance", hello("us-east", "i2")},
	}
	for _, c := range later {
		st, err := open(i1, hello("us-east", "i1"), report("us-east", "no-such-limit"))
		if err != nil {
			t.Fatalf("i1's own stream: %v", err)
		}
		if err := st.Send(c.msg); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s on i1's stream: got %v, want PermissionDenied", c.name, err)
		} else {
			t.Logf("%s on i1's stream: %v", c.name, err)
		}
	}

	got := 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "allot_coordinator_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == "identity" {
					got += m.GetCounter().GetValue()
				}
			}
		}
	}
	if want := float64(len(refused) + len(later)); got != want {
		t.Errorf("identity rejections: %v, want %v", got, want)
	}
}
