package regional

import (
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// burstStep is one row of a burst-change table: before the check at
// t0+at, the configuration is replaced (cfg) or the region's share set
// (share > 0), then n is checked.
type burstStep struct {
	at        time.Duration
	cfg       string
	share     float64
	n         int64
	allowed   bool
	remaining int64
}

func burstCfg(alg string, burst int, extra string) string {
	return fmt.Sprintf("domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 10/s, burst: %d, algorithm: %s}\n%s", burst, alg, extra)
}

// TestRaisedBurst: when the limit's own burst is raised (the
// configuration, a plan, an override: an operator's decision), a bucket
// gets the raise at once, and what it had spent stays spent: tokens =
// the old tokens + (new burst − old burst). A bucket full at 10 holds 20
// as soon as the burst is 20.
//
// Why at once rather than after the refill time of the difference:
//   - a sliding window treats a raised amount so (its counts are
//     absolute: remaining = new amount − count), and GCRA too (its
//     arrival time is absolute: the debt is kept, the burst above it
//     is there at once); a token bucket now agrees with both;
//   - a key swept when full has no state and is made again full at the
//     new burst. Sweeping must change no decision, so a full bucket that
//     was not swept must hold the new burst too. Refilling the
//     difference would need the swept keys remembered;
//   - the operator raised the burst to admit more now.
//
// A raise of the region's share is not an operator's raise of the
// limit: it counts from the next window (issue "allowance as a
// quantity"), and a token bucket does not refill at it (the last table).
//
// Each table runs twice: on an engine never swept, and on one swept
// before every row. Both must give the same rows.
func TestRaisedBurst(t *testing.T) {
	tb10, tb20 := burstCfg("token_bucket", 10, ""), burstCfg("token_bucket", 20, "")
	gcra10, gcra20 := burstCfg("gcra", 10, ""), burstCfg("gcra", 20, "")
	sw10 := "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 10/s, algorithm: sliding_window}\n"
	sw20 := "domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: 20/s, algorithm: sliding_window}\n"
	override := burstCfg("token_bucket", 10, "overrides:\n  - {limit: l, match: {user: \"1\"}, multiplier: 2}\n")
	plan := "plans:\n  pro: {multiplier: 2}\nassign:\n  - {match: {user: \"1\"}, plan: pro}\n"
	for _, c := range []struct {
		name  string
		start string
		steps []burstStep
	}{
		{"token_bucket full, 10 to 20", tb10, []burstStep{
			{at: 0, n: 1, allowed: true, remaining: 9},                       // t0
			{at: time.Second, n: 0, allowed: true, remaining: 10},            // t1: full, touched
			{at: time.Second, cfg: tb20, n: 0, allowed: true, remaining: 20}, // t2: raised: 20 at once
			{at: time.Second, n: 20, allowed: true, remaining: 0},            // t3
			{at: 1500 * time.Millisecond, n: 0, allowed: true, remaining: 5}, // t4: refills at 10/s
			{at: 3 * time.Second, n: 0, allowed: true, remaining: 20},        // t5: never more than the burst
		}},
		{"token_bucket spent, 10 to 20", tb10, []burstStep{
			{at: 0, n: 4, allowed: true, remaining: 6},                                 // t0
			{at: 0, cfg: tb20, n: 0, allowed: true, remaining: 16},                     // t1: spent stays spent
			{at: 0, n: 17, allowed: false, remaining: 16},                              // t2
			{at: 200 * time.Millisecond, n: 18, allowed: true, remaining: 0},           // t3
			{at: 200 * time.Millisecond, cfg: tb10, n: 0, allowed: true, remaining: 0}, // t4: lowered: clamped
			{at: 1200 * time.Millisecond, n: 0, allowed: true, remaining: 10},          // t5
			{at: 5 * time.Second, cfg: tb20, n: 20, allowed: true, remaining: 0},       // t6: idle and full: 20 at once
		}},
		{"token_bucket raised by an override", tb10, []burstStep{
			{at: 0, n: 1, allowed: true, remaining: 9},                           // t0
			{at: time.Second, n: 0, allowed: true, remaining: 10},                // t1
			{at: time.Second, cfg: override, n: 20, allowed: true, remaining: 0}, // t2: 20/s, burst 20
			{at: 1500 * time.Millisecond, n: 0, allowed: true, remaining: 10},    // t3
		}},
		{"token_bucket raised by a plan", tb10, []burstStep{
			{at: 0, n: 3, allowed: true, remaining: 7},                    // t0
			{at: 0, cfg: tb10 + plan, n: 0, allowed: true, remaining: 17}, // t1: 20/s, burst 20
			{at: 0, n: 17, allowed: true, remaining: 0},                   // t2
		}},
		{"gcra full, 10 to 20", gcra10, []burstStep{
			{at: 0, n: 1, allowed: true, remaining: 9},
			{at: time.Second, n: 0, allowed: true, remaining: 10},
			{at: time.Second, cfg: gcra20, n: 20, allowed: true, remaining: 0},
		}},
		{"gcra spent, 10 to 20", gcra10, []burstStep{
			{at: 0, n: 4, allowed: true, remaining: 6},
			{at: 0, cfg: gcra20, n: 0, allowed: true, remaining: 16},
			{at: 0, n: 17, allowed: false, remaining: 16},
		}},
		{"sliding_window, 10 to 20", sw10, []burstStep{
			{at: 0, n: 4, allowed: true, remaining: 6},
			{at: 0, cfg: sw20, n: 0, allowed: true, remaining: 16},
			{at: 0, n: 17, allowed: false, remaining: 16},
		}},
		// The share is raised, not the burst: no refill; the bucket
		// refills at the new rate up to the new burst.
		{"token_bucket share 0.5 to 1", tb10, []burstStep{
			{at: 0, share: 0.5, n: 1, allowed: true, remaining: 4},                    // t0: burst 5
			{at: 10 * time.Millisecond, n: 0, allowed: true, remaining: 4},            // t1
			{at: 10 * time.Millisecond, share: 1, n: 5, allowed: false, remaining: 4}, // t2: raised: no refill
			{at: 110 * time.Millisecond, n: 5, allowed: true, remaining: 0},           // t3: 1 refilled at 10/s
		}},
	} {
		for _, swept := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/swept=%v", c.name, swept), func(t *testing.T) {
				e := New(mustConfig(t, c.start), Options{})
				var dec allot.Decision
				for i, s := range c.steps {
					now := t0.Add(s.at)
					if s.cfg != "" {
						e.Reconfigure(now, mustConfig(t, s.cfg))
					}
					if s.share > 0 {
						if err := e.SetShare(now, "api", "l", s.share); err != nil {
							t.Fatal(err)
						}
					}
					if swept {
						e.Sweep(now)
					}
					if err := e.Check(now, "api", user("1"), s.n, &dec); err != nil {
						t.Fatalf("t%d: %v", i, err)
					}
					st := dec.Statuses[0]
					if st.Allowed != s.allowed || st.Remaining != s.remaining {
						t.Errorf("t%d (at %v, n %d): allowed %v remaining %d, want %v %d", i, s.at, s.n, st.Allowed, st.Remaining, s.allowed, s.remaining)
					}
				}
			})
		}
	}
}
