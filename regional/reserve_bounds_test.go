package regional

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// Reservations in flight are capped per key and per caller, as well as in
// all; a refused one charges nothing, and settling, releasing or expiring
// one makes room.
func TestReserveCapsPerKeyAndCaller(t *testing.T) {
	cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 10000/1m}
`
	rs := newReservations(t, cfg, ReservationOptions{MaxPerKey: 2, MaxPerCaller: 3, TTL: time.Minute})
	req := func(caller, who string) ReserveRequest {
		return ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant(who)}, PromptTokens: 10, MaxTokens: 10, Caller: caller}
	}
	must := func(r ReserveRequest) Reservation {
		t.Helper()
		res, err := rs.Reserve(bg, t0, r)
		if err != nil || !res.Allowed {
			t.Fatalf("reserve %+v: %+v %v", r, res, err)
		}
		return res
	}
	a1 := must(req("gw1", "a"))
	must(req("gw1", "a"))
	if _, err := rs.Reserve(bg, t0, req("gw2", "a")); !errors.Is(err, ErrTooManyReservations) {
		t.Fatalf("third on one key: %v, want ErrTooManyReservations", err)
	}
	must(req("gw1", "b"))
	// Reservations matching no limit count against their caller too.
	junk := ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{{{Key: "junk", Value: "x"}}}, MaxTokens: 10, Caller: "gw1"}
	if _, err := rs.Reserve(bg, t0, junk); !errors.Is(err, ErrTooManyReservations) {
		t.Fatalf("fourth of one caller: %v, want ErrTooManyReservations", err)
	}
	if got := tokensLeft(t, rs, t0, "a"); got != 10000-2*15 {
		t.Fatalf("refused reservations charged: %d left", got)
	}
	junk.Caller = "gw2"
	for range 3 {
		must(junk)
	}
	if st := rs.Stats(); st.Active != 6 {
		t.Fatalf("%d in flight, want 6", st.Active)
	}
	// A settle frees the caller's and the key's room.
	if _, err := rs.SettleAs(bg, t0, "gw1", a1.ID, 10, 1); err != nil {
		t.Fatal(err)
	}
	must(req("gw1", "a"))
	// At their TTL, the rest free theirs.
	later := t0.Add(time.Minute)
	for _, who := range []string{"a", "a", "c"} {
		if r, err := rs.Reserve(bg, later, req("gw1", who)); err != nil || !r.Allowed {
			t.Fatalf("after expiry: %+v %v", r, err)
		}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.perCaller["gw1"] != 3 || rs.perCaller["gw2"] != 0 || len(rs.perKey) != 2 || rs.count != 3 {
		t.Fatalf("counts after expiry: callers %v, keys %v", rs.perCaller, rs.perKey)
	}
}

// Only the caller that made a reservation may settle or release it;
// callers without an identity are one caller, "".
func TestSettleOnlyByOwner(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	r, err := rs.Reserve(bg, t0, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant("acme")},
		PromptTokens: 100, MaxTokens: 1000, Caller: "spiffe://allot/gateway/gw1"})
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	for name, f := range map[string]func() (Settlement, error){
		"settle by another":    func() (Settlement, error) { return rs.SettleAs(bg, t0, "spiffe://allot/gateway/gw2", r.ID, 0, 0) },
		"settle by anonymous":  func() (Settlement, error) { return rs.Settle(bg, t0, r.ID, 0, 0) },
		"release by another":   func() (Settlement, error) { return rs.ReleaseAs(bg, t0, "spiffe://allot/gateway/gw2", r.ID, 0) },
		"release by anonymous": func() (Settlement, error) { return rs.Release(bg, t0, r.ID, 0) },
		"bad input by another": func() (Settlement, error) { return rs.SettleAs(bg, t0, "x", r.ID, 0, 1<<40) },
	} {
		if _, err := f(); !errors.Is(err, ErrNotOwner) || !errors.Is(err, ErrUnknownReservation) {
			t.Errorf("%s: %v, want ErrNotOwner", name, err)
		}
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-600 {
		t.Fatalf("another caller's settle changed the balance: %d left", got)
	}
	s, err := rs.SettleAs(bg, t0, "spiffe://allot/gateway/gw1", r.ID, 100, 100)
	if err != nil || s.Refunded != 400 {
		t.Fatalf("owner's settle: %+v %v", s, err)
	}
	// A repeat answers only its owner.
	if _, err := rs.SettleAs(bg, t0, "spiffe://allot/gateway/gw2", r.ID, 100, 100); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("repeat by another: %v", err)
	}
	// Anonymous reservations are settled anonymously.
	a := reserve(t, rs, t0, "acme", 10, 10)
	if _, err := rs.SettleAs(bg, t0, "spiffe://allot/gateway/gw1", a.ID, 1, 1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("an identified caller settled an anonymous reservation: %v", err)
	}
	if _, err := rs.Settle(bg, t0, a.ID, 1, 1); err != nil {
		t.Fatal(err)
	}
}

// OutputSlack sets the bound on a settled output; negative means none.
func TestSettleOutputSlack(t *testing.T) {
	for _, tc := range []struct {
		slack    float64
		ok, over int64
	}{
		{0, 200, 201}, // the default: twice max_tokens
		{-1, 100, 101},
		{0.1, 110, 111},
	} {
		rs := newReservations(t, reserveConfig, ReservationOptions{OutputSlack: tc.slack})
		r := reserve(t, rs, t0, "acme", 10, 100)
		if _, err := rs.Settle(bg, t0, r.ID, 0, tc.over); !errors.Is(err, ErrBadReservation) {
			t.Errorf("slack %v: output %d: %v, want ErrBadReservation", tc.slack, tc.over, err)
		}
		if _, err := rs.Settle(bg, t0, r.ID, 0, tc.ok); err != nil {
			t.Errorf("slack %v: output %d: %v", tc.slack, tc.ok, err)
		}
	}
}

// The table of tenants' own estimates holds at most MaxTenantEstimates
// keys, the least recently used going first.
func TestTenantEstimatesBounded(t *testing.T) {
	cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1m}
`
	rs := newReservations(t, cfg, ReservationOptions{MaxTenantEstimates: 8})
	for range 20 {
		r := reserve(t, rs, t0, "victim", 10, 4000)
		if _, err := rs.Settle(bg, t0, r.ID, 10, 1000); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		r := reserve(t, rs, t0, fmt.Sprintf("other-%d", i), 10, 4000)
		if _, err := rs.Settle(bg, t0, r.ID, 10, 3000); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			reserve(t, rs, t0, "victim", 10, 4000) // used: kept
		}
	}
	if n := rs.tenants.len(); n != 8 {
		t.Fatalf("%d tenant estimates kept, want 8", n)
	}
	if r := reserve(t, rs, t0, "victim", 10, 4000); r.Estimate != 1100 {
		t.Fatalf("the victim's own estimate was dropped: %d, want 1000 + 10 %%", r.Estimate)
	}
	if st := rs.Stats(); st.TenantEstimates == 0 {
		t.Fatalf("no tenant estimates counted: %+v", st)
	}
}

// pack keeps the order of outputs and each within 0.1 %.
func TestPackOutput(t *testing.T) {
	prev := uint16(0)
	for _, v := range []int64{0, 1, 2047, 2048, 2049, 4095, 4096, 1 << 20, 1<<20 + 12345, 1 << 24, math.MaxUint32, 1 << 40} {
		c := pack(v)
		if c < prev {
			t.Fatalf("pack(%d) = %d, below the previous %d", v, c, prev)
		}
		prev = c
		want := float64(min(v, math.MaxUint32))
		if got := float64(unpack(c)); math.Abs(got-want) > want/1000 {
			t.Errorf("unpack(pack(%d)) = %v", v, got)
		}
	}
}
