package server

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
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// t0 is the fixed instant the test services decide at.
var t0 = time.Unix(1_700_000_000, 0)

const testConfig = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5}
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/1m}
  - {name: shadowed, match: {user: "*"}, rate: 1/s, shadow: true}
`

func newTestService(t *testing.T, reg *prometheus.Registry) *Service {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Region: "test", Now: func() time.Time { return t0 }, MaxBatch: 10}
	if reg != nil {
		opts.Registry = reg
	}
	return New(regional.New(cfg, regional.Options{}), opts)
}

// serveGRPC serves s on a loopback port and returns a client.
func serveGRPC(t *testing.T, s *Service) *grpc.ClientConn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func desc(kv ...string) *allotv1.Descriptor {
	d := &allotv1.Descriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &allotv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(n int64) *int64 { return &n }

func TestGRPCCheck(t *testing.T) {
	s := newTestService(t, nil)
	c := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	ctx := context.Background()
	item := &allotv1.CheckItem{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "42"), desc("tenant", "acme")}}
	resp, err := c.Check(ctx, &allotv1.CheckRequest{Items: []*allotv1.CheckItem{item, item, item, item, item, item}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != 6 {
		t.Fatalf("results: %d", len(resp.Results))
	}
	for i, r := range resp.Results {
		if want := i < 5; r.Allowed != want {
			t.Fatalf("item %d: allowed=%v, want %v", i, r.Allowed, want)
		}
	}
	last := resp.Results[5]
	if last.RetryAfter.AsDuration() != 100*time.Millisecond {
		t.Fatalf("retry after: %v", last.RetryAfter.AsDuration())
	}
	byName := map[string]*allotv1.LimitStatus{}
	for _, l := range last.Limits {
		byName[l.Name] = l
	}
	if u := byName["per-user"]; u == nil || u.Allowed || u.Limit != 10 || u.Remaining != 0 || u.Window.AsDuration() != time.Second || u.DescriptorIndex != 0 {
		t.Fatalf("per-user status: %v", u)
	}
	if tn := byName["per-tenant"]; tn == nil || !tn.Allowed || tn.Remaining != 95 || tn.DescriptorIndex != 1 {
		t.Fatalf("per-tenant status (5 charged, the 6th rejected): %v", tn)
	}
	if sh := byName["shadowed"]; sh == nil || !sh.Shadow || sh.Allowed {
		t.Fatalf("shadow status: %v", sh)
	}
	// hits 0 checks without charging.
	zero := &allotv1.CheckItem{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("tenant", "acme")}, Hits: hits(0)}
	resp, err = c.Check(ctx, &allotv1.CheckRequest{Items: []*allotv1.CheckItem{zero, zero}})
	if err != nil || resp.Results[1].Limits[0].Remaining != 95 {
		t.Fatalf("hits 0: %v %v", resp, err)
	}
}

func TestGRPCBadInputChargesNothing(t *testing.T) {
	s := newTestService(t, nil)
	c := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	ctx := context.Background()
	ok := &allotv1.CheckItem{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "1")}}
	many := make([]*allotv1.CheckItem, 11)
	for i := range many {
		many[i] = ok
	}
	cases := []struct {
		name  string
		items []*allotv1.CheckItem
		code  codes.Code
	}{
		{"no items", nil, codes.InvalidArgument},
		{"unknown domain", []*allotv1.CheckItem{ok, {Domain: "nope", Descriptors: []*allotv1.Descriptor{desc("user", "1")}}}, codes.NotFound},
		{"empty domain", []*allotv1.CheckItem{ok, {Descriptors: []*allotv1.Descriptor{desc("user", "1")}}}, codes.InvalidArgument},
		{"no descriptors", []*allotv1.CheckItem{ok, {Domain: "api"}}, codes.InvalidArgument},
		{"empty descriptor", []*allotv1.CheckItem{ok, {Domain: "api", Descriptors: []*allotv1.Descriptor{{}}}}, codes.InvalidArgument},
		{"empty key", []*allotv1.CheckItem{ok, {Domain: "api", Descriptors: []*allotv1.Descriptor{desc("", "x")}}}, codes.InvalidArgument},
		{"negative hits", []*allotv1.CheckItem{ok, {Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "1")}, Hits: hits(-1)}}, codes.InvalidArgument},
		{"huge hits", []*allotv1.CheckItem{ok, {Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "1")}, Hits: hits(1 << 62)}}, codes.InvalidArgument},
		{"hits above burst", []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "1")}, Hits: hits(6)}}, codes.InvalidArgument},
		{"oversized batch", many, codes.InvalidArgument},
	}
	for _, tc := range cases {
		_, err := c.Check(ctx, &allotv1.CheckRequest{Items: tc.items})
		if status.Code(err) != tc.code {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.code)
		}
	}
	if n := s.Engine().Stats().Keys; n != 0 {
		t.Fatalf("refused requests created %d keys", n)
	}
}
