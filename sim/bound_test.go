package sim

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// bucketLimit is a token bucket of rate per second and burst.
func bucketLimit(rate, burst int64) *allot.Limit {
	return &allot.Limit{Name: "b", Algorithm: allot.TokenBucket, Rate: allot.Rate{Amount: rate, Period: time.Second}, Burst: burst}
}

// TestBoundCheck: admissions at fixed instants against B + r·T, B = 10,
// r = 10/s.
func TestBoundCheck(t *testing.T) {
	ms := func(n int) time.Time { return T0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name  string
		at    []int     // ms
		cost  []float64 // one per admission
		above int
		worst float64
		from  time.Duration
	}{
		{"burst alone", []int{0}, []float64{10}, 0, 0, 0},
		{"burst and one", []int{0, 0}, []float64{10, 1}, 1, 1, 0},
		{"refilled", []int{0, 100}, []float64{10, 1}, 0, 0, 0},
		{"refill short", []int{0, 50}, []float64{10, 1}, 1, 0.5, 0},
		{"later interval", []int{0, 1000, 1000}, []float64{5, 10, 1}, 1, 1, time.Second},
		{"rate", []int{0, 1000, 2000}, []float64{10, 10, 10}, 0, 0, 0},
		{"above over two", []int{0, 1000, 2000}, []float64{10, 10, 12}, 1, 2, 0},
		{"two keys are apart", []int{0, 0}, []float64{10, 10}, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBoundCheck(bucketLimit(10, 10), 2)
			for i, at := range tc.at {
				id := 0
				if tc.name == "two keys are apart" {
					id = i
				}
				b.add(ms(at), id, tc.cost[i])
			}
			if b.above != tc.above || b.worst < tc.worst-1e-9 || b.worst > tc.worst+1e-9 || tc.above > 0 && b.from != tc.from {
				t.Errorf("above %d, worst %g from %v; want %d, %g from %v", b.above, b.worst, b.from, tc.above, tc.worst, tc.from)
			}
		})
	}
}

// TestBoundCheckIsTheWorstInterval: the linear scan finds the largest
// excess over every interval that the quadratic one finds.
func TestBoundCheckIsTheWorstInterval(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 500 {
		rate, burst := int64(1+rng.IntN(50)), int64(1+rng.IntN(100))
		b := newBoundCheck(bucketLimit(rate, burst), 1)
		var at []time.Duration
		var cost []float64
		now := time.Duration(0)
		for range 1 + rng.IntN(60) {
			now += time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(200)) * time.Millisecond
			c := float64(1 + rng.IntN(int(burst)))
			at, cost = append(at, now), append(cost, c)
			b.add(T0.Add(now), 0, c)
		}
		worst, above := 0.0, 0
		for j := range at {
			end := 0.0
			for i := j; i >= 0; i-- {
				sum := 0.0
				for k := i; k <= j; k++ {
					sum += cost[k]
				}
				end = max(end, sum-float64(burst)-float64(rate)*(at[j]-at[i]).Seconds())
			}
			if end > boundTolerance {
				above++
			}
			worst = max(worst, end)
		}
		if b.above != above || b.worst < worst-1e-6 || b.worst > worst+1e-6 {
			t.Fatalf("run %d (r %d, B %d): scan above %d worst %g; every interval: above %d worst %g", run, rate, burst, b.above, b.worst, above, worst)
		}
	}
}

// TestConfigEventChecks: a config event may lower L and drop regions; it
// may not add a region or change what the B + r·T check follows.
func TestConfigEventChecks(t *testing.T) {
	scenario := func(alg, next string) string {
		return `name: x
duration: 10s
config: |
  domain: api
  regions: [us, eu]
  limits:
    - {name: per-user, match: {user: "*"}, rate: 100/1s, algorithm: ` + alg + `, mode: split, enforcement: local}
regions: [{name: us}, {name: eu}]
traffic: [{region: us, rate: 10}]
faults:
  - kind: config
    at: 5s
    config: |
      domain: api
      regions: [` + next + `
`
	}
	limit := func(rate, alg string) string {
		return `]
      limits:
        - {name: per-user, match: {user: "*"}, rate: ` + rate + `, algorithm: ` + alg + `, mode: split, enforcement: local}`
	}
	for _, tc := range []struct {
		name, src, err string
	}{
		{"lowered", scenario("sliding_window", "us, eu"+limit("50/1s", "sliding_window")), ""},
		{"region removed", scenario("sliding_window", "us"+limit("100/1s", "sliding_window")), ""},
		{"region added", scenario("sliding_window", "us, eu, ap"+limit("100/1s", "sliding_window")), "a config event may remove regions"},
		{"algorithm", scenario("sliding_window", "us, eu"+limit("100/1s", "token_bucket")), "changes its algorithm"},
		{"window", scenario("sliding_window", "us, eu"+limit("100/2s", "sliding_window")), "changes its algorithm, mode, unit or window"},
		{"bucket rate", scenario("token_bucket", "us, eu"+limit("50/1s", "token_bucket")), "B + r·T check follows one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse(tc.name, []byte(tc.src))
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error with %q", err, tc.err)
			}
		})
	}
}

// TestLoweredLimit: the window in which L is lowered may hold what a key
// had admitted when it was lowered, and no more than the new L beyond;
// windows before keep the old L, windows after take the new one.
func TestLoweredLimit(t *testing.T) {
	l := &allot.Limit{Name: "w", Algorithm: allot.SlidingWindow, Rate: allot.Rate{Amount: 1000, Period: time.Second}}
	d := &allot.Domain{Name: "api", Regions: []string{"us"}}
	ks := &keySpace{values: []string{"k0", "k1"}, hot: -1}
	m := newMetrics(&Scenario{}, l, d, ks, false)
	at := func(ms int) time.Time { return T0.Add(time.Duration(ms) * time.Millisecond) }
	m.add(at(1100), 0, 0, 800, 800, 0) // k0: 800 in window 1
	m.add(at(1200), 0, 1, 300, 300, 0) // k1: 300
	m.relimit(at(1500), 500)
	for _, tc := range []struct {
		id   int
		w    int64
		want float64
	}{{0, 0, 1000}, {0, 1, 800}, {1, 1, 500}, {0, 2, 500}, {1, 2, 500}} {
		if got := m.limit(keyWindow{tc.id, tc.w}); got != tc.want {
			t.Errorf("key %d window %d: L %g, want %g", tc.id, tc.w, got, tc.want)
		}
	}
	m.relimit(at(2500), 2000) // a raise counts from the next window
	if got := m.limit(keyWindow{0, 2}); got != 500 {
		t.Errorf("window of a raise: L %g, want 500", got)
	}
	if got := m.limit(keyWindow{0, 3}); got != 2000 {
		t.Errorf("window after a raise: L %g, want 2000", got)
	}
}
