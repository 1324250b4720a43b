package regional

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestLoansNeverCreateAllowance: whatever the loss, duplication,
// reordering and delay of Lend messages and answers, cuts between
// regions and their shares (Σ ≤ 1), loans only move allowance:
//
//   - Σ over regions of tokens credited by loans ≤ Σ tokens lent, at
//     every instant, so Σ allowance in force ≤ L;
//   - with sliding_window, every fixed window admits at most L over all
//     regions.
func TestLoansNeverCreateAllowance(t *testing.T) {
	runs, withLoans := 0, 0
	defer func() { t.Logf("%d of %d runs credited loans", withLoans, runs) }()
	rapid.Check(t, func(rt *rapid.T) {
		alg := rapid.SampledFrom([]string{"sliding_window", "token_bucket", "gcra"}).Draw(rt, "alg")
		amount := rapid.Int64Range(10, 2000).Draw(rt, "amount")
		n := rapid.IntRange(2, 4).Draw(rt, "regions")
		names := []string{"a", "b", "c", "d"}[:n]
		cfg := fmt.Sprintf("domain: api\nregions: [a, b, c, d]\nlimits:\n  - {name: global, match: {user: \"*\"}, rate: %d/1s, algorithm: %s}\n", amount, alg)
		shares := make([]float64, n) // Σ ≤ 1, some region may hold more than 1/n
		left := 1.0
		for i := n - 1; i >= 0; i-- {
			shares[i] = math.Floor(rapid.Float64Range(0, max(left, 0)).Draw(rt, fmt.Sprintf("share%d", i))*1e6) / 1e6
			left -= shares[i]
		}
		s := newPeerSim(rt, cfg, names, shares, rapid.Uint64().Draw(rt, "seed"))
		s.loss = rapid.Float64Range(0, 0.5).Draw(rt, "loss")
		s.dup = rapid.Float64Range(0, 0.5).Draw(rt, "dup")
		s.jitter = time.Duration(rapid.Int64Range(0, int64(300*time.Millisecond)).Draw(rt, "jitter"))
		s.delay = time.Duration(rapid.Int64Range(0, int64(100*time.Millisecond)).Draw(rt, "delay"))
		for i, r := range s.regions {
			hot := 0.0
			if i == 0 { // one region at least wants more than its share
				hot = float64(amount)
			}
			r.offered = hot + rapid.Float64Range(0, 2*float64(amount)).Draw(rt, fmt.Sprintf("offered%d", i))
		}
		steps := rapid.IntRange(1, 8).Draw(rt, "steps")
		for i := range steps {
			if rapid.Bool().Draw(rt, fmt.Sprintf("cut%d", i)) {
				c := names[rapid.IntRange(0, n-1).Draw(rt, fmt.Sprintf("who%d", i))]
				s.cut[c] = !s.cut[c]
			}
			s.run(time.Duration(rapid.Int64Range(int64(200*time.Millisecond), int64(time.Second)).Draw(rt, fmt.Sprintf("for%d", i))))
			var lent, borrowed uint64
			for _, r := range s.regions {
				st := r.e.SyncStats()[0]
				lent, borrowed = lent+st.Lent, borrowed+st.Borrowed
			}
			if borrowed > lent {
				rt.Fatalf("credited %d tokens by loans, lent only %d", borrowed, lent)
			}
		}
		runs++
		if s.regions[0].e.SyncStats()[0].Borrowed+s.regions[1].e.SyncStats()[0].Borrowed > 0 {
			withLoans++
		}
		if alg != "sliding_window" {
			return
		}
		ws, tot := s.totals(t0)
		for i := range ws {
			if tot[i] > float64(amount) {
				rt.Fatalf("window %d admitted %.0f over all regions, L = %d", ws[i], tot[i], amount)
			}
		}
	})
}
