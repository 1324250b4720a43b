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
	for _, tc := range []struct {
		prev float64
		hits int64
		dt   time.Duration
		rate float64
	}{{0, 25, iv, 100}, {100, 0, iv, 50}, {100, 50, iv, 200}, {100, 5, 0, 100}} {
		if got := GatewayRate(tc.prev, tc.hits, tc.dt); got != tc.rate {
			t.Errorf("GatewayRate(%v, %d, %v) = %v, want %v", tc.prev, tc.hits, tc.dt, got, tc.rate)
		}
	}
	if !GatewayRenew(10, 100, iv) || GatewayRenew(40, 100, iv) || GatewayRenew(0, 0, iv) {
		t.Error("GatewayRenew: renew when less than 1.5 intervals of the rate is held, never at rate 0")
	}
}

func TestLeaseHold(t *testing.T) {
	t0 := time.Unix(0, 0)
	var h LeaseHold
	if h.Take(1) || !h.Take(0) {
		t.Fatal("an empty hold spends nothing but zero")
	}
	h.Add(LeaseGrant{Tokens: 5, GrantedAt: 1, Expires: t0.Add(time.Second)})
	h.Add(LeaseGrant{Tokens: 10, GrantedAt: 2, Expires: t0.Add(2 * time.Second)})
	if !h.Take(7) || h.Old.Tokens != 0 || h.Cur.Tokens != 8 {
		t.Fatalf("older spent first: %+v", h)
	}
	h.Add(LeaseGrant{Tokens: 3, GrantedAt: 3, Expires: t0.Add(3 * time.Second)})
	h.Add(LeaseGrant{Tokens: 99, GrantedAt: 4, Expires: t0.Add(4 * time.Second)}) // no room: dropped
	if h.Held() != 11 {
		t.Fatalf("held %d, want 11 (a third grant is dropped)", h.Held())
	}
	if g, ok := h.MakeRoom(); !ok || g.GrantedAt != 2 || h.Held() != 3 || h.Old.GrantedAt != 3 {
		t.Fatalf("MakeRoom gave %+v, left %+v", g, h)
	}
	h.Add(LeaseGrant{Tokens: 4, GrantedAt: 5, Expires: t0.Add(5 * time.Second)})
	ends := h.Ending(t0.Add(3500*time.Millisecond), false, nil)
	if len(ends) != 1 || ends[0].GrantedAt != 3 || h.Old.GrantedAt != 5 || h.Held() != 4 {
		t.Fatalf("ending before 3.5 s: %+v, left %+v", ends, h)
	}
	if ends = h.Ending(t0, true, ends[:0]); len(ends) != 1 || h.Held() != 0 {
		t.Fatalf("all: %+v, left %+v", ends, h)
	}
}
