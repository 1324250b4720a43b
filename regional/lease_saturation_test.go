package regional

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// TestLeasedSaturatedKeyUsesItsAllowance offers a leased key 600/s against
// its 430/s, Poisson, to 1 and to 4 instances over one store for 30 s of
// virtual time (Tick every 100 ms), and counts what they admit in each
// window. A saturated sliding window used to admit 318/s with one
// instance (74%): a lease short of a whole one waited for it, and what the
// store and the leases held when a window ended was lost. It must now use
// ≥ 99% of its allowance in every algorithm, never pass it in a window,
// and make no more lease calls than before (370 and 2,328 for the
// sliding window, 382 and 2,209 for the token bucket).
func TestLeasedSaturatedKeyUsesItsAllowance(t *testing.T) {
	const rate, offered = 430, 600
	const warmup, dur = 5 * time.Second, 30 * time.Second
	for _, tc := range []struct {
		alg       string
		instances int
		calls     int64 // at most
	}{
		{"sliding_window", 1, 370},
		{"sliding_window", 4, 2328},
		{"token_bucket", 1, 382},
		{"token_bucket", 4, 2209},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.alg, tc.instances), func(t *testing.T) {
			cfg := fmt.Sprintf(`
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: %d/1s, algorithm: %s, enforcement: leased}
`, rate, tc.alg)
			s := &countingStore{Store: &MemoryStore{}}
			var fs []*Enforcer
			for i := range tc.instances {
				f := newEnforcer(t, cfg, s, fmt.Sprint(i))
				f.Tick(context.Background(), t0)
				fs = append(fs, f)
			}
			rng := rand.New(rand.NewSource(1))
			perWindow := map[int64]int{}
			admitted := 0
			var now, tick time.Duration
			for now < dur {
				now += time.Duration(rng.ExpFloat64() / offered * 1e9)
				for ; tick <= now; tick += 100 * time.Millisecond {
					for _, f := range fs {
						f.Tick(context.Background(), t0.Add(tick))
					}
				}
				if check(t, fs[rng.Intn(len(fs))], t0.Add(now), user("1"), 1).Allowed {
					perWindow[t0.Add(now).Unix()]++
					if now >= warmup {
						admitted++
					}
				}
			}
			for w, n := range perWindow {
				if tc.alg == "sliding_window" && n > rate {
					t.Errorf("window %d admitted %d, above %d", w-t0.Unix(), n, rate)
				}
			}
			got := float64(admitted) / (dur - warmup).Seconds()
			calls := s.leases.Load()
			t.Logf("%.1f/s admitted (%.2f%% of %d), %d lease calls", got, 100*got/rate, rate, calls)
			if got < 0.99*rate {
				t.Errorf("admitted %.1f/s, want ≥ 99%% of %d", got, rate)
			}
			if calls > tc.calls {
				t.Errorf("%d lease calls, want at most %d", calls, tc.calls)
			}
		})
	}
}
