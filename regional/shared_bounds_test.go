package regional

import (
	"strings"
	"testing"
	"time"
)

// untilWindow runs s until the start of the next window (plus at).
func (s *peerSim) untilWindow(at time.Duration) {
	next := time.Unix(0, (s.now.UnixNano()/int64(s.period)+1)*int64(s.period)).Add(at)
	s.run(next.Sub(s.now))
}

// worstWindow is the largest global total of a complete window from
// `from` on, and the window's id.
func (s *peerSim) worstWindow(from time.Time) (w uint64, total float64) {
	ws, tot := s.totals(from)
	for i := range ws {
		if tot[i] > total {
			w, total = ws[i], tot[i]
		}
	}
	return w, total
}

// TestSharedPartitionSpendsWhatIsLeft: a partition that starts after
// the window's allowance was spent (a, of split share 0.1, admitted
// most of L) leaves every region its split share of what is left,
// not of L; a share raised during the window is not spent before the
// next one. The global total of every window stays within L + the
// stated partition bound.
func TestSharedPartitionSpendsWhatIsLeft(t *testing.T) {
	cfg := strings.Replace(sharedConfig, "1000/1s", "6000/1m", 1)
	for _, c := range []struct {
		name  string
		raise bool // the coordinator moves a's share to b during the partition
	}{
		{"spent before the partition", false},
		{"share raised during the partition", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newPeerSim(t, cfg, abc, []float64{0.1, 0.45, 0.45}, 11)
			s.step = 5 * time.Millisecond
			s.run(2 * time.Second) // every peer heard
			s.untilWindow(0)
			from := s.now
			a, b, cr := s.regions[0], s.regions[1], s.regions[2]
			a.offered = 120 // 5400 of L = 6000 in 45 s, at about the limit's rate (100/s)
			s.run(45 * time.Second)
			a.offered = 0
			s.cut["c"] = true
			b.offered, cr.offered = 400, 400
			s.run(2 * time.Second)
			if c.raise { // c's share is frozen; a's moves to b
				if err := a.e.SetShare(s.now, "api", "global", 0); err != nil {
					t.Fatal(err)
				}
				if err := b.e.SetShare(s.now, "api", "global", 0.55); err != nil {
					t.Fatal(err)
				}
			}
			s.untilWindow(time.Second) // the rest of the window, and one step into the next
			st := a.e.SyncStats()[0]
			bound := 6000 + st.PartitionBound()
			w, worst := s.worstWindow(from)
			t.Logf("worst window %d admitted %.0f (a %.0f, b %.0f, c %.0f), L + partition bound %.0f",
				w, worst, a.admitted[w], b.admitted[w], cr.admitted[w], bound)
			if worst > bound {
				t.Fatalf("partitioned: window %d admitted %.0f, above L + partition bound = %.0f", w, worst, bound)
			}
			for _, r := range s.regions {
				if st := r.e.SyncStats()[0]; !st.Fallback {
					t.Errorf("%s did not fall back", r.name)
				}
			}
		})
	}
}

// TestSharedSimultaneousBursts: every region bursts at once, before any
// delta can arrive: at the start of every window (a 1 s limit), or all
// window long far above L (a 1 min limit, whose budget is 5 % of L). The
// global total of every aligned window stays within L + the stated
// bound.
func TestSharedSimultaneousBursts(t *testing.T) {
	for _, c := range []struct {
		name     string
		rate     string
		l        float64
		windows  int
		burstFor time.Duration // 0: all window long
		offered  float64       // per second, in each region
		cost     int64
		step     time.Duration
	}{
		{"100/1s, at every window's start", "100/1s", 100, 5, 3 * time.Millisecond, 100_000, 1, time.Millisecond}, // all of L in the first step
		{"6000/1m, all window long", "6000/1m", 6000, 2, 0, 60_000, 100, 5 * time.Millisecond},                    // L every 100 ms
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newPeerSim(t, strings.Replace(sharedConfig, "1000/1s", c.rate, 1), abc, thirds, 12)
			s.cost, s.step = c.cost, c.step
			s.run(2 * time.Second) // every peer heard
			s.untilWindow(0)
			from := s.now
			for range c.windows {
				for _, r := range s.regions {
					r.offered = c.offered
				}
				if c.burstFor > 0 {
					s.run(c.burstFor)
					for _, r := range s.regions {
						r.offered = 0
					}
				}
				s.untilWindow(0)
			}
			st := s.regions[0].e.SyncStats()[0]
			bound := c.l + st.OvershootBound(s.delay)
			ws, tot := s.totals(from)
			t.Logf("windows %v admitted %v, L + bound %.0f", ws, tot, bound)
			if len(ws) != c.windows {
				t.Fatalf("%d windows, want %d", len(ws), c.windows)
			}
			for i := range ws {
				if tot[i] > bound {
					t.Errorf("window %d admitted %.0f, above L + bound = %.0f", ws[i], tot[i], bound)
				}
			}
			for _, r := range s.regions {
				if st := r.e.SyncStats()[0]; st.Fallback || st.Gaps != 0 {
					t.Errorf("%s: %+v", r.name, st)
				}
			}
		})
	}
}

