package server

import (
	"context"
	"math"
	"strconv"
	"testing"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// sixthConfig is a split-mode limit over six regions, and one in shared
// mode.
const sixthConfig = `
domain: api
regions: [us-east, eu-west, ap-south, us-west, eu-north, sa-east]
limits:
  - {name: per-user, match: {user: "*"}, rate: 60/1m, burst: 40}
  - {name: g, match: {org: "*"}, rate: 100/1m, mode: shared}
`

// TestGRPCCheckSaysTheQuota: a Check answer tells what the headers need
// of a split-mode key with a sixth of the limit here: the region's quota
// (⌊burst ÷ 6⌋, not the global limit), its refill time and the region as
// the partition; and the remaining it reports never promises a request
// the next check to this instance rejects.
func TestGRPCCheckSaysTheQuota(t *testing.T) {
	c := &clock{t: t0}
	conf, err := allot.ParseConfig("t.yaml", []byte(sixthConfig))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(conf, regional.Options{})
	if err := e.SetShare(c.now(), "api", "per-user", 1.0/6); err != nil {
		t.Fatal(err)
	}
	if err := e.SetPeers("us-east", []string{"eu-west"}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetShare(c.now(), "api", "g", 0.5); err != nil {
		t.Fatal(err)
	}
	rl := allotv1.NewRateLimiterClient(serveGRPC(t, New(e, Options{Region: "us-east", Now: c.now})))
	check := func(kv ...string) *allotv1.LimitStatus {
		t.Helper()
		resp, err := rl.Check(context.Background(), &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{desc(kv...)}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Results[0].Limits[0]
	}

	quota := int64(math.Floor(40.0 / 6)) // 6
	promised := -1                       // the last call that must pass
	for i := range 10 {
		st := check("user", "1")
		if st.Limit != 60 || st.Quota != quota || st.Partition != "us-east" || st.QuotaWindow.AsDuration() != 40*1e9 {
			t.Fatalf("call %d: limit %d quota %d window %v partition %q; want 60, %d, 40s, us-east", i, st.Limit, st.Quota, st.QuotaWindow.AsDuration(), st.Partition, quota)
		}
		if i <= promised && !st.Allowed {
			t.Fatalf("call %d rejected; an earlier answer promised calls up to %d", i, promised)
		}
		if int64(i) < quota != st.Allowed {
			t.Fatalf("call %d: allowed %v; a quota of %d admits %d at once", i, st.Allowed, quota, quota)
		}
		if st.Remaining > st.Quota {
			t.Fatalf("call %d: remaining %d above the quota %d", i, st.Remaining, st.Quota)
		}
		promised = max(promised, i+int(st.Remaining))
	}

	// A shared limit in sync with its peer decides on the whole limit:
	// the quota is the whole limit's, with no partition.
	e.Heard(c.now(), "eu-west")
	if st := check("org", "o"); st.Quota != 100 || st.Partition != "" || st.Remaining != 99 {
		t.Errorf("shared in sync: quota %d partition %q remaining %d, want 100, none, 99", st.Quota, st.Partition, st.Remaining)
	}
}

// TestLeaseAnswerSaysTheQuota: a Lease grant's limits carry the quota and
// partition too, for the decisions a gateway makes from its lease.
func TestLeaseAnswerSaysTheQuota(t *testing.T) {
	c := &clock{t: t0}
	conf, err := allot.ParseConfig("t.yaml", []byte(sixthConfig))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(conf, regional.Options{})
	if err := e.SetShare(c.now(), "api", "per-user", 1.0/6); err != nil {
		t.Fatal(err)
	}
	rl := allotv1.NewRateLimiterClient(serveGRPC(t, New(e, Options{Region: "us-east", Now: c.now})))
	for _, want := range []int64{0, 2} {
		resp, err := rl.Lease(context.Background(), &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{wireLease(want, 0, 0, "user", "1")}})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Grants[0].Limits[0]
		if st.Quota != 6 || st.Partition != "us-east" || st.QuotaWindow.AsDuration() != 40*1e9 {
			t.Errorf("want %d: quota %d window %v partition %q; want 6, 40s, us-east", want, st.Quota, st.QuotaWindow.AsDuration(), st.Partition)
		}
	}
}

// BenchmarkCheckInProcess measures what allot.v1.RateLimiter/Check does
// besides the network (BenchmarkGRPCCheck's cost less gRPC's): decode,
// check and the answer, with the statuses' quotas, on the example limits,
// one item per call over 10,000 keys.
func BenchmarkCheckInProcess(b *testing.B) {
	cfg, err := allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	if err != nil {
		b.Fatal(err)
	}
	rl := rateLimiter{s: New(regional.New(cfg, regional.Options{}), Options{Region: "bench"})}
	user := &allotv1.Entry{Key: "user"}
	req := &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{
		Domain:      "api",
		Descriptors: []*allotv1.Descriptor{{Entries: []*allotv1.Entry{user}}},
	}}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		user.Value = strconv.Itoa(i % 10_000)
		if _, err := rl.Check(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}
