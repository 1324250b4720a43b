package admin

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestSumUsagePropagating: while an override has reached one region only,
// the sum shows the limit every region enforces, not the raised one.
func TestSumUsagePropagating(t *testing.T) {
	lu := func(amount, remaining int64, window time.Duration) []*allotv1.LimitUsage {
		return []*allotv1.LimitUsage{{Limit: "per-user", Key: "per-user:user=42", Amount: amount, Window: durationpb.New(window),
			Remaining: remaining, Used: 0, ResetAfter: durationpb.New(0), Share: 1}}
	}
	for _, c := range []struct {
		name    string
		regions []*allotv1.RegionUsage
		amount  int64
		window  time.Duration
	}{
		{"agreeing", []*allotv1.RegionUsage{{Region: "a", Limits: lu(240, 20, time.Hour)}, {Region: "b", Limits: lu(240, 20, time.Hour)}}, 240, time.Hour},
		{"raised in one", []*allotv1.RegionUsage{{Region: "a", Limits: lu(240, 20, time.Hour)}, {Region: "b", Limits: lu(60, 5, time.Hour)}}, 60, time.Hour},
		{"raised in the other", []*allotv1.RegionUsage{{Region: "a", Limits: lu(60, 5, time.Hour)}, {Region: "b", Limits: lu(240, 20, time.Hour)}}, 60, time.Hour},
		{"windows differ", []*allotv1.RegionUsage{{Region: "a", Limits: lu(2, 2, time.Minute)}, {Region: "b", Limits: lu(60, 5, time.Hour)}}, 60, time.Hour},
		{"one did not answer", []*allotv1.RegionUsage{{Region: "a", Error: "UNAVAILABLE: down"}, {Region: "b", Limits: lu(240, 20, time.Hour)}}, 240, time.Hour},
	} {
		g := sumUsage(c.regions)
		if len(g) != 1 || g[0].GetAmount() != c.amount || g[0].GetWindow().AsDuration() != c.window {
			t.Errorf("%s: %v, want %d per %v", c.name, g, c.amount, c.window)
		}
	}
}
