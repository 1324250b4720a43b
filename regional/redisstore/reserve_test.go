package redisstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/storetest"
)

func TestReservationStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	storetest.RunReservations(t, newStore(t, redisstore.Options{Addrs: []string{srv.Addr}}))
}

func TestReservationStoreContractCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	storetest.RunReservations(t, newStore(t, redisstore.Options{Addrs: c.Addrs(), Cluster: true}))
}

// reservations is one instance's Reservations on the shared Redis.
func reservations(t *testing.T, yaml, id string, addr string, ttl time.Duration) *regional.Reservations {
	t.Helper()
	f, _ := instance(t, yaml, id, redisstore.Options{Addrs: []string{addr}}, time.Second)
	return regional.NewReservations(f.Engine(), f, regional.ReservationOptions{TTL: ttl, Rand: rand.New(rand.NewPCG(rand.Uint64(), 1))})
}

func reserveOne(rs *regional.Reservations, who string, prompt, est int64) (regional.Reservation, error) {
	return rs.Reserve(context.Background(), time.Now(), regional.ReserveRequest{Domain: "llm",
		Descriptors: []allot.Descriptor{desc("tenant", who)}, PromptTokens: prompt, MaxTokens: max(est, 1), Estimate: est})
}

// left is what the tenant's token budget holds in the store.
func left(t *testing.T, rs *regional.Reservations, f *regional.Enforcer, who string) int64 {
	t.Helper()
	var dec allot.Decision
	items := []regional.Item{{Descriptor: desc("tenant", who), OnlyUnit: true, Unit: allot.Tokens}}
	if err := f.CheckItems(context.Background(), time.Now(), "llm", items, &dec); err != nil {
		t.Fatal(err)
	}
	return dec.Statuses[0].Remaining
}

