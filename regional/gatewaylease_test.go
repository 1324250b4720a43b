package regional

import (
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot"
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

// gatewayOp is one step of a GatewayKey table: a call at an instant and
// what it returns.
type gatewayOp func(k *GatewayKey, at time.Time) any

type decided struct {
	V    GatewayVerdict
	Wait time.Duration
}

func gwTake(hits int64) gatewayOp {
	return func(k *GatewayKey, _ time.Time) any { return k.Take(hits) }
}

func gwDecide(hits int64) gatewayOp {
	return func(k *GatewayKey, at time.Time) any {
		v, wait := k.Decide(at, hits)
		return decided{v, wait}
	}
}

func gwChecked(hits int64, allowed bool, retryAfter, iv time.Duration) gatewayOp {
	return func(k *GatewayKey, at time.Time) any { return k.Checked(at, hits, allowed, retryAfter, iv) }
}

func gwPlan(iv time.Duration, leaving bool) gatewayOp {
	return func(k *GatewayKey, at time.Time) any { return k.Plan(at, iv, leaving) }
}

// gwAnswer takes in an answer to the round sent at the same instant.
func gwAnswer(a GatewayAnswer, iv time.Duration) gatewayOp {
	return func(k *GatewayKey, at time.Time) any { k.Answer(at, at, a, iv); return nil }
}

func gwUnanswered(k *GatewayKey, _ time.Time) any { k.Unanswered(); return nil }

func gwHeld(k *GatewayKey, _ time.Time) any { return k.Held() }

func gwLeased(n, at int64, ttl time.Duration) GatewayAnswer {
	return GatewayAnswer{Mode: GatewayLeased, Granted: n, GrantedAt: at, TTL: ttl}
}

type gatewayRow struct {
	at   time.Time
	op   gatewayOp
	want any
}

func runGatewayRows(t *testing.T, k *GatewayKey, rows []gatewayRow) {
	t.Helper()
	for i, r := range rows {
		if got := r.op(k, r.at); !reflect.DeepEqual(got, r.want) {
			t.Fatalf("row %d at +%v: got %+v, want %+v", i, r.at.Sub(time.Unix(1000, 0)), got, r.want)
		}
	}
}

// TestGatewayKeyDeny: a new key asks Check, then leases; rates follow
// spent and asked hits; a rejected Check refuses requests for at least a
// quarter interval, an empty grant for its retry_after (at most an
// interval), and while refused the round renews nothing unless a request
// found no lease.
func TestGatewayKeyDeny(t *testing.T) {
	iv := 250 * time.Millisecond
	t0 := time.Unix(1000, 0)
	t1 := t0.Add(250 * time.Millisecond)
	t2 := t0.Add(260 * time.Millisecond)
	t3 := t0.Add(290 * time.Millisecond)
	t4 := t0.Add(500 * time.Millisecond)
	t5 := t0.Add(600 * time.Millisecond)
	t6 := t0.Add(700 * time.Millisecond)
	t7 := t0.Add(time.Second)
	t8 := t0.Add(1250 * time.Millisecond)
	t9 := t0.Add(1500 * time.Millisecond)
	k := NewGatewayKey(t0)
	runGatewayRows(t, &k, []gatewayRow{
		{t0, gwTake(1), false},                           // no lease yet
		{t0, gwDecide(1), decided{GatewayAsk, 0}},        // to Check
		{t0, gwChecked(1, false, time.Second, iv), true}, // rejected: but a new key is not refused locally
		{t0, gwDecide(1), decided{GatewayAsk, 0}},
		{t0, gwChecked(1, true, 0, iv), true},
		// 2 hits asked over 250 ms: 8/s; two intervals of it.
		{t1, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 4}},
		{t1, gwAnswer(gwLeased(2, 11, time.Second), iv), nil},
		{t1, gwTake(2), true},
		{t1, gwTake(1), false},
		{t2, gwDecide(1), decided{GatewayAsk, 0}},
		// retry_after 20 ms: refused for a quarter interval.
		{t2, gwChecked(1, false, 20*time.Millisecond, iv), true},
		{t3, gwDecide(1), decided{GatewayDenied, t2.Add(iv / 4).Sub(t3)}},
		{t3, gwDecide(0), decided{GatewaySpent, 0}}, // a zero-hit request is never refused: it spends nothing
		// Rate: 2 spent + 1 asked over 250 ms = 12/s, above the previous
		// 8/s: followed at once. A request found no lease: ask.
		{t4, gwPlan(iv, false), GatewayPlan{Used: 2, Ask: true, Want: 6}},
		// Nothing granted, retry_after 400 ms: refused for at most an
		// interval.
		{t4, gwAnswer(GatewayAnswer{Mode: GatewayLeased, GrantedAt: 44, TTL: time.Second, RetryAfter: 400 * time.Millisecond}, iv), nil},
		{t5, gwDecide(1), decided{GatewayDenied, t4.Add(iv).Sub(t5)}},
		// Refused: the round renews nothing (the denied request did not
		// ask for a lease).
		{t6, gwPlan(iv, false), GatewayPlan{}},
		{t7, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 2}},
		{t7, gwAnswer(gwLeased(5, 77, time.Second), iv), nil},
		{t7, gwHeld, int64(5)},
		{t8, gwDecide(9), decided{GatewayAsk, 0}}, // more than held
		{t8, gwChecked(9, true, 0, iv), true},
		// 9 asked over 500 ms = 18/s: two intervals of it are 9, the
		// largest request too.
		{t9, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 9}},
	})
}

