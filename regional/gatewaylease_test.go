package regional

import (
	"testing"
	"time"
)

func TestGatewayLeaseSizing(t *testing.T) {
	for _, tc := range []struct{ want, left, grant int64 }{
		{10, -1, 10},  // no limit applies
		{10, 100, 10}, // plenty left
		{80, 100, 50}, // at most half of what is left
		{80, 1, 1},    // the last token
		{80, 0, 0},    // nothing left
		{0, 100, 0},   // nothing asked
	} {
		if got := GatewayGrant(tc.want, tc.left); got != tc.grant {
			t.Errorf("GatewayGrant(%d, %d) = %d, want %d", tc.want, tc.left, got, tc.grant)
		}
	}
	iv := 250 * time.Millisecond
	for _, tc := range []struct {
		rate    float64
		maxHits int64
		want    int64
	}{{0, 0, 1}, {100, 0, 50}, {100, 80, 80}, {0.1, 0, 1}} {
		if got := GatewayWant(tc.rate, iv, tc.maxHits); got != tc.want {
			t.Errorf("GatewayWant(%v, %v, %d) = %d, want %d", tc.rate, iv, tc.maxHits, got, tc.want)
		}
	}
	if !GatewayRenew(10, 100, iv) || GatewayRenew(40, 100, iv) || GatewayRenew(0, 0, iv) {
		t.Error("GatewayRenew: renew when less than 1.5 intervals of the rate is held, never at rate 0")
	}
}
