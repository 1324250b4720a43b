package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// fakeAdmin answers Usage and Status with fixed answers whose shares carry
// float32 noise, as the coordinator's do.
type fakeAdmin struct {
	allotv1.UnimplementedAdminServer
}

const noisyShare = 0.29999998211860657 // 0.3 rounded down to a float32

func (fakeAdmin) Usage(context.Context, *allotv1.UsageRequest) (*allotv1.UsageResponse, error) {
	l := &allotv1.LimitUsage{Limit: "per-user", Key: "per-user:user=42", Amount: 30, Window: durationpb.New(time.Second),
		Used: 3, Remaining: 1, ResetAfter: durationpb.New(250 * time.Millisecond), Share: noisyShare}
	return &allotv1.UsageResponse{Regions: []*allotv1.RegionUsage{{Region: "us-east", Limits: []*allotv1.LimitUsage{l}}},
		Global: []*allotv1.LimitUsage{l}}, nil
}

func (fakeAdmin) Status(context.Context, *allotv1.StatusRequest) (*allotv1.StatusResponse, error) {
	return &allotv1.StatusResponse{
		Config: &allotv1.ConfigVersion{Version: 12},
		Domains: []*allotv1.DomainStatus{{Name: "api", Term: 4, Version: 9, Limits: []*allotv1.LimitInfo{{
			Name: "per-user", Rate: "30/s", Burst: 15, Shares: map[string]float64{"us-east": 0.3499999940395355, "eu-west": noisyShare, "ap-south": 0.3499999940395355}}}}},
		Regions: []*allotv1.RegionStatus{{Region: "us-east", ConfigVersion: 12, Domains: []*allotv1.RegionDomain{{Name: "api", Term: 4, Version: 9,
			Limits: []*allotv1.RegionLimit{{Name: "per-user", Share: noisyShare, Allowed: 1234, Rejected: 5}}}}}},
	}, nil
}

func serveFakeAdmin(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	allotv1.RegisterAdminServer(gs, fakeAdmin{})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

// TestJSONOutputNumbers: -o json writes integers as JSON numbers and
// shares rounded to 4 decimals; durations keep the proto3 mapping.
func TestJSONOutputNumbers(t *testing.T) {
	t.Setenv("ALLOT_INSECURE", "1") // the fake serves plain text, on loopback
	addr := serveFakeAdmin(t)
	out := mustCtl(t, []string{"--addr", addr, "-o", "json", "usage", "--domain", "api", "--key", "user=42"})
	var usage struct {
		Regions []struct {
			Limits []struct {
				Amount, Used, Remaining int64
				Share                   float64
				Window                  string
				ResetAfter              string `json:"reset_after"`
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &usage); err != nil {
		t.Fatalf("usage -o json: %v\n%s", err, out)
	}
	if len(usage.Regions) != 1 || len(usage.Regions[0].Limits) != 1 {
		t.Fatalf("usage -o json:\n%s", out)
	}
	if l := usage.Regions[0].Limits[0]; l.Amount != 30 || l.Used != 3 || l.Remaining != 1 || l.Share != 0.3 || l.ResetAfter != "0.250s" {
		t.Errorf("usage -o json: %+v\n%s", l, out)
	}
	for _, bad := range []string{`"30"`, `"3"`, "0.2999999"} {
		if strings.Contains(out, bad) {
			t.Errorf("usage -o json holds %s:\n%s", bad, out)
		}
	}

	out = mustCtl(t, []string{"--addr", addr, "-o", "json", "status"},
		`"us-east": 0.35`, `"eu-west": 0.3`, `"share": 0.3,`, `"allowed": 1234`, `"burst": 15`, `"version": 12`)
	if strings.Contains(out, "0.2999999") || strings.Contains(out, "0.3499999") || strings.Contains(out, `"1234"`) {
		t.Errorf("status -o json:\n%s", out)
	}
	// The table rounds too.
	mustCtl(t, []string{"--addr", addr, "usage", "--domain", "api", "--key", "user=42"}, "0.300")
}
