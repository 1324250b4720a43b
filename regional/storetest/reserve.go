package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// ReservationStore is a regional Store that keeps reservations' state.
type ReservationStore interface {
	regional.Store
	regional.ReservationStore
}

// RunReservations checks what reservations need of s: charges below zero
// and concurrency slots. It uses keys of its own, so s may be shared.
func RunReservations(t *testing.T, s ReservationStore) {
	prefix := fmt.Sprintf("storetest-rsv-%x/", rand.Uint64())
	for _, alg := range []allot.Algorithm{allot.TokenBucket, allot.GCRA, allot.SlidingWindow} {
		t.Run("charge below zero "+alg.String(), func(t *testing.T) {
			// 1000 an hour: one token every 3.6s.
			b := regional.Bucket{Key: prefix + "charge-" + alg.String(), Algorithm: alg, Amount: 1000, Burst: 1000, Period: time.Hour}
			if alg == allot.SlidingWindow {
				b.Period = 24 * time.Hour
				if left := 24*time.Hour - time.Duration(time.Now().UnixNano()%int64(24*time.Hour)); left < time.Minute {
					t.Skip("too close to the end of a window")
				}
			}
			if r := take(t, s, regional.TakeOp{Bucket: b, Cost: 990})[0]; !r.Allowed {
				t.Fatalf("take: %+v", r)
			}
			res := make([]regional.TakeResult, 2)
			if err := s.Charge(ctx(t), time.Now(), []regional.TakeOp{{Bucket: b, Cost: 15}, {Bucket: b, Cost: 5}}, res); err != nil {
				t.Fatal(err)
			}
			if res[1].Remaining != 0 || !res[1].Allowed {
				t.Fatalf("charge: %+v", res)
			}
			// 1010 charged of 1000: the next token is 11 tokens away.
			r := take(t, s, regional.TakeOp{Bucket: b, Cost: 1})[0]
			if r.Allowed {
				t.Fatalf("take after a charge below zero: %+v, want rejected", r)
			}
			if alg != allot.SlidingWindow && !near(r.RetryAfter, 11*3600*time.Millisecond) {
				t.Fatalf("retry after %v, want ≈ 39.6s", r.RetryAfter)
			}
		})
	}
	slot := func(name string, cap int64, holder string, ttl time.Duration) regional.SlotOp {
		return regional.SlotOp{Key: prefix + name, Cap: cap, Holder: holder, TTL: ttl}
	}
	acquire := func(t *testing.T, ops ...regional.SlotOp) []regional.SlotResult {
		t.Helper()
		res := make([]regional.SlotResult, len(ops))
		if err := s.Acquire(ctx(t), time.Now(), ops, res); err != nil {
			t.Fatalf("acquire: %v", err)
		}
		return res
	}
	free := func(t *testing.T, ops ...regional.SlotOp) {
		t.Helper()
		if err := s.Free(ctx(t), time.Now(), ops); err != nil {
			t.Fatalf("free: %v", err)
		}
	}
	t.Run("slots", func(t *testing.T) {
		for i, h := range []string{"a", "b"} {
			if r := acquire(t, slot("cap2", 2, h, time.Hour))[0]; !r.Allowed || r.InFlight != int64(i+1) {
				t.Fatalf("acquire %s: %+v", h, r)
			}
		}
		if r := acquire(t, slot("cap2", 2, "a", time.Hour))[0]; !r.Allowed {
			t.Fatalf("a holder acquiring again: %+v", r)
		}
		r := acquire(t, slot("cap2", 2, "c", time.Hour))[0]
		if r.Allowed || r.InFlight != 2 || !near(r.RetryAfter, time.Hour) {
			t.Fatalf("third holder: %+v, want rejected until the first expires", r)
		}
		free(t, slot("cap2", 2, "a", 0))
		if r := acquire(t, slot("cap2", 2, "c", time.Hour))[0]; !r.Allowed {
			t.Fatalf("after a free: %+v", r)
		}
		free(t, slot("cap2", 2, "nobody", 0)) // freeing what is not held is harmless
	})
	t.Run("slots all or nothing", func(t *testing.T) {
		acquire(t, slot("full", 1, "x", time.Hour))
		res := acquire(t, slot("room", 1, "y", time.Hour), slot("full", 1, "y", time.Hour))
		if res[1].Allowed {
			t.Fatalf("%+v", res)
		}
		if r := acquire(t, slot("room", 1, "z", time.Hour))[0]; !r.Allowed {
			t.Fatalf("a rejected acquire kept its other slot: %+v", r)
		}
	})
	t.Run("slots expire", func(t *testing.T) {
		if r := acquire(t, slot("ttl", 1, "gone", 50*time.Millisecond))[0]; !r.Allowed {
			t.Fatal(r)
		}
		// Nobody frees it: it frees itself. Poll until it has.
		deadline := time.Now().Add(5 * time.Second)
		for {
			if r := acquire(t, slot("ttl", 1, "next", time.Hour))[0]; r.Allowed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("an expired holder still holds its slot")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
