package regional

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

const reserveConfig = `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 10000/1m, concurrency: 2}
  - {name: tenant-requests, match: {tenant: "*"}, rate: 100/1m}
`

var bg = context.Background()

func tenant(id string) allot.Descriptor { return allot.Descriptor{{Key: "tenant", Value: id}} }

func newReservations(t *testing.T, yaml string, opts ReservationOptions) *Reservations {
	t.Helper()
	if opts.Rand == nil {
		opts.Rand = rand.New(rand.NewPCG(1, 2))
	}
	return NewReservations(New(mustConfig(t, yaml), Options{}), nil, opts)
}

func reserve(t *testing.T, rs *Reservations, at time.Time, who string, prompt, maxTokens int64) Reservation {
	t.Helper()
	r, err := rs.Reserve(bg, at, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant(who)},
		PromptTokens: prompt, MaxTokens: maxTokens, Model: "m"})
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	return r
}

// status returns the status of limit name in dec.
func status(t *testing.T, dec allot.Decision, name string) allot.LimitStatus {
	t.Helper()
	for _, st := range dec.Statuses {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no status for %s in %+v", name, dec)
	return allot.LimitStatus{}
}

// tokensLeft checks what tenant's token limit holds at at, without
// charging.
func tokensLeft(t *testing.T, rs *Reservations, at time.Time, who string) int64 {
	t.Helper()
	var dec allot.Decision
	items := tokenItems([]allot.Descriptor{tenant(who)}, 0)
	if err := rs.engine.CheckItems(at, "llm", items, &dec); err != nil {
		t.Fatal(err)
	}
	return status(t, dec, "tenant-tokens").Remaining
}

func TestReserveSettle(t *testing.T) {
	rows := []struct {
		name                  string
		input, output         int64
		refunded, overcharged int64
		left                  int64 // tokens left after the settle
	}{
		{"below the estimate", 100, 200, 300, 0, 9700},
		{"at the estimate", 100, 500, 0, 0, 9400},
		{"above the estimate", 120, 900, 0, 420, 8980},
		{"nothing produced", 0, 0, 600, 0, 10000},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			rs := newReservations(t, reserveConfig, ReservationOptions{})
			r := reserve(t, rs, t0, "acme", 100, 1000)
			// No samples yet: half of max_tokens.
			if !r.Allowed || r.Reserved != 600 || r.Estimate != 500 || r.Learned || r.TTL != DefaultReservationTTL ||
				!r.Expires.Equal(t0.Add(DefaultReservationTTL)) || !strings.HasPrefix(r.ID, "rsv_") {
				t.Fatalf("reserve: %+v", r)
			}
			if st := status(t, r.Decision, "tenant-tokens"); st.Remaining != 9400 || st.Descriptor != 0 {
				t.Fatalf("tokens after reserve: %+v", st)
			}
			if st := status(t, r.Decision, "tenant-requests"); st.Remaining != 99 {
				t.Fatalf("requests after reserve: %+v, want one hit charged", st)
			}
			s, err := rs.Settle(bg, t0, r.ID, row.input, row.output)
			if err != nil {
				t.Fatal(err)
			}
			if s.State != Settled || s.Reserved != 600 || s.Settled != row.input+row.output ||
				s.Refunded != row.refunded || s.Overcharged != row.overcharged || s.Late || s.Repeat {
				t.Fatalf("settle: %+v", s)
			}
			if st := status(t, s.Decision, "tenant-tokens"); st.Remaining != row.left {
				t.Fatalf("settle reports %d left, want %d", st.Remaining, row.left)
			}
			if got := tokensLeft(t, rs, t0, "acme"); got != row.left {
				t.Fatalf("%d tokens left, want %d", got, row.left)
			}
			st := rs.Stats()
			if st.Active != 0 || st.ReservedTokens != 600 || st.SettledTokens != uint64(row.input+row.output) ||
				st.RefundedTokens != uint64(row.refunded) || st.OverchargedTokens != uint64(row.overcharged) {
				t.Fatalf("stats: %+v", st)
			}
		})
	}
}

