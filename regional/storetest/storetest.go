// Package storetest checks that a regional.Store keeps the contract the
// Enforcer relies on. regional.MemoryStore and regional/redisstore run
// the same checks, so the Lua scripts and the Go bucket math agree.
//
// The checks run on the wall clock (a Redis store takes its time from
// Redis) with periods long enough that the time they take refills
// nothing measurable.
package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// Run checks s. It uses keys of its own, so s may be shared.
func Run(t *testing.T, s regional.Store) {
	prefix := fmt.Sprintf("storetest-%x/", rand.Uint64())
	bucket := func(name string, alg allot.Algorithm, amount, burst float64, period time.Duration) regional.Bucket {
		return regional.Bucket{Key: prefix + name, Algorithm: alg, Amount: amount, Burst: burst, Period: period}
	}
	for _, alg := range []allot.Algorithm{allot.TokenBucket, allot.GCRA} {
		t.Run("take "+alg.String(), func(t *testing.T) {
			b := bucket("take-"+alg.String(), alg, 6, 5, time.Hour) // one token every 10 minutes
			for i := range 5 {
				r := take(t, s, regional.TakeOp{Bucket: b, Cost: 1})[0]
				if !r.Allowed || r.Remaining != float64(4-i) || !near(r.ResetAfter, time.Duration(i+1)*10*time.Minute) {
					t.Fatalf("take %d: %+v", i, r)
				}
			}
			r := take(t, s, regional.TakeOp{Bucket: b, Cost: 1})[0]
			if r.Allowed || !near(r.RetryAfter, 10*time.Minute) {
				t.Fatalf("6th take: %+v, want rejected, retry after 10m", r)
			}
		})
	}
	t.Run("take sliding_window", func(t *testing.T) {
		b := bucket("window", allot.SlidingWindow, 3, 3, 24*time.Hour)
		if left := 24*time.Hour - time.Duration(time.Now().UnixNano()%int64(24*time.Hour)); left < time.Minute {
			t.Skip("too close to the end of a window")
		}
		for i := range 3 {
			if r := take(t, s, regional.TakeOp{Bucket: b, Cost: 1})[0]; !r.Allowed || r.Remaining != float64(2-i) {
				t.Fatalf("take %d: %+v", i, r)
			}
		}
		if r := take(t, s, regional.TakeOp{Bucket: b, Cost: 1})[0]; r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("4th take: %+v, want rejected with a retry", r)
		}
	})
	t.Run("take charges all or nothing", func(t *testing.T) {
		a := bucket("all-a", allot.TokenBucket, 1, 5, time.Hour)
		b := bucket("all-b", allot.GCRA, 1, 3, time.Hour)
		ops := []regional.TakeOp{{Bucket: a, Cost: 2}, {Bucket: b, Cost: 2}}
		if r := take(t, s, ops...); !r[0].Allowed || !r[1].Allowed {
			t.Fatalf("first: %+v", r)
		}
		if r := take(t, s, ops...); !r[0].Allowed || r[1].Allowed {
			t.Fatalf("second: %+v, want a admitting and b rejecting", r)
		}
		if r := take(t, s, regional.TakeOp{Bucket: a}, regional.TakeOp{Bucket: b})[0]; r.Remaining != 3 {
			t.Fatalf("a after a rejected request: %v left, want 3 (not charged)", r.Remaining)
		}
	})
	t.Run("take: a shadow op never rejects", func(t *testing.T) {
		a := bucket("shadow-a", allot.TokenBucket, 1, 5, time.Hour)
		sh := bucket("shadow-s", allot.TokenBucket, 1, 1, time.Hour)
		for i, wantShadow := range []bool{true, false} {
			r := take(t, s, regional.TakeOp{Bucket: a, Cost: 1}, regional.TakeOp{Bucket: sh, Cost: 1, Shadow: true})
			if !r[0].Allowed || r[1].Allowed != wantShadow || r[0].Remaining != float64(4-i) {
				t.Fatalf("take %d: %+v", i, r)
			}
		}
	})
	t.Run("take: ops on one key add up", func(t *testing.T) {
		a := bucket("twice", allot.TokenBucket, 1, 3, time.Hour)
		if r := take(t, s, regional.TakeOp{Bucket: a, Cost: 2}, regional.TakeOp{Bucket: a, Cost: 2}); !r[0].Allowed || r[1].Allowed {
			t.Fatalf("2 + 2 on a burst of 3: %+v", r)
		}
		if r := take(t, s, regional.TakeOp{Bucket: a})[0]; r.Remaining != 3 {
			t.Fatalf("after a rejected request: %v left, want 3", r.Remaining)
		}
	})
	for _, alg := range []allot.Algorithm{allot.TokenBucket, allot.GCRA, allot.SlidingWindow} {
		t.Run("lease "+alg.String(), func(t *testing.T) {
			b := bucket("lease-"+alg.String(), alg, 10, 10, 24*time.Hour)
			const granted, long = 1, 2 // the window a row returns to: the grants', one long gone
			rows := []struct {
				op             regional.LeaseOp
				granted, avail float64
				retry          bool
				window         int
			}{
				{regional.LeaseOp{Min: 1, Want: 4}, 4, 6, false, 0},
				{regional.LeaseOp{Min: 7, Want: 8}, 0, 6, true, 0},
				{regional.LeaseOp{Min: 1, Want: 8}, 6, 0, false, 0},
				{regional.LeaseOp{Return: 5}, 0, 5, false, granted},
				{regional.LeaseOp{Return: 5}, 0, 5, false, long}, // sliding_window only
				{regional.LeaseOp{Return: 1}, 0, 6, false, 0},    // sliding_window: to the current window
			}
			var window int64
			for i, row := range rows {
				row.op.Bucket = b
				switch row.window {
				case granted:
					row.op.Window = window
				case long:
					if alg != allot.SlidingWindow {
						continue
					}
					row.op.Window = window - 2*int64(b.Period)
				}
				r := lease(t, s, row.op)
				if r.Granted != row.granted || r.Available != row.avail || (r.RetryAfter > 0) != row.retry {
					t.Fatalf("row %d %+v: got %+v", i, row.op, r)
				}
				if alg == allot.SlidingWindow && (r.Window == 0 || r.WindowLeft <= 0 || r.WindowLeft > 24*time.Hour) {
					t.Fatalf("row %d: window %d, %v left", i, r.Window, r.WindowLeft)
				}
				window = r.Window
			}
		})
	}
	t.Run("lease sliding_window ahead", func(t *testing.T) {
		// A 300ms window of 10: the first takes all 10; early in the next,
		// whose weighted estimate still counts most of them, a lease takes
		// what the window holds now, and one looking ahead (past the
		// window's end: to its end) what it will hold at its end, never more
		// than the window's amount in all.
		const period = 300 * time.Millisecond
		b := bucket("ahead", allot.SlidingWindow, 10, 10, period)
		first := lease(t, s, regional.LeaseOp{Bucket: b, Min: 10, Want: 10})
		if first.Granted != 10 {
			t.Fatalf("first lease: %+v, want all 10", first)
		}
		time.Sleep(first.WindowLeft + 20*time.Millisecond)
		now := lease(t, s, regional.LeaseOp{Bucket: b, Min: 1, Want: 10})
		if now.Window != first.Window+int64(period) || now.WindowLeft < period/2 {
			t.Skipf("not early in the next window: %+v after %+v", now, first)
		}
		if now.Granted > 5 {
			t.Fatalf("early in the next window: granted %v, want what the weighted estimate leaves (at most 5)", now.Granted)
		}
		ahead := lease(t, s, regional.LeaseOp{Bucket: b, Min: 1, Want: 10, Ahead: time.Hour})
		if ahead.Window != now.Window {
			t.Skipf("the window ended: %+v", ahead)
		}
		if ahead.Granted != 9-now.Granted {
			t.Fatalf("looking ahead to the window's end: granted %v after %v, want %v (10 less a hair of the previous window)", ahead.Granted, now.Granted, 9-now.Granted)
		}
		if again := lease(t, s, regional.LeaseOp{Bucket: b, Min: 1, Want: 10, Ahead: time.Hour}); again.Granted != 0 && again.Window == now.Window {
			t.Fatalf("a window's leases passed its amount: %+v", again)
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		region := prefix + "region"
		for i, step := range []struct {
			instance string
			ttl      time.Duration
			want     int
		}{{"a", time.Minute, 1}, {"b", time.Minute, 2}, {"c", 300 * time.Millisecond, 3}, {"a", 0, 2}} {
			if n := heartbeat(t, s, region, step.instance, step.ttl); n != step.want {
				t.Fatalf("step %d: %d live, want %d", i, n, step.want)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for heartbeat(t, s, region, "b", time.Minute) != 1 {
			if time.Now().After(deadline) {
				t.Fatal("c never expired")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// near reports whether d is within a second of want.
func near(d, want time.Duration) bool { return math.Abs(float64(d-want)) <= float64(time.Second) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func take(t *testing.T, s regional.Store, ops ...regional.TakeOp) []regional.TakeResult {
	t.Helper()
	res := make([]regional.TakeResult, len(ops))
	if err := s.Take(ctx(t), time.Now(), ops, res); err != nil {
		t.Fatalf("take: %v", err)
	}
	return res
}

func lease(t *testing.T, s regional.Store, op regional.LeaseOp) regional.LeaseResult {
	t.Helper()
	res := make([]regional.LeaseResult, 1)
	if err := s.Lease(ctx(t), time.Now(), []regional.LeaseOp{op}, res); err != nil {
		t.Fatalf("lease: %v", err)
	}
	return res[0]
}

func heartbeat(t *testing.T, s regional.Store, region, instance string, ttl time.Duration) int {
	t.Helper()
	n, err := s.Heartbeat(ctx(t), time.Now(), region, instance, ttl)
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	return n
}
