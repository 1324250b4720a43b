package client

import (
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestSetRateLimitHeadersSayTheQuota: the headers' q and X-RateLimit-Limit
// are the decision's quota with its partition, remaining is at most the
// quota, and a decision without a quota falls back to the whole limit.
func TestSetRateLimitHeadersSayTheQuota(t *testing.T) {
	region := func(rem int64, partition string) Decision {
		return Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
			Quota: 5, QuotaWindow: 500 * time.Millisecond, Partition: partition, Remaining: rem, ResetAfter: 200 * time.Millisecond}
	}
	tests := []struct {
		name string
		d    Decision
		want map[string]string
	}{
		{"region's share", region(4, "us-east"), map[string]string{
			"RateLimit-Policy": `"per-user";q=5;w=1;pk=:dXMtZWFzdA==:`, "RateLimit": `"per-user";r=4;t=1;pk=:dXMtZWFzdA==:`,
			"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "1",
		}},
		{"remaining above the quota shows the quota", region(14, "us-east"), map[string]string{
			"RateLimit-Policy": `"per-user";q=5;w=1;pk=:dXMtZWFzdA==:`, "RateLimit": `"per-user";r=5;t=1;pk=:dXMtZWFzdA==:`,
			"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "1",
		}},
		{"whole limit: no partition", Decision{Allowed: true, Limit: "g", Amount: 100, Window: time.Minute,
			Quota: 100, QuotaWindow: time.Minute, Remaining: 99, ResetAfter: time.Second}, map[string]string{
			"RateLimit-Policy": `"g";q=100;w=60`, "RateLimit": `"g";r=99;t=1`,
			"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "99", "X-RateLimit-Reset": "1",
		}},
		{"no quota: the limit", Decision{Allowed: true, Limit: "per-user", Amount: 30, Window: time.Second,
			Partition: "ignored without a quota", Remaining: 14, ResetAfter: time.Second}, map[string]string{
			"RateLimit-Policy": `"per-user";q=30;w=1`, "RateLimit": `"per-user";r=14;t=1`,
			"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "14", "X-RateLimit-Reset": "1",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			SetRateLimitHeaders(h, tt.d)
			checkHeaders(t, h, tt.want)
		})
	}
}

// TestFromResultTakesTheQuota: a Check result's quota, quota window and
// partition reach the Decision, remaining capped at the quota; the limit
// picked is the one the enforcer's headers describe (the least remaining
// as capped); an older enforcer's result, without a quota, gives the
// whole limit.
func TestFromResultTakesTheQuota(t *testing.T) {
	res := &allotv1.CheckResult{Allowed: true, Limits: []*allotv1.LimitStatus{
		{Name: "per-user", Limit: 30, Remaining: 10, Window: durationpb.New(time.Second), Allowed: true,
			Quota: 5, QuotaWindow: durationpb.New(500 * time.Millisecond), Partition: "us-east"},
		{Name: "per-tenant", Limit: 1000, Remaining: 7, Window: durationpb.New(time.Minute), Allowed: true,
			Quota: 333, QuotaWindow: durationpb.New(time.Minute), Partition: "us-east"},
	}}
	d := fromResult(res)
	if d.Limit != "per-user" || d.Amount != 30 || d.Quota != 5 || d.QuotaWindow != 500*time.Millisecond || d.Partition != "us-east" || d.Remaining != 5 {
		t.Errorf("decision %+v; want per-user, amount 30, quota 5 per 500ms in us-east, remaining 5", d)
	}
	old := &allotv1.CheckResult{Allowed: true, Limits: []*allotv1.LimitStatus{
		{Name: "per-user", Limit: 30, Remaining: 14, Window: durationpb.New(time.Second), Allowed: true},
	}}
	if d := fromResult(old); d.Quota != 30 || d.QuotaWindow != time.Second || d.Partition != "" || d.Remaining != 14 {
		t.Errorf("older enforcer: %+v; want quota 30 per 1s, no partition, remaining 14", d)
	}
}

// TestLeaseDecisionSaysTheQuota: a decision from a lease keeps the last
// answer's quota, and its remaining (held + the enforcer's left) is at
// most the quota.
func TestLeaseDecisionSaysTheQuota(t *testing.T) {
	b := &bucket{info: Decision{Limit: "per-user", Amount: 30, Quota: 5, Partition: "us-east", Source: SourceLease}, left: 9}
	if d := b.allowed(); !d.Allowed || d.Quota != 5 || d.Partition != "us-east" || d.Remaining != 5 {
		t.Errorf("lease decision %+v; want allowed, quota 5 in us-east, remaining 5", d)
	}
}
