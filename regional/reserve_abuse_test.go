package regional

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// Abuse bounds of reservations (issue #18) that the options of before
// already let a test reach; reserve_bounds_test.go has those that need
// the new options.

// A settle of output far above max_tokens locked a tenant out for a
// year: it is refused and changes nothing, and the reservation can still
// be settled.
func TestSettleOutputBoundedByMaxTokens(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	r := reserve(t, rs, t0, "acme", 10, 100) // holds 10 + 50
	for _, out := range []int64{1 << 50, 1<<50 - 1, 201} {
		if _, err := rs.Settle(bg, t0, r.ID, 10, out); !errors.Is(err, ErrBadReservation) {
			t.Fatalf("settle of %d output tokens on max_tokens 100: %v, want ErrBadReservation", out, err)
		}
	}
	// A release above what the call could have used: MaxTokens of prompt
	// and twice max_tokens.
	if _, err := rs.Release(bg, t0, r.ID, DefaultMaxTokens+201); !errors.Is(err, ErrBadReservation) {
		t.Fatalf("release above prompt and output bounds: %v", err)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-60 {
		t.Fatalf("%d tokens left after refused settles, want %d", got, 10000-60)
	}
	if st := rs.Stats(); st.Active != 1 || st.SettledTokens != 0 || st.OverchargedTokens != 0 || st.StoreFailures != 0 {
		t.Fatalf("refused settles counted: %+v", st)
	}
	// Twice max_tokens is the default bound: it passes.
	s, err := rs.Settle(bg, t0, r.ID, 10, 200)
	if err != nil || s.Overcharged != 150 || s.Repeat {
		t.Fatalf("settle at the bound: %+v %v", s, err)
	}
	if next := reserve(t, rs, t0.Add(2*time.Second), "acme", 10, 100); !next.Allowed {
		t.Fatalf("tenant locked out after a bounded settle: %+v", next)
	}
}

// Input and output whose sum is above the accounting cap were neither
// charged nor refused: billed, and counted as a store failure.
func TestSettleAboveAccountingCap(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{MaxTokens: allot.MaxAmount})
	r := reserve(t, rs, t0, "acme", 10, 1000)
	_, err := rs.Settle(bg, t0, r.ID, allot.MaxAmount-10, 100)
	if !errors.Is(err, ErrBadReservation) || !strings.Contains(err.Error(), "accounting cap") {
		t.Fatalf("settle above the accounting cap: %v, want ErrBadReservation naming the cap", err)
	}
	if st := rs.Stats(); st.StoreFailures != 0 || st.SettledTokens != 0 || st.Active != 1 {
		t.Fatalf("a settle above the cap was billed or counted as a store failure: %+v", st)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-510 {
		t.Fatalf("%d tokens left, want %d", got, 10000-510)
	}
}

// A tenant with 20 samples of its own: 100 settles of other tenants of
// the same limit and model move its estimate by at most 10 %, down (0
// output, its samples two half-lives old) or up (max_tokens).
func TestTenantEstimateIsItsOwn(t *testing.T) {
	cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1m}
`
	for _, tc := range []struct {
		name   string
		others int64
		after  time.Duration
	}{
		{"others settle nothing", 0, 2 * time.Hour},
		{"others settle max_tokens", 4000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := newReservations(t, cfg, ReservationOptions{HalfLife: time.Hour})
			for range 20 {
				r := reserve(t, rs, t0, "victim", 10, 4000)
				if _, err := rs.Settle(bg, t0, r.ID, 10, 1000); err != nil {
					t.Fatal(err)
				}
			}
			if r := reserve(t, rs, t0, "victim", 10, 4000); r.Estimate != 1000 || !r.Learned {
				t.Fatalf("victim's estimate before: %+v", r)
			}
			at := t0.Add(tc.after)
			for i := range 100 {
				r := reserve(t, rs, at, fmt.Sprintf("other-%d", i), 10, 4000)
				if _, err := rs.Settle(bg, at, r.ID, 10, tc.others); err != nil {
					t.Fatal(err)
				}
			}
			r := reserve(t, rs, at, "victim", 10, 4000)
			if r.Estimate < 900 || r.Estimate > 1100 || !r.Learned {
				t.Fatalf("victim's estimate after 100 settles of %d by others: %d, want 1000 ± 10 %%", tc.others, r.Estimate)
			}
			// A tenant without data of its own has the limit's estimate.
			if n := reserve(t, rs, at, "newcomer", 10, 4000); tc.others == 4000 && n.Estimate != 4000 {
				t.Fatalf("newcomer's estimate: %d, want the limit's 4000", n.Estimate)
			}
		})
	}
}

// Descriptors of a reservation are bounded in bytes and entries: 1 MB
// descriptors that match no limit were held for an hour.
func TestReserveDescriptorsBounded(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	big := allot.Descriptor{{Key: "junk", Value: strings.Repeat("x", 1<<20)}}
	var many []allot.Descriptor
	for i := range 32 {
		many = append(many, allot.Descriptor{{Key: "a", Value: fmt.Sprint(i)}, {Key: "b", Value: "x"}, {Key: "c", Value: "y"}})
	}
	for name, ds := range map[string][]allot.Descriptor{
		"1 MB value":             {big},
		"4 KiB over descriptors": {tenant(strings.Repeat("a", 3000)), tenant(strings.Repeat("b", 2000))},
		"96 entries in all":      many,
		"1 MB key matching none": {{{Key: strings.Repeat("k", 1<<20), Value: "v"}}},
		"big beside a good one":  {tenant("acme"), big},
	} {
		_, err := rs.Reserve(bg, t0.Add(time.Hour), ReserveRequest{Domain: "llm", Descriptors: ds, MaxTokens: 10, TTL: time.Hour})
		if !errors.Is(err, ErrBadDescriptor) {
			t.Errorf("%s: %v, want ErrBadDescriptor", name, err)
		}
	}
	if st := rs.Stats(); st.Active != 0 || st.Reservations != 0 {
		t.Fatalf("oversized descriptors admitted: %+v", st)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000 {
		t.Fatalf("oversized descriptors charged: %d left", got)
	}
}

// A reservation that matches no limit is admitted (as Check admits a
// request no limit matches), but keeps none of its descriptors: there is
// nothing its settlement could correct.
func TestReserveMatchingNoLimitKeepsNoDescriptors(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	d := allot.Descriptor{{Key: "junk", Value: strings.Repeat("x", 4000)}}
	r, err := rs.Reserve(bg, t0, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{d}, MaxTokens: 10})
	if err != nil || !r.Allowed {
		t.Fatalf("reserve matching no limit: %+v %v", r, err)
	}
	rs.mu.Lock()
	held := rs.byID[r.ID].descs
	rs.mu.Unlock()
	if held != nil {
		t.Fatalf("a reservation matching no limit keeps its descriptors: %d", len(held))
	}
	if st := rs.Stats(); st.Active != 1 {
		t.Fatalf("not counted in flight: %+v", st)
	}
	if s, err := rs.Settle(bg, t0, r.ID, 3, 4); err != nil || s.Settled != 7 {
		t.Fatalf("settle: %+v %v", s, err)
	}
}
