package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

const leaseConfig = `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/s}
  - {name: window, match: {win: "*"}, rate: 100/s, algorithm: sliding_window}
  - {name: login, match: {login: "*"}, rate: 5/m, enforcement: exact, on_failure: closed}
`

// leaseService serves leaseConfig at the instant *at.
func leaseService(t *testing.T, at *time.Time) allotv1.RateLimiterClient {
	t.Helper()
	cfg, err := allot.ParseConfig("lease.yaml", []byte(leaseConfig))
	if err != nil {
		t.Fatal(err)
	}
	s := New(regional.New(cfg, regional.Options{}), Options{Region: "r", Now: func() time.Time { return *at }})
	return allotv1.NewRateLimiterClient(serveGRPC(t, s))
}

func wireLease(want, returned int64, grantedAt int64, kv ...string) *allotv1.LeaseItem {
	return &allotv1.LeaseItem{Domain: "api", Descriptors: []*allotv1.Descriptor{desc(kv...)}, Want: want, Returned: returned, ReturnedGrantedAtUnixNano: grantedAt}
}

func remaining(t *testing.T, c allotv1.RateLimiterClient, kv ...string) int64 {
	t.Helper()
	resp, err := c.Check(context.Background(), &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{desc(kv...)}, Hits: hits(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Results[0].Limits[0].Remaining
}

func TestLeaseGrantsAreCharged(t *testing.T) {
	at := t0
	c := leaseService(t, &at)
	ctx := context.Background()
	resp, err := c.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g1", Items: []*allotv1.LeaseItem{wireLease(30, 0, 0, "user", "a")}})
	if err != nil {
		t.Fatal(err)
	}
	g := resp.Grants[0]
	if g.Granted != 30 || g.CheckEach || resp.Gateways != 1 || resp.Ttl.AsDuration() != DefaultLeaseTTL {
		t.Fatalf("grant %v gateways %d ttl %v", g, resp.Gateways, resp.Ttl.AsDuration())
	}
	if got := remaining(t, c, "user", "a"); got != 70 {
		t.Fatalf("remaining after a 30-token grant = %d, want 70", got)
	}
	if len(g.Fallback) != 1 || g.Fallback[0].OnFailure != "local" || g.Fallback[0].RegionAmount != 100 {
		t.Fatalf("fallback %v", g.Fallback)
	}
	// A second gateway asking for everything gets half of what is left.
	resp, err = c.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g2", Items: []*allotv1.LeaseItem{wireLease(1000, 0, 0, "user", "a")}})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.Grants[0]; g.Granted != 35 || resp.Gateways != 2 {
		t.Fatalf("second grant %v, gateways %d", g, resp.Gateways)
	}
	// g1 returns 10 unused tokens of its lease: they are refunded.
	resp, err = c.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g1", Items: []*allotv1.LeaseItem{wireLease(0, 10, at.UnixNano(), "user", "a")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Grants[0].Granted != 0 {
		t.Fatalf("want 0 granted %d", resp.Grants[0].Granted)
	}
	if got := remaining(t, c, "user", "a"); got != 45 {
		t.Fatalf("remaining after returning 10 = %d, want 45", got)
	}
	// Leaving stops the count.
	resp, err = c.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g2", Leaving: true})
	if err != nil || resp.Gateways != 1 {
		t.Fatalf("leaving: %v gateways %d", err, resp.GetGateways())
	}
	// Gateways not heard within the TTL are no longer counted.
	at = at.Add(2 * DefaultLeaseTTL)
	resp, err = c.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g3"})
	if err != nil || resp.Gateways != 1 {
		t.Fatalf("after TTL: %v gateways %d", err, resp.GetGateways())
	}
}

func TestLeaseGrantsNeverExceedTheAllowance(t *testing.T) {
	at := t0
	c := leaseService(t, &at)
	var total int64
	for i := range 50 {
		resp, err := c.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: string(rune('a' + i%26)), Items: []*allotv1.LeaseItem{wireLease(40, 0, 0, "user", "hot")}})
		if err != nil {
			t.Fatal(err)
		}
		total += resp.Grants[0].Granted
	}
	if total != 100 {
		t.Fatalf("granted %d in total at one instant, want exactly the burst 100", total)
	}
}

func TestLeaseReturnIntoAnotherWindowIsDropped(t *testing.T) {
	at := t0.Add(900 * time.Millisecond)
	c := leaseService(t, &at)
	resp, err := c.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{wireLease(40, 0, 0, "win", "w")}})
	if err != nil || resp.Grants[0].Granted != 40 {
		t.Fatalf("grant: %v %v", err, resp)
	}
	grantedAt := resp.Grants[0].GrantedAtUnixNano
	at = at.Add(200 * time.Millisecond) // the next one-second window
	before := remaining(t, c, "win", "w")
	if _, err := c.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{wireLease(0, 40, grantedAt, "win", "w")}}); err != nil {
		t.Fatal(err)
	}
	if after := remaining(t, c, "win", "w"); after != before {
		t.Fatalf("a return into the next window changed remaining %d → %d", before, after)
	}
}

func TestLeaseExactAndUnmatched(t *testing.T) {
	at := t0
	c := leaseService(t, &at)
	resp, err := c.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{
		wireLease(10, 0, 0, "login", "x"),
		wireLease(10, 0, 0, "nothing", "matches"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.Grants[0]; !g.CheckEach || g.Granted != 0 || g.Fallback[0].OnFailure != "closed" {
		t.Fatalf("exact limit: %v", g)
	}
	if g := resp.Grants[1]; g.CheckEach || g.Granted != 10 || len(g.Limits) != 0 {
		t.Fatalf("unmatched: %v", g)
	}
}

func TestLeaseBadInputChargesNothing(t *testing.T) {
	at := t0
	c := leaseService(t, &at)
	good := wireLease(10, 0, 0, "user", "b")
	for name, tc := range map[string]struct {
		item *allotv1.LeaseItem
		code codes.Code
	}{
		"negative want":          {wireLease(-1, 0, 0, "user", "b"), codes.InvalidArgument},
		"huge want":              {wireLease(allot.MaxAmount+1, 0, 0, "user", "b"), codes.InvalidArgument},
		"negative return":        {wireLease(0, -5, t0.UnixNano(), "user", "b"), codes.InvalidArgument},
		"return without instant": {wireLease(0, 5, 0, "user", "b"), codes.InvalidArgument},
		"unknown domain":         {&allotv1.LeaseItem{Domain: "nope", Descriptors: []*allotv1.Descriptor{desc("user", "b")}, Want: 1}, codes.NotFound},
		"no descriptors":         {&allotv1.LeaseItem{Domain: "api", Want: 1}, codes.InvalidArgument},
		"empty descriptor":       {&allotv1.LeaseItem{Domain: "api", Descriptors: []*allotv1.Descriptor{{}}, Want: 1}, codes.InvalidArgument},
	} {
		_, err := c.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{good, tc.item}})
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", name, err, tc.code)
		}
	}
	if got := remaining(t, c, "user", "b"); got != 100 {
		t.Fatalf("refused calls charged: remaining %d", got)
	}
}