// TestGatewayKeyReturns: grants ending before the round after next go
// back, the older grant makes room for a new one, a failed call drops the
// ask, and an idle key returns everything and is forgotten.
func TestGatewayKeyReturns(t *testing.T) {
	iv := 250 * time.Millisecond
	ttl := 2 * time.Second
	t0 := time.Unix(1000, 0)
	t1 := t0.Add(250 * time.Millisecond)
	t2 := t0.Add(500 * time.Millisecond)
	t3 := t0.Add(750 * time.Millisecond)
	t4 := t0.Add(time.Second)
	t5 := t0.Add(1100 * time.Millisecond)
	t6 := t0.Add(1250 * time.Millisecond)
	t7 := t0.Add(1280 * time.Millisecond)
	t8 := t0.Add(2200 * time.Millisecond)
	t9 := t0.Add(6200 * time.Millisecond)
	k := NewGatewayKey(t0)
	runGatewayRows(t, &k, []gatewayRow{
		{t0, gwDecide(4), decided{GatewayAsk, 0}},
		{t0, gwChecked(4, true, 0, iv), true},
		{t1, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 8}}, // 16/s
		{t1, gwAnswer(gwLeased(8, 1, ttl), iv), nil},
		{t1, gwTake(6), true},
		// 24/s; 2 held would not last 1.5 intervals: renew.
		{t2, gwPlan(iv, false), GatewayPlan{Used: 6, Ask: true, Want: 12}},
		{t2, gwAnswer(gwLeased(12, 2, ttl), iv), nil},
		{t3, gwTake(1), true}, // from the older grant
		{t3, gwHeld, int64(13)},
		{t3, gwPlan(iv, false), GatewayPlan{Used: 1}}, // 14/s: 13 lasts
		{t4, gwPlan(iv, false), GatewayPlan{}},        // 7/s; nothing ends before t4 + 375 ms
		{t5, gwDecide(20), decided{GatewayAsk, 0}},
		{t5, gwChecked(20, false, 200*time.Millisecond, iv), true}, // refused until t5 + 200 ms
		// Refused, but a request found no lease: ask, the older grant
		// going back to make room.
		{t6, gwPlan(iv, false), GatewayPlan{
			Return: []LeaseGrant{{Tokens: 1, GrantedAt: 1, Expires: t1.Add(ttl)}}, Ask: true, Want: 40}},
		{t6, gwUnanswered, nil},                // the call failed
		{t7, gwPlan(iv, false), GatewayPlan{}}, // refused: no renewal
		{t8, gwPlan(iv, false), GatewayPlan{
			Return: []LeaseGrant{{Tokens: 12, GrantedAt: 2, Expires: t2.Add(ttl)}}, Ask: true, Want: 10}},
		{t8, gwAnswer(gwLeased(3, 8, ttl), iv), nil},
		// Unused for 20 intervals: everything goes back.
		{t9, gwPlan(iv, false), GatewayPlan{Return: []LeaseGrant{{Tokens: 3, GrantedAt: 8, Expires: t8.Add(ttl)}}, Forget: true}},
		{t9, gwHeld, int64(0)},
	})
}