// Against one tenant's budget in the regional Redis, 500 parallel
// reservations from two instances are admitted only up to the budget:
// the burst that charging after the response lets through does not pass.
func TestReservationsParallelUpToBudget(t *testing.T) {
	srv := redistest.Start(t)
	for _, enf := range []string{"exact", "leased"} {
		t.Run(enf, func(t *testing.T) {
			// 10000 tokens an hour: 2.8 a second refill during the test.
			yaml := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 10000/1h, enforcement: ` + enf + `}
`
			insts := []*regional.Reservations{reservations(t, yaml, "a", srv.Addr, time.Hour), reservations(t, yaml, "b", srv.Addr, time.Hour)}
			who := "acme-" + enf
			var admitted, tokens atomic.Int64
			var wg sync.WaitGroup
			for i := range 500 {
				wg.Go(func() {
					r, err := reserveOne(insts[i%2], who, 100, 100)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admitted.Add(1)
						tokens.Add(r.Reserved)
					}
				})
			}
			wg.Wait()
			// 50 reservations of 200 fill the budget; a token or two refill.
			if n := admitted.Load(); n > 50 || n < 40 {
				t.Fatalf("%d of 500 admitted (%d tokens), want at most the 50 the budget holds", n, tokens.Load())
			}
			t.Logf("%s: %d of 500 parallel reservations admitted, %d tokens of a 10000 budget", enf, admitted.Load(), tokens.Load())
		})
	}
}

func TestReservationsSettleOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	yaml := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 3600000/1h, burst: 10000, enforcement: exact}
`
	f, _ := instance(t, yaml, "a", redisstore.Options{Addrs: []string{srv.Addr}}, time.Second)
	// OutputSlack: the settle above declares 196 times max_tokens.
	rs := regional.NewReservations(f.Engine(), f, regional.ReservationOptions{OutputSlack: 200})
	ctx := context.Background()
	// 1000 tokens a second: allow for the refill while the test runs.
	within := func(got, want int64) bool { return got >= want && got <= want+1000 }

	r, err := reserveOne(rs, "acme", 1000, 4000) // holds 5000
	if err != nil || !r.Allowed || r.Reserved != 5000 {
		t.Fatalf("%+v %v", r, err)
	}
	if got := left(t, rs, f, "acme"); !within(got, 5000) {
		t.Fatalf("%d left after reserving 5000 of 10000", got)
	}
	s, err := rs.Settle(ctx, time.Now(), r.ID, 1000, 1000) // used 2000: 3000 back
	if err != nil || s.Refunded != 3000 {
		t.Fatalf("settle below: %+v %v", s, err)
	}
	if got := left(t, rs, f, "acme"); !within(got, 8000) {
		t.Fatalf("%d left after the refund, want 8000", got)
	}
	if again, err := rs.Settle(ctx, time.Now(), r.ID, 1000, 1000); err != nil || !again.Repeat {
		t.Fatalf("second settle: %+v %v", again, err)
	}
	if got := left(t, rs, f, "acme"); !within(got, 8000) {
		t.Fatalf("%d left after a repeated settle: charged twice", got)
	}
	// Above: 500 reserved, 20000 used: the budget goes 10000+ below zero.
	r, _ = reserveOne(rs, "acme", 400, 100)
	s, err = rs.Settle(ctx, time.Now(), r.ID, 400, 19600)
	if err != nil || s.Overcharged != 19500 {
		t.Fatalf("settle above: %+v %v", s, err)
	}
	// ≈ 8000 − 20000 = −12000: a request of 100 waits ≈ 12.1 s at 1000/s.
	next, err := reserveOne(rs, "acme", 50, 50)
	if err != nil || next.Allowed {
		t.Fatalf("after the overcharge: %+v %v", next, err)
	}
	if next.RetryAfter < 11*time.Second || next.RetryAfter > 12200*time.Millisecond {
		t.Fatalf("retry after %v, want ≈ 12.1s", next.RetryAfter)
	}
	if _, err := rs.Settle(ctx, time.Now(), "rsv_unknown", 1, 1); !errors.Is(err, regional.ErrUnknownReservation) {
		t.Fatalf("unknown id: %v", err)
	}
}

// A reservation whose gateway (and instance) dies is never settled: its
// concurrency slot in Redis frees itself at its TTL. Under parallel load
// from two instances the cap holds.
func TestReservationsConcurrencyOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	yaml := `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 100000000/1h, enforcement: exact, concurrency: 5}
`
	t.Run("expiry frees the slot", func(t *testing.T) {
		dead := reservations(t, yaml, "dead", srv.Addr, 300*time.Millisecond)
		live := reservations(t, yaml, "live", srv.Addr, time.Minute)
		for range 5 {
			if r, err := reserveOne(dead, "crash", 10, 10); err != nil || !r.Allowed {
				t.Fatalf("%+v %v", r, err)
			}
		}
		r, err := reserveOne(live, "crash", 10, 10)
		if err != nil || r.Allowed || r.ConcurrencyLimit != "tenant-tokens" || r.RetryAfter <= 0 || r.RetryAfter > time.Second {
			t.Fatalf("sixth: %+v %v", r, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for { // the dead instance never ticks: Redis expires its entries
			if r, err := reserveOne(live, "crash", 10, 10); err == nil && r.Allowed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the slots of a dead instance's reservations were not freed")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	t.Run("cap under parallel load", func(t *testing.T) {
		insts := []*regional.Reservations{reservations(t, yaml, "p", srv.Addr, time.Minute), reservations(t, yaml, "q", srv.Addr, time.Minute)}
		var inFlight, peak, admitted, rejected atomic.Int64
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				rs := insts[i%2]
				for range 25 {
					r, err := reserveOne(rs, "busy", 10, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if !r.Allowed {
						rejected.Add(1)
						continue
					}
					admitted.Add(1)
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					inFlight.Add(-1)
					if _, err := rs.Settle(context.Background(), time.Now(), r.ID, 10, 5); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if peak.Load() > 5 || admitted.Load() == 0 || rejected.Load() == 0 {
			t.Fatalf("peak %d in flight (cap 5), %d admitted, %d rejected", peak.Load(), admitted.Load(), rejected.Load())
		}
	})
}
