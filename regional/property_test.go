package regional

import (
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"pgregory.net/rapid"
)

// TestAdmittedWithinBound checks that for every algorithm, over any
// interval T of any request sequence, the admitted cost is at most
// burst + rate × T.
func TestAdmittedWithinBound(t *testing.T) {
	for _, alg := range []string{"token_bucket", "gcra", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				amount := rapid.Int64Range(1, 1000).Draw(rt, "amount")
				periodMs := rapid.Int64Range(1, 60_000).Draw(rt, "periodMs")
				burst := amount
				burstField := ""
				if alg != "sliding_window" {
					burst = rapid.Int64Range(1, 2*amount).Draw(rt, "burst")
					burstField = fmt.Sprintf(", burst: %d", burst)
				}
				cfg := fmt.Sprintf("domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: %d/%dms%s, algorithm: %s}\n",
					amount, periodMs, burstField, alg)
				e := New(mustConfig(rt, cfg), Options{})
				period := time.Duration(periodMs) * time.Millisecond
				type adm struct {
					at   time.Duration
					cost int64
				}
				var admitted []adm
				at := time.Duration(rapid.Int64Range(0, int64(period)).Draw(rt, "start"))
				var dec allot.Decision
				n := rapid.IntRange(1, 200).Draw(rt, "n")
				for i := range n {
					at += time.Duration(rapid.Int64Range(0, int64(period)/2).Draw(rt, fmt.Sprintf("dt%d", i)))
					cost := rapid.Int64Range(0, burst).Draw(rt, fmt.Sprintf("cost%d", i))
					if err := e.Check(t0.Add(at), "api", user("1"), cost, &dec); err != nil {
						rt.Fatal(err)
					}
					if dec.Allowed {
						admitted = append(admitted, adm{at, cost})
					}
				}
				rate := float64(amount) / float64(period)
				for i := range admitted {
					sum := int64(0)
					for j := i; j < len(admitted); j++ {
						sum += admitted[j].cost
						T := float64(admitted[j].at - admitted[i].at)
						if bound := float64(burst) + rate*T; float64(sum) > bound+1e-6 {
							rt.Fatalf("admitted %d in [%v, %v], bound %.3f (burst %d, rate %d/%v)",
								sum, admitted[i].at, admitted[j].at, bound, burst, amount, period)
						}
					}
				}
			})
		})
	}
}

// TestTableMatchesMap drives the key table's shard with random inserts,
// lookups and removals and compares it with a Go map.
func TestTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var s shard
		s.max = 1 << 30
		ref := map[uint64]int64{}
		keys := rapid.SliceOfN(rapid.Uint64Range(1, 64), 1, 64).Draw(rt, "keys")
		for i, k := range keys {
			k = k * 0x9E3779B97F4A7C15 // spread over slots, with some collisions
			k = normKey(k)
			switch rapid.IntRange(0, 2).Draw(rt, fmt.Sprintf("op%d", i)) {
			case 0:
				if s.find(k) < 0 {
					s.slots[s.insert(k)].t = int64(i)
					ref[k] = int64(i)
				}
			case 1:
				if idx := s.find(k); idx >= 0 {
					s.remove(idx)
					delete(ref, k)
				}
			case 2:
				idx := s.find(k)
				v, ok := ref[k]
				if (idx >= 0) != ok || (ok && s.slots[idx].t != v) {
					rt.Fatalf("find(%x): idx %d, ref %v %v", k, idx, v, ok)
				}
			}
			if s.n != len(ref) {
				rt.Fatalf("n = %d, ref has %d", s.n, len(ref))
			}
		}
		for k, v := range ref {
			if idx := s.find(k); idx < 0 || s.slots[idx].t != v {
				rt.Fatalf("lost key %x", k)
			}
		}
	})
}
