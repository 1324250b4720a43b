package service_test

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
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/service"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func TestConnectBadInput(t *testing.T) {
	cfg, err := allot.ParseConfig("cluster.yaml", []byte(clusterConfig))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startEtcd(t)
	reg := prometheus.NewRegistry()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.New(service.Options{Store: etcdstore.New(etcdClient(t, endpoint), ""), Config: cfg, Advertise: l.Addr().String(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
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
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := allotv1.NewCoordinatorClient(cc)
	hello := func(domain, region string) *allotv1.RegionMessage {
		return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Hello{Hello: &allotv1.Hello{Domain: domain, Region: region}}}
	}
	report := func(region, limit string) *allotv1.RegionMessage {
		return &allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Report{Report: &allotv1.DemandReport{
			Domain: "api", Region: region, At: timestamppb.Now(), Limits: []*allotv1.LimitDemand{{Limit: limit, Admitted: 1}}}}}
	}
	// A stream that opens wrongly ends with a clear status.
	for _, c := range []struct {
		name  string
		first *allotv1.RegionMessage
		code  codes.Code
	}{
		{"report before hello", report("us-east", "global"), codes.InvalidArgument},
		{"unknown domain", hello("nope", "us-east"), codes.NotFound},
		{"unknown region", hello("api", "mars"), codes.InvalidArgument},
	} {
		st, err := client.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(c.first); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != c.code {
			t.Errorf("%s: got %v, want %v", c.name, err, c.code)
		}
	}
	// On an open stream, a bad message is refused, counted, and the
	// stream goes on.
	st, err := client.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hello("api", "us-east")); err != nil {
		t.Fatal(err)
	}
	bad := []*allotv1.RegionMessage{
		report("us-east", "no-such-limit"),
		report("eu-west", "global"), // another region's report on this stream
		{Msg: &allotv1.RegionMessage_Ack{Ack: &allotv1.AssignmentAck{Domain: "api", Region: "us-east", Term: 1 << 40, Version: 1}}},
	}
	for _, m := range bad {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	rejections := 0
	for rejections < len(bad) {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("the stream ended after a bad message: %v", err)
		}
		if rj := m.GetRejection(); rj != nil {
			rejections++
			t.Logf("refused: %s", rj.GetMessage())
		}
	}
	got := map[string]float64{}
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
				if lp.GetName() == "reason" {
					got[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"unknown_region": 1, "unknown_limit": 1, "malformed": 1, "bad_version": 1}
	for reason, n := range want {
		if got[reason] != n {
			t.Errorf("rejections for %s: got %v, want %v (all: %v)", reason, got[reason], n, got)
		}
	}
}
