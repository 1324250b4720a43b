package regional

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var sharedRuns = flag.Int("shared.runs", 0, "runs of TestSharedAdmissionsStayWithinTheBound (0: 150, 25 under the race detector)")

// TestSharedAdmissionsStayWithinTheBound checks shared mode's stated bound
// where users see it: on what every region admitted, per window aligned
// on the period. Two or three regions (one instance each, on one true
// clock) sync a shared sliding window through a network with a one-way
// delay and jitter within the sync interval, duplicates and reordering;
// the traffic of each region changes at random (idle, below, at and far
// above the limit's rate, bursts in every region at once), and one region
// may be cut off both ways for a while (the staleness fallback); in a
// quarter of the runs 5 % of the messages are lost. The oracle: in every
// complete window, Σ admitted ≤ L + the overshoot bound for the run's
// largest delay (SyncStats.OvershootBound; with losses, for a delay of
// three sync intervals: a loss shows as a gap at the next batch and the
// full state comes back within the delay), or L +
// SyncStats.PartitionBound in a window that a cut, or the resync after
// it, reaches.
func TestSharedAdmissionsStayWithinTheBound(t *testing.T) {
	runs := *sharedRuns
	if runs == 0 {
		runs = 150
		if raceEnabled {
			runs = 25
		}
	}
	start := time.Now()
	admitted, windows, cuts := 0.0, 0, 0
	for seed := range uint64(runs) {
		r := runShared(t, seed)
		admitted += r.admitted
		windows += r.windows
		cuts += r.cuts
	}
	t.Logf("%d runs in %v: %d windows checked, %.0f admitted, %d cuts", runs, time.Since(start).Round(time.Millisecond), windows, admitted, cuts)
}

type sharedRunResult struct {
	admitted float64
	windows  int
	cuts     int
}

func runShared(t *testing.T, seed uint64) sharedRunResult {
	t.Helper()
	d := &draw{rand.New(rand.NewPCG(seed, 0x7368617265))}
	names := abc[:d.int(2, 3)]
	amount := d.int64(50, 3000)
	period := []time.Duration{time.Second, 10 * time.Second}[d.int(0, 1)]
	sync := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}[d.int(0, 2)]
	stale := time.Duration(d.int64(2, 6)) * sync
	cfg := fmt.Sprintf("domain: api\nregions: [a, b, c]\nlimits:\n  - {name: global, match: {user: \"*\"}, rate: %d/%dms, mode: shared, algorithm: sliding_window, sync_interval: %dms, stale_after: %dms}\n",
		amount, period.Milliseconds(), sync.Milliseconds(), stale.Milliseconds())
	shares := make([]float64, len(names))
	for i := range shares {
		shares[i] = 1 / float64(len(names))
	}
	s := newPeerSim(t, cfg, names, shares, seed)
	s.borrow = false
	s.tick = []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond}[d.int(0, 2)]
	s.tick = min(s.tick, sync)
	s.delay = time.Duration(d.int64(int64(time.Millisecond), int64(sync)))
	if d.bool() {
		s.jitter = time.Duration(d.int64(0, int64(sync-s.delay)))
	}
	if d.bool() {
		s.dup = 0.1
	}
	lossy := d.int(0, 3) == 0
	if lossy { // a lost delta counts once the resync it triggers arrives
		s.loss = 0.05
	}
	if period > time.Second {
		s.step = 5 * time.Millisecond
	}
	l := float64(amount)
	rate := l / period.Seconds()
	st := s.regions[0].e.SyncStats()[0]
	bound, partition := st.OvershootBound(s.delay+s.jitter), st.PartitionBound()
	if lossy { // the gap shows at the next batch, the full state comes back within the delay
		bound = st.OvershootBound(3 * sync)
		partition = max(partition, bound)
	}

	// Warm-up: every region heard every other, below the rate.
	for _, r := range s.regions {
		r.offered = 0.2 * rate
	}
	s.run(stale + 2*sync)
	from := s.now
	total := time.Duration(d.int64(3, 6)) * period
	var res sharedRunResult
	var reached []struct{ from, to time.Time } // a cut, and the resync after it
	cutStart, cutUntil, cutName := time.Time{}, time.Time{}, ""
	for end := from.Add(total); s.now.Before(end); {
		switch d.int(0, 5) {
		case 0: // every region bursts at once
			for _, r := range s.regions {
				r.offered = rate * d.float(2, 8)
			}
		case 1:
			if cutName == "" && d.int(0, 2) == 0 { // a region cut off both ways
				cutName = names[d.int(0, len(names)-1)]
				s.cut[cutName] = true
				cutStart = s.now
				cutUntil = s.now.Add(time.Duration(d.int64(int64(sync), int64(3*time.Second))))
				res.cuts++
			}
		default:
			r := s.regions[d.int(0, len(s.regions)-1)]
			r.offered = rate * []float64{0, 0.2, 0.5, 1, 1.5, 5}[d.int(0, 5)]
		}
		next := s.now.Add(time.Duration(d.int64(int64(20*time.Millisecond), int64(period)/2)))
		if cutName != "" && cutUntil.Before(next) {
			s.run(cutUntil.Sub(s.now))
			delete(s.cut, cutName)
			reached = append(reached, struct{ from, to time.Time }{cutStart, cutUntil.Add(stale + 4*sync + s.delay + s.jitter)})
			cutName = ""
		}
		if next.After(s.now) {
			s.run(next.Sub(s.now))
		}
	}
	if cutName != "" {
		delete(s.cut, cutName)
		reached = append(reached, struct{ from, to time.Time }{cutStart, s.now.Add(stale + 4*sync)})
	}
	ws, tot := s.totals(from)
	for i, w := range ws {
		ws0, ws1 := time.Unix(0, int64(w)*int64(period)), time.Unix(0, int64(w+1)*int64(period))
		allowed := l + bound
		for _, c := range reached {
			if c.from.Before(ws1) && c.to.After(ws0) {
				allowed = l + partition
			}
		}
		if tot[i] > allowed+1e-9 {
			t.Fatalf("seed %d (%d regions, L = %d per %v, sync %v, tick %v, delay %v + jitter %v, dup %v, loss %v, stale after %v, cuts %d): window %d admitted %.0f, above %.0f (L + bound %.0f, partition %.0f)",
				seed, len(names), amount, period, sync, s.tick, s.delay, s.jitter, s.dup, s.loss, stale, res.cuts, i, tot[i], allowed, bound, partition)
		}
		res.admitted += tot[i]
		res.windows++
	}
	return res
}