// A settle above what is left takes the balance below zero, and the next
// request waits until it has refilled: exactly as long as the debt and
// its own cost take at the limit's rate.
func TestSettleBelowZeroMakesLaterRequestsWait(t *testing.T) {
	rs := newReservations(t, `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 1000/1m}
`, ReservationOptions{})
	r := reserve(t, rs, t0, "acme", 100, 1000) // holds 100 + 500
	if _, err := rs.Settle(bg, t0, r.ID, 100, 1000); err != nil {
		t.Fatal(err)
	}
	// 1000 − 1100 = −100 tokens. A request of 1 + 1 waits for 102 tokens.
	next := reserve(t, rs, t0, "acme", 1, 2)
	want := time.Duration(102 * int64(time.Minute) / 1000)
	if next.Allowed || next.RetryAfter != want {
		t.Fatalf("after the overcharge: allowed=%v retry=%v, want rejected for %v", next.Allowed, next.RetryAfter, want)
	}
	if late := reserve(t, rs, t0.Add(want-time.Millisecond), "acme", 1, 2); late.Allowed {
		t.Fatal("admitted before its retry_after")
	}
	if ok := reserve(t, rs, t0.Add(want), "acme", 1, 2); !ok.Allowed {
		t.Fatalf("rejected at its retry_after: %+v", ok)
	}
}