// TestGatewayKeyModes: a key that takes no leases (check-each,
// unlimited) is never refused locally, asks again every 5 s, and a
// leaving gateway returns everything.
func TestGatewayKeyModes(t *testing.T) {
	iv := time.Second
	t0 := time.Unix(1000, 0)
	t1 := t0.Add(time.Second)
	t2 := t0.Add(1010 * time.Millisecond)
	t3 := t0.Add(6 * time.Second)
	t4 := t0.Add(6100 * time.Millisecond)
	t5 := t0.Add(7 * time.Second)
	k := NewGatewayKey(t0)
	runGatewayRows(t, &k, []gatewayRow{
		{t0, gwDecide(1), decided{GatewayAsk, 0}},
		{t0, gwChecked(1, true, 0, iv), true},
		{t1, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 2}},
		{t1, gwAnswer(GatewayAnswer{Mode: GatewayCheckEach}, iv), nil},
		{t2, gwTake(0), false},
		{t2, gwDecide(1), decided{GatewayAsk, 0}},
		{t2, gwChecked(1, false, time.Second, iv), false}, // no lease to ask for
		{t2, gwDecide(1), decided{GatewayAsk, 0}},         // never refused locally
		{t3, gwPlan(iv, false), GatewayPlan{}},            // answered 5 s ago
		{t4, gwPlan(iv, false), GatewayPlan{Ask: true}},   // probe: want 0
		{t4, gwAnswer(GatewayAnswer{Mode: GatewayUnlimited}, iv), nil},
		{t4, gwDecide(1), decided{GatewayPass, 0}},
		{t5, gwPlan(iv, true), GatewayPlan{Forget: true}},
	})
}

func TestGatewayEnforcerSide(t *testing.T) {
	dec := &allot.Decision{Allowed: true, Statuses: []allot.LimitStatus{
		{Name: "a", Limit: 100, Window: time.Second, Remaining: 7},
		{Name: "shadow", Shadow: true, Limit: 10, Window: time.Second, Remaining: 0},
		{Name: "b", Limit: 50, Window: time.Second, Remaining: 0},
	}}
	if got := GatewayLeft(dec); got != 0 {
		t.Errorf("GatewayLeft = %d, want 0 (the shadow limit does not count)", got)
	}
	if got := GatewayLeft(&allot.Decision{}); got != -1 {
		t.Errorf("GatewayLeft of no limits = %d, want -1", got)
	}
	if got := GatewayRetryAfter(dec); got != 20*time.Millisecond {
		t.Errorf("GatewayRetryAfter = %v, want 20ms (b refills a token in 1 s ÷ 50)", got)
	}
	dec.RetryAfter = time.Second
	if got := GatewayRetryAfter(dec); got != time.Second {
		t.Errorf("GatewayRetryAfter = %v, want the decision's 1s", got)
	}
}

// TestGatewayKeyInUseFromGrants: a key whose every request is served from
// its grants is in use: it is not forgotten (and its grants not returned)
// after 20 intervals without a request reaching the enforcer.
func TestGatewayKeyInUseFromGrants(t *testing.T) {
	iv := 250 * time.Millisecond
	ttl := time.Minute
	t0 := time.Unix(1000, 0)
	t1 := t0.Add(iv)
	t2 := t0.Add(3 * time.Second)
	t3 := t0.Add(5 * time.Second)
	t4 := t0.Add(5*time.Second + iv)
	t5 := t0.Add(11 * time.Second)
	k := NewGatewayKey(t0)
	runGatewayRows(t, &k, []gatewayRow{
		{t0, gwDecide(1), decided{GatewayAsk, 0}},
		{t0, gwChecked(1, true, 0, iv), true},
		{t1, gwPlan(iv, false), GatewayPlan{Ask: true, Want: 2}},
		{t1, gwAnswer(gwLeased(100, 1, ttl), iv), nil},
		{t2, gwTake(1), true},
		{t3, gwTake(1), true},
		{t4, gwPlan(iv, false), GatewayPlan{Used: 2}}, // 5 s after the last Decide: still in use
		{t4, gwHeld, int64(98)},
		// Nothing spent for 20 intervals after that round: idle.
		{t5, gwPlan(iv, false), GatewayPlan{Return: []LeaseGrant{{Tokens: 98, GrantedAt: 1, Expires: t1.Add(ttl)}}, Forget: true}},
	})
}