// TestSharedOneRegionAtTheRate: the unseen budget does not hold back a
// region that takes the whole limit at the limit's rate, with the
// heartbeats and delays of a deployment (a heartbeat every half sync
// interval when no batch goes out, 50 ms one way).
func TestSharedOneRegionAtTheRate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  string
	}{
		{"1000/1s", sharedConfig},
		{"60000/1m", strings.Replace(sharedConfig, "1000/1s", "60000/1m", 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newPeerSim(t, c.cfg, abc, thirds, 13)
			s.delay, s.beat = 50*time.Millisecond, 125*time.Millisecond
			windows := 4
			if s.period >= time.Minute {
				s.step, s.cost, windows = 5*time.Millisecond, 10, 2
			}
			l := float64(s.regions[0].e.Config().Domains[0].Limits[0].Rate.Amount)
			s.run(2 * time.Second)
			s.regions[1].offered = 1.5 * l / s.period.Seconds()
			s.untilWindow(0)
			s.run(s.period) // the previous window full
			from := s.now
			s.run(time.Duration(windows) * s.period)
			perWindow := sumFrom(s.regions[1], s.period, from) / float64(windows)
			t.Logf("b admits %.0f per window of L=%.0f", perWindow, l)
			if perWindow < 0.98*l {
				t.Errorf("b admits %.0f per window, want about L=%.0f", perWindow, l)
			}
		})
	}
}

// TestSharedSecondFallbackInAWindow: a region that fell back once in a
// window, then spent in shared mode after the peers healed, falls back
// again in the same window from what is left then, not from the first
// fallback's allowance, which the regions have since spent.
func TestSharedSecondFallbackInAWindow(t *testing.T) {
	cfg := strings.Replace(sharedConfig, "1000/1s, mode: shared", "1000/10s, mode: shared, sync_interval: 50ms, stale_after: 250ms", 1)
	s := newPeerSim(t, cfg, abc[:2], []float64{0.5, 0.5}, 12)
	s.delay = 20 * time.Millisecond
	a, b := s.regions[0], s.regions[1]
	s.run(time.Second) // every peer heard
	s.untilWindow(0)
	s.untilWindow(0) // a window with nothing before it: the estimate is the window's count
	from := s.now
	a.offered = 10 // a little, so that a decides in its first fallback
	s.cut["a"] = true
	s.run(time.Second)
	delete(s.cut, "a")
	s.run(time.Second) // healed: shared mode again
	a.offered, b.offered = 0, 400
	s.run(2500 * time.Millisecond) // b spends most of the window
	b.offered = 0
	s.run(time.Second)
	s.cut["b"] = true // a falls back a second time in the window
	a.offered = 400
	s.untilWindow(time.Second)
	st := a.e.SyncStats()[0]
	bound := 1000 + st.PartitionBound()
	w, worst := s.worstWindow(from)
	t.Logf("worst window %d admitted %.0f (a %.0f, b %.0f), L + partition bound %.0f, fallbacks %d", w, worst, a.admitted[w], b.admitted[w], bound, st.Fallbacks)
	if st.Fallbacks < 2 {
		t.Fatalf("a fell back %d times, want 2", st.Fallbacks)
	}
	if worst > bound {
		t.Fatalf("window %d admitted %.0f, above L + partition bound = %.0f", w, worst, bound)
	}
}