func TestReservationExpiry(t *testing.T) {
	const ttl, grace = 6 * time.Second, 12 * time.Second // 6s refill 1000 tokens
	rs := newReservations(t, reserveConfig, ReservationOptions{TTL: ttl, Grace: grace})
	a := reserve(t, rs, t0, "acme", 100, 1000)
	b := reserve(t, rs, t0, "acme", 100, 1000)
	c := reserve(t, rs, t0, "acme", 100, 1000)
	if !a.Allowed || !b.Allowed || c.Allowed || c.ConcurrencyLimit != "tenant-tokens" || c.ConcurrencyCap != 2 || c.RetryAfter <= 0 {
		t.Fatalf("concurrency 2: a=%v b=%v c=%+v", a.Allowed, b.Allowed, c)
	}
	if st := status(t, c.Decision, "tenant-tokens"); st.Allowed || c.Decision.Allowed {
		t.Fatalf("concurrency rejection's decision: %+v", c.Decision)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-1200 {
		t.Fatalf("a concurrency rejection charged: %d left", got)
	}
	if n := rs.Tick(bg, t0.Add(ttl-1)); n != 0 {
		t.Fatalf("%d expired before their TTL", n)
	}
	// The gateway crashed: nobody settles. At the TTL both are settled at
	// what they hold and their slots are free.
	if n := rs.Tick(bg, t0.Add(ttl)); n != 2 {
		t.Fatalf("%d expired at the TTL, want 2", n)
	}
	st := rs.Stats()
	if st.Active != 0 || st.Expired != 2 || st.SettledTokens != 1200 {
		t.Fatalf("stats after expiry: %+v", st)
	}
	at := t0.Add(ttl)
	d := reserve(t, rs, at, "acme", 100, 1000)
	e := reserve(t, rs, at, "acme", 100, 1000)
	if !d.Allowed || !e.Allowed {
		t.Fatal("slots of expired reservations are not free")
	}
	// 10000 − 1200 + 1000 refilled − 1200: nothing of the expired ones
	// came back.
	if got := tokensLeft(t, rs, at, "acme"); got != 8600 {
		t.Fatalf("%d tokens left, want 8600: expired reservations stay charged at what they held", got)
	}
	if s, err := rs.Settle(bg, at, b.ID, 100, 500); err != nil || !s.Late || s.Refunded != 0 || s.Overcharged != 0 {
		t.Fatalf("late settle at the reserved amount: %+v %v", s, err)
	}

	// A late settle within the grace period corrects the charge to real usage.
	s, err := rs.Settle(bg, at.Add(grace-time.Second), a.ID, 100, 50)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Late || s.State != Settled || s.Refunded != 450 || s.Settled != 150 {
		t.Fatalf("late settle: %+v", s)
	}
	if st := rs.Stats(); st.LateSettles != 2 || st.SettledTokens != 1200-600+150 {
		t.Fatalf("stats after the late settles: %+v", st)
	}
	if got := tokensLeft(t, rs, at.Add(grace-time.Second), "acme"); got != 10000 {
		t.Fatalf("%d", got)
	}
	// Once the grace period is over it is forgotten: NotFound.
	rs.Tick(bg, at.Add(grace-time.Second).Add(grace))
	if _, err := rs.Settle(bg, at.Add(2*grace), a.ID, 1, 1); !errors.Is(err, ErrUnknownReservation) {
		t.Fatalf("settle after the grace period: %v, want ErrUnknownReservation", err)
	}
	if _, err := rs.Settle(bg, at.Add(2*grace), d.ID, 1, 1); !errors.Is(err, ErrUnknownReservation) {
		t.Fatalf("settle of an expired reservation after the grace period: %v, want ErrUnknownReservation", err)
	}
}

func TestSettleIsIdempotent(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	r := reserve(t, rs, t0, "acme", 100, 1000)
	first, err := rs.Settle(bg, t0, r.ID, 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, again := range []func() (Settlement, error){
		func() (Settlement, error) { return rs.Settle(bg, t0, r.ID, 100, 100) },
		func() (Settlement, error) { return rs.Settle(bg, t0, r.ID, 5, 5000) },
		func() (Settlement, error) { return rs.Release(bg, t0, r.ID, 0) },
	} {
		s, err := again()
		if err != nil {
			t.Fatal(err)
		}
		if !s.Repeat || s.Refunded != first.Refunded || s.Settled != first.Settled || s.State != Settled {
			t.Fatalf("repeat: %+v, first %+v", s, first)
		}
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-200 {
		t.Fatalf("%d tokens left after repeats, want %d", got, 10000-200)
	}
	if st := rs.Stats(); st.SettledTokens != 200 || st.RefundedTokens != 400 {
		t.Fatalf("repeats counted: %+v", st)
	}

	// Release of a cancelled stream: charges what was used, learns nothing.
	c := reserve(t, rs, t0, "acme", 100, 1000)
	s, err := rs.Release(bg, t0, c.ID, 130)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != Released || s.Refunded != 470 {
		t.Fatalf("release: %+v", s)
	}
	if s, _ := rs.Release(bg, t0, c.ID, 130); !s.Repeat || s.State != Released {
		t.Fatalf("second release: %+v", s)
	}
}

func TestSettleConcurrentRepeatsChargeOnce(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	r := reserve(t, rs, t0, "acme", 100, 1000)
	var wg sync.WaitGroup
	var first atomic.Int64
	for range 20 {
		wg.Go(func() {
			s, err := rs.Settle(bg, t0, r.ID, 100, 2000)
			if err != nil {
				t.Error(err)
			}
			if !s.Repeat {
				first.Add(1)
			}
		})
	}
	wg.Wait()
	if first.Load() != 1 {
		t.Fatalf("%d settles charged, want 1", first.Load())
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000-2100 {
		t.Fatalf("%d tokens left, want %d", got, 10000-2100)
	}
}

func TestReservationNotFound(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	for _, id := range []string{"rsv_00000000000000000000000000000000", "nonsense"} {
		if _, err := rs.Settle(bg, t0, id, 1, 1); !errors.Is(err, ErrUnknownReservation) {
			t.Errorf("settle %q: %v, want ErrUnknownReservation", id, err)
		}
		if _, err := rs.Release(bg, t0, id, 1); !errors.Is(err, ErrUnknownReservation) {
			t.Errorf("release %q: %v, want ErrUnknownReservation", id, err)
		}
	}
	if _, err := rs.Settle(bg, t0, "", 1, 1); !errors.Is(err, ErrBadReservation) {
		t.Errorf("empty id: %v", err)
	}
	if _, err := rs.Settle(bg, t0, strings.Repeat("x", 65), 1, 1); !errors.Is(err, ErrBadReservation) {
		t.Errorf("long id: %v", err)
	}
}

func TestReserveBadInputChargesNothing(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{})
	d := []allot.Descriptor{tenant("acme")}
	ok := ReserveRequest{Domain: "llm", Descriptors: d, PromptTokens: 10, MaxTokens: 100}
	with := func(f func(*ReserveRequest)) ReserveRequest { r := ok; f(&r); return r }
	rows := []struct {
		name string
		req  ReserveRequest
		want error
	}{
		{"negative prompt", with(func(r *ReserveRequest) { r.PromptTokens = -1 }), ErrBadReservation},
		{"max_tokens 0", with(func(r *ReserveRequest) { r.MaxTokens = 0 }), ErrBadReservation},
		{"negative max_tokens", with(func(r *ReserveRequest) { r.MaxTokens = -5 }), ErrBadReservation},
		{"huge max_tokens", with(func(r *ReserveRequest) { r.MaxTokens = DefaultMaxTokens + 1 }), ErrBadReservation},
		{"huge prompt", with(func(r *ReserveRequest) { r.PromptTokens = 1 << 40 }), ErrBadReservation},
		{"estimate above max_tokens", with(func(r *ReserveRequest) { r.Estimate = 101 }), ErrBadReservation},
		{"negative estimate", with(func(r *ReserveRequest) { r.Estimate = -1 }), ErrBadReservation},
		{"ttl too long", with(func(r *ReserveRequest) { r.TTL = 2 * DefaultMaxTTL }), ErrBadReservation},
		{"model with a control character", with(func(r *ReserveRequest) { r.Model = "gpt\x00" }), ErrBadReservation},
		{"model too long", with(func(r *ReserveRequest) { r.Model = strings.Repeat("m", 129) }), ErrBadReservation},
		{"model not UTF-8", with(func(r *ReserveRequest) { r.Model = "\xff" }), ErrBadReservation},
		{"empty domain", with(func(r *ReserveRequest) { r.Domain = "" }), ErrBadReservation},
		{"unknown domain", with(func(r *ReserveRequest) { r.Domain = "nope" }), ErrUnknownDomain},
		{"no descriptors", with(func(r *ReserveRequest) { r.Descriptors = nil }), ErrBadDescriptor},
		{"empty descriptor", with(func(r *ReserveRequest) { r.Descriptors = []allot.Descriptor{{}} }), ErrBadDescriptor},
		{"empty key", with(func(r *ReserveRequest) { r.Descriptors = []allot.Descriptor{{{Key: "", Value: "x"}}} }), ErrBadDescriptor},
		{"prompt above the burst", with(func(r *ReserveRequest) { r.PromptTokens, r.MaxTokens = 10001, 10 }), ErrCostAboveBurst},
	}
	for _, row := range rows {
		if _, err := rs.Reserve(bg, t0, row.req); !errors.Is(err, row.want) {
			t.Errorf("%s: %v, want %v", row.name, err, row.want)
		}
	}
	if _, err := rs.Settle(bg, t0, "rsv_x", -1, 0); !errors.Is(err, ErrBadReservation) {
		t.Errorf("negative input_tokens: %v", err)
	}
	if _, err := rs.Release(bg, t0, "rsv_x", -1); !errors.Is(err, ErrBadReservation) {
		t.Errorf("negative used: %v", err)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 10000 {
		t.Fatalf("bad input charged: %d left", got)
	}
	if st := rs.Stats(); st.Active != 0 || st.ReservedTokens != 0 {
		t.Fatalf("bad input counted: %+v", st)
	}
	// A model never seen is fine: it starts from the fraction of max_tokens.
	r, err := rs.Reserve(bg, t0, with(func(r *ReserveRequest) { r.Model = "brand-new/model@2026 ✓" }))
	if err != nil || !r.Allowed || r.Estimate != 50 {
		t.Fatalf("new model: %+v, %v", r, err)
	}
}

// The estimate is the p90 of the settled outputs once there are enough,
// per limit and model, and never above max_tokens.
func TestEstimateLearnsP90(t *testing.T) {
	cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1m}
`
	rs := newReservations(t, cfg, ReservationOptions{MinSamples: 10, HalfLife: time.Hour})
	at := t0
	for i := range 100 {
		r := reserve(t, rs, at, "acme", 10, 4000)
		wantLearned := i >= 10
		if r.Learned != wantLearned {
			t.Fatalf("reservation %d: learned=%v, want %v", i, r.Learned, wantLearned)
		}
		if _, err := rs.Settle(bg, at, r.ID, 10, int64(i%100+1)*10); err != nil { // 10, 20, …, 1000
			t.Fatal(err)
		}
	}
	// The p90 is computed again every 16 samples: it may lag by as many.
	est, ok := rs.Estimate(at, "llm", "tenant-tokens", "m", 4000)
	if !ok || est < 810 || est > 900 {
		t.Fatalf("p90 of 10…1000: %d (learned %v), want 900, or 810 of the first 90", est, ok)
	}
	if r := reserve(t, rs, at, "acme", 10, 4000); r.Estimate != est || r.Reserved != 10+est || !r.Learned {
		t.Fatalf("reserve after learning: %+v", r)
	}
	if r := reserve(t, rs, at, "acme", 10, 300); r.Estimate != 300 {
		t.Fatalf("estimate above max_tokens: %d, want 300", r.Estimate)
	}
	// Another model has its own estimate; the caller's estimate wins.
	other, err := rs.Reserve(bg, at, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant("acme")}, PromptTokens: 10, MaxTokens: 4000, Model: "other"})
	if err != nil || other.Estimate != 2000 || other.Learned {
		t.Fatalf("other model: %+v %v", other, err)
	}
	mine, err := rs.Reserve(bg, at, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant("acme")}, PromptTokens: 10, MaxTokens: 4000, Model: "m", Estimate: 77})
	if err != nil || mine.Estimate != 77 {
		t.Fatalf("caller's estimate: %+v %v", mine, err)
	}
	// Old samples fade: after many half-lives the estimate falls back.
	if _, ok := rs.Estimate(at.Add(10*time.Hour), "llm", "tenant-tokens", "m", 4000); ok {
		t.Fatal("ten half-lives later the estimate is still learned")
	}
}

// A reserved amount above a limit's burst is cut to the burst; the real
// usage is then settled, even below zero.
func TestReserveCappedAtBurst(t *testing.T) {
	rs := newReservations(t, `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 1000/1m}
`, ReservationOptions{})
	r := reserve(t, rs, t0, "acme", 200, 10000) // 200 + 5000 > 1000
	if !r.Allowed || r.Reserved != 1000 || r.Estimate != 800 {
		t.Fatalf("%+v", r)
	}
}

// Request limits are charged one hit per reservation, and never by
// settlements; a rejection by either charges neither.
func TestReserveChargesRequestLimitsOneHit(t *testing.T) {
	rs := newReservations(t, `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 1000/1m}
  - {name: tenant-requests, match: {tenant: "*"}, rate: 2/1m}
`, ReservationOptions{})
	a := reserve(t, rs, t0, "acme", 10, 20)
	b := reserve(t, rs, t0, "acme", 10, 20)
	c := reserve(t, rs, t0, "acme", 10, 20)
	if !a.Allowed || !b.Allowed || c.Allowed || status(t, c.Decision, "tenant-requests").Allowed {
		t.Fatalf("a=%v b=%v c=%+v", a.Allowed, b.Allowed, c.Decision)
	}
	if got := tokensLeft(t, rs, t0, "acme"); got != 1000-40 {
		t.Fatalf("%d tokens left, want 960: the rejected request was charged", got)
	}
}

// Many goroutines reserve at once against a cap of 5: never more than 5
// in flight, and settled ones free their slots.
func TestConcurrencyCapInMemory(t *testing.T) {
	rs := newReservations(t, `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1m, concurrency: 5}
`, ReservationOptions{})
	// Five held: the sixth is refused by the cap, deterministically.
	var held []string
	for i := range 6 {
		r, err := rs.Reserve(bg, t0, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant("acme")}, PromptTokens: 1, MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != (i < 5) || (i == 5 && r.ConcurrencyLimit != "tenant-tokens") {
			t.Fatalf("reservation %d: %+v", i, r)
		}
		if r.Allowed {
			held = append(held, r.ID)
		}
	}
	for _, id := range held {
		if _, err := rs.Settle(bg, t0, id, 1, 5); err != nil {
			t.Fatal(err)
		}
	}
	var inFlight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 20 {
				r, err := rs.Reserve(bg, t0, ReserveRequest{Domain: "llm", Descriptors: []allot.Descriptor{tenant("acme")}, PromptTokens: 1, MaxTokens: 10})
				if err != nil {
					t.Error(err)
					return
				}
				if !r.Allowed {
					if r.ConcurrencyLimit != "tenant-tokens" {
						t.Errorf("rejected by %+v", r)
					}
					continue
				}
				admitted.Add(1)
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				inFlight.Add(-1) // before the settle frees the slot
				if _, err := rs.Settle(bg, t0, r.ID, 1, 5); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if peak.Load() > 5 || admitted.Load() < 5 {
		t.Fatalf("peak %d in flight (cap 5), %d admitted", peak.Load(), admitted.Load())
	}
	if st := rs.Stats(); st.Active != 0 || st.ConcurrencyRejections == 0 {
		t.Fatalf("stats: %+v", st)
	}
	if len(rs.slots) != 0 {
		t.Fatalf("slots left held: %v", rs.slots)
	}
}

// Leased and exact limits keep their concurrency slots in the regional
// store, so that two instances count one key's streams together; an
// expired reservation's slot is freed there too.
func TestConcurrencyCapInStore(t *testing.T) {
	cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000/1m, enforcement: exact, concurrency: 3}
`
	store := &MemoryStore{}
	instance := func(name string) *Reservations {
		e := New(mustConfig(t, cfg), Options{})
		f := NewEnforcer(e, store, EnforcerOptions{Region: "r", Instance: name})
		// OutputSlack: the overcharge below settles 2000 times max_tokens.
		return NewReservations(e, f, ReservationOptions{TTL: time.Minute, Rand: rand.New(rand.NewPCG(uint64(len(name)), 7)), OutputSlack: 2000})
	}
	a, b := instance("a"), instance("bb")
	ra := reserve(t, a, t0, "acme", 10, 100)
	rb := reserve(t, b, t0, "acme", 10, 100)
	rb2 := reserve(t, b, t0, "acme", 10, 100)
	if !ra.Allowed || !rb.Allowed || !rb2.Allowed {
		t.Fatal("three reservations under a cap of 3 rejected")
	}
	if r := reserve(t, a, t0, "acme", 10, 100); r.Allowed || r.ConcurrencyLimit != "tenant-tokens" || r.RetryAfter != DefaultConcurrencyRetry {
		t.Fatalf("fourth across two instances: %+v", r)
	}
	if _, err := b.Settle(bg, t0, rb.ID, 10, 10); err != nil {
		t.Fatal(err)
	}
	if r := reserve(t, a, t0, "acme", 10, 100); !r.Allowed {
		t.Fatalf("a settled slot was not freed: %+v", r)
	}
	// Instance b dies: its last reservation's slot expires with its TTL,
	// and the charge stays as reserved. (Redis expires the entry by itself;
	// the memory store at the next Acquire.)
	if r := reserve(t, a, t0.Add(time.Minute), "acme", 10, 100); !r.Allowed {
		t.Fatalf("the slot of a dead instance's reservation was not freed at its TTL: %+v", r)
	}
	// Extra usage is charged in the store, even below zero.
	rs, err := a.Settle(bg, t0.Add(time.Minute), ra.ID, 10, 200000)
	if err != nil || rs.Overcharged != 200010-60 {
		t.Fatalf("overcharge: %+v %v", rs, err)
	}
	if r := reserve(t, b, t0.Add(time.Minute), "other", 1, 2); !r.Allowed {
		t.Fatal("another tenant is affected")
	}
	if r := reserve(t, b, t0.Add(time.Minute), "acme", 1, 2); r.Allowed || r.RetryAfter < time.Minute {
		t.Fatalf("after an overcharge below zero in the store: %+v", r)
	}
	if a.Stats().StoreFailures != 0 || b.Stats().StoreFailures != 0 {
		t.Fatal("store failures")
	}
}

