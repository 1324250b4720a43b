package main

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func TestRatesDiffer(t *testing.T) {
	region := func(name string, amount int64) *allotv1.RegionUsage {
		return &allotv1.RegionUsage{Region: name, Limits: []*allotv1.LimitUsage{{Key: "per-user:user=42", Amount: amount, Window: durationpb.New(time.Hour)}}}
	}
	same := &allotv1.UsageResponse{Regions: []*allotv1.RegionUsage{region("a", 240), region("b", 240), {Region: "c", Error: "down"}}}
	differ := &allotv1.UsageResponse{Regions: []*allotv1.RegionUsage{region("a", 240), region("b", 60)}}
	if ratesDiffer(same, "per-user:user=42") || !ratesDiffer(differ, "per-user:user=42") || ratesDiffer(differ, "per-tenant:tenant=x") {
		t.Error("ratesDiffer: want false, true, false")
	}
}
