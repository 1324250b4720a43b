package wirejson

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// share32 is a share of 0.3 as it arrives from a float32 rounded down
// (the coordinator's shares are), from allotctl usage -o json.
const share32 = 0.29999998211860657

func TestNumbersAreNumbers(t *testing.T) {
	m := &allotv1.UsageResponse{Regions: []*allotv1.RegionUsage{{Region: "us-east", Limits: []*allotv1.LimitUsage{{
		Limit: "per-user", Key: "per-user:user=<42>&", Amount: 30, Window: durationpb.New(time.Second),
		Used: 3, Remaining: 2, ResetAfter: durationpb.New(1500 * time.Millisecond), Share: share32,
	}}}}}
	got, err := Marshal(m, Options{Round: Shares})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"regions":[{"region":"us-east","limits":[{"limit":"per-user","key":"per-user:user=<42>&","amount":30,` +
		`"window":"1s","used":3,"remaining":2,"reset_after":"1.500s","share":0.3}]}]}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}

	// Unrounded, the share keeps every digit; and protojson reads it all
	// back (it accepts numbers for 64-bit integers).
	got, err = Marshal(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"share":0.29999998211860657`) {
		t.Errorf("unrounded share: %s", got)
	}
	var back allotv1.UsageResponse
	if err := protojson.Unmarshal(got, &back); err != nil || !proto.Equal(&back, m) {
		t.Errorf("protojson reads back %v (%v), want %v", &back, err, m)
	}
}

func TestMapsListsAndUnpopulated(t *testing.T) {
	m := &allotv1.StatusResponse{
		Config: &allotv1.ConfigVersion{Version: 7, Time: timestamppb.New(time.Unix(1_700_000_000, 0))},
		Domains: []*allotv1.DomainStatus{{Name: "api", Term: 3, Version: 41, Limits: []*allotv1.LimitInfo{{
			Name: "per-user", Burst: 15, Shares: map[string]float64{"us-east": float64(float32(0.35)), "eu-west": share32, "ap-south": float64(float32(1.0 / 3))},
			HotKeys: 2,
		}}}},
		Regions: []*allotv1.RegionStatus{{Region: "us-east", Domains: []*allotv1.RegionDomain{{Name: "api",
			Limits: []*allotv1.RegionLimit{{Name: "per-user", Share: share32, Allowed: 1 << 50}}}}}},
	}
	got, err := Marshal(m, Options{Indent: "  ", Round: Shares})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"version": 7`, `"time": "2023-11-14T22:13:20Z"`,
		`"shares": {` + "\n" + `            "ap-south": 0.3333,` + "\n" + `            "eu-west": 0.3,` + "\n" + `            "us-east": 0.35` + "\n",
		`"hot_keys": 2`, `"share": 0.3,`, `"allowed": 1125899906842624`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(string(got), `"allowed": "`) || strings.Contains(string(got), `"term": "`) {
		t.Errorf("an integer is a string:\n%s", got)
	}
	var v any
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, got)
	}

	// EmitUnpopulated writes zero values, null for unset messages.
	got, err = Marshal(&allotv1.LimitUsage{Limit: "x"}, Options{EmitUnpopulated: true})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"limit":"x","key":"","amount":0,"window":null,"used":0,"remaining":0,"reset_after":null,"share":0,"shadow":false}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// Without it, only what is set; proto3 optional fields only when set.
	got, _ = Marshal(&allotv1.CheckItem{Domain: "api"}, Options{EmitUnpopulated: true})
	if strings.Contains(string(got), `"hits"`) {
		t.Errorf("an unset optional field is written: %s", got)
	}
	got, _ = Marshal(&allotv1.CheckItem{Domain: "api", Hits: proto.Int64(0)}, Options{})
	if string(got) != `{"domain":"api","hits":0}` {
		t.Errorf("a set optional field: %s", got)
	}
}

func TestRound(t *testing.T) {
	for _, tc := range []struct {
		x    float64
		d    int
		want float64
	}{
		{share32, 4, 0.3}, {float64(float32(1.0 / 3)), 4, 0.3333}, {0.99995, 4, 1}, {1e300, 4, 1e300}, {-0.12345, 2, -0.12},
	} {
		if got := Round(tc.x, tc.d); got != tc.want {
			t.Errorf("Round(%v, %d) = %v, want %v", tc.x, tc.d, got, tc.want)
		}
	}
}