// When the store is down, concurrency follows on_failure.
func TestConcurrencyStoreDown(t *testing.T) {
	for _, row := range []struct {
		policy string
		admit  int // of 4 reservations, a second apart, cap 4, 2 instances seen
	}{{"open", 4}, {"closed", 0}, {"local", 2}} {
		t.Run(row.policy, func(t *testing.T) {
			cfg := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000/1m, enforcement: exact, concurrency: 4, on_failure: ` + row.policy + `}
`
			store := &MemoryStore{}
			e := New(mustConfig(t, cfg), Options{})
			f := NewEnforcer(e, store, EnforcerOptions{Region: "r", Instance: "a"})
			store.Heartbeat(bg, t0, "r", "b", time.Hour)
			f.Tick(bg, t0) // sees 2 instances
			store.SetErr(errors.New("down"))
			rs := NewReservations(e, f, ReservationOptions{Rand: rand.New(rand.NewPCG(1, 1))})
			// local: the fallback's token bucket is empty when it begins
			// (the first is rejected), then the cap of 4 ÷ 2 holds.
			n := 0
			for i := range 4 {
				if reserve(t, rs, t0.Add(time.Duration(i)*time.Second), "acme", 1, 2).Allowed {
					n++
				}
			}
			if n != row.admit {
				t.Fatalf("%d admitted, want %d", n, row.admit)
			}
		})
	}
}

func TestWindowSketch(t *testing.T) {
	w := NewWindowSketch(10)
	if w.Quantile(0.9) != 0 || w.Count() != 0 {
		t.Fatal("empty sketch")
	}
	for i := 1; i <= 20; i++ {
		w.Add(float64(i))
	}
	// Holds 11…20.
	if w.Count() != 10 || w.Quantile(0.9) != 19 || w.Quantile(0.5) != 15 {
		t.Fatalf("count %v p90 %v p50 %v", w.Count(), w.Quantile(0.9), w.Quantile(0.5))
	}
	w.Decay(0.5) // keeps the 5 newest
	if w.Count() != 5 || w.Quantile(0.01) != 16 {
		t.Fatalf("after decay: count %v min %v", w.Count(), w.Quantile(0.01))
	}
}

func TestEstimatorBoundsModels(t *testing.T) {
	rs := newReservations(t, reserveConfig, ReservationOptions{MaxModels: 2, MinSamples: 1})
	for i, m := range []string{"a", "b", "c", "d"} {
		rs.est.observe("llm", "tenant-tokens", m, int64(100*(i+1)), t0.UnixNano())
	}
	if len(rs.est.entries) != 3 {
		t.Fatalf("%d entries for 4 models with MaxModels 2, want 2 + other", len(rs.est.entries))
	}
	// c and d share one estimate; a keeps its own.
	if e, _ := rs.Estimate(t0, "llm", "tenant-tokens", "a", 1000); e != 100 {
		t.Fatalf("a: %d", e)
	}
	if e, _ := rs.Estimate(t0, "llm", "tenant-tokens", "zzz", 1000); e != 400 {
		t.Fatalf("an unseen model past the bound: %d, want the shared estimate 400", e)
	}
}
