package regional

import (
	"cmp"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

var admissionRuns = flag.Int("admission.runs", 2000, "runs of TestAdmissionsStayWithinTheLimit")

// TestAdmissionsStayWithinTheLimit checks the split-mode guarantee where
// users see it: on what every instance of every region admitted. Regions
// of one to three instances, each instance an Engine, hold parts of one
// global limit that a model coordinator moves at random — lowerings at
// once, raises only later (the demarcation: shares in force never sum
// above 1) — for the limit's default and for a hot key that is promoted
// and retired. Between rebalances, instances restart (a new engine that
// holds its share from its grant on), keys are swept and made again,
// peers lend to each other, and windows last up to a thousand rebalance
// periods. The oracle sums admissions over every instance in true time:
// for a sliding window, at most L in each aligned window; for a token
// bucket or GCRA, at most B + r·T over every interval T.
//
// Not covered here (open): clock skew between regions, a limit lowered
// or a region removed from the configuration mid-window, and keys
// evicted while active (MaxKeys pressure).
func TestAdmissionsStayWithinTheLimit(t *testing.T) {
	runs := *admissionRuns
	var events [6]int
	start := time.Now()
	for seed := range uint64(runs) {
		d := &draw{rand.New(rand.NewPCG(seed, 0x616c6c6f74))}
		r := newAdmissionRun(t, d)
		r.run(t, d)
		if err := r.check(); err != nil {
			t.Fatalf("seed %d (%s, L = %.0f per %v, B = %.0f, %d holders, peers %v, guard %v): %v",
				seed, r.alg, r.amount, time.Duration(r.period), r.burst, len(r.holders), r.peers, r.guard, err)
		}
		for k, n := range r.events {
			events[k] += n
		}
	}
	t.Logf("%d runs in %v: %d admitted, %d rebalances, %d hot-key changes, %d restarts, %d sweeps, %d loans credited",
		runs, time.Since(start).Round(time.Millisecond), events[0], events[1], events[2], events[3], events[4], events[5])
}

// draw draws a run's choices from a seeded source.
type draw struct{ r *rand.Rand }

func (d *draw) int(lo, hi int) int           { return lo + d.r.IntN(hi-lo+1) }
func (d *draw) int64(lo, hi int64) int64     { return lo + d.r.Int64N(hi-lo+1) }
func (d *draw) float(lo, hi float64) float64 { return lo + d.r.Float64()*(hi-lo) }
func (d *draw) bool() bool                   { return d.r.IntN(2) == 0 }

type admissionHolder struct {
	region string
	e      *Engine
	def    float64 // the default share in force
	key    float64 // the hot key's own share in force, when own
	own    bool    // the hot key has a share of its own here
}

type admission struct {
	at   int64
	user int
	cost float64
}

// pendingRaise is a raise the model coordinator sends once every
// lowering of its rebalance is acknowledged.
type pendingRaise struct {
	at     int64
	h      int
	key    bool    // the hot key's share, not the default
	retire bool    // the hot key follows the default again
	to     float64 // the share
}

type admissionRun struct {
	cfg      *allot.Config
	alg      allot.Algorithm
	amount   float64
	burst    float64
	period   int64
	rebal    int64 // the longest time between two steps
	regions  []string
	holders  []*admissionHolder
	peers    bool
	steps    int
	guard    time.Duration // every engine's window guard (0: none)
	now      int64
	raises   []pendingRaise
	admitted []admission
	events   [6]int
	dec      allot.Decision
}

const hotUser = 1

func newAdmissionRun(t testing.TB, d *draw) *admissionRun {
	algs := []string{"sliding_window", "token_bucket", "gcra"}
	alg := algs[d.int(0, 2)]
	amount := d.int64(5, 300)
	periods := []time.Duration{time.Second, 10 * time.Second, time.Minute, 10 * time.Minute}
	period := periods[d.int(0, len(periods)-1)]
	burst := amount
	burstField := ""
	if alg != "sliding_window" {
		burst = d.int64(1, 2*amount)
		burstField = fmt.Sprintf(", burst: %d", burst)
	}
	regions := []string{"a", "b", "c"}[:d.int(1, 3)]
	src := fmt.Sprintf("domain: api\nregions: [a, b, c]\nlimits:\n  - {name: l, match: {user: \"*\"}, rate: %d/%dms%s, algorithm: %s}\n",
		amount, period.Milliseconds(), burstField, alg)
	r := &admissionRun{cfg: mustConfig(t, src), amount: float64(amount), burst: float64(burst), period: int64(period),
		regions: regions, peers: len(regions) > 1 && d.bool(), now: t0.UnixNano(), steps: d.int(20, 250)}
	r.alg = r.cfg.Domains[0].Limits[0].Algorithm
	// From ten steps a window to a thousand.
	r.rebal = r.period / int64([]int{10, 100, 1000}[d.int(0, 2)])
	if d.bool() { // one true clock: any guard holds
		r.guard = time.Duration(d.int64(int64(time.Millisecond), r.period/2))
	}
	for _, reg := range regions {
		for range d.int(1, 3) {
			h := &admissionHolder{region: reg}
			r.holders = append(r.holders, h)
			r.start(t, h)
		}
	}
	v := r.vector(d) // held since always: a fresh domain
	for i, h := range r.holders {
		h.def = v[i]
		if err := h.e.ResetShare("api", "l", h.def, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// start gives h a new engine: at the run's start, or a restart.
func (r *admissionRun) start(t testing.TB, h *admissionHolder) {
	h.e = New(r.cfg, Options{})
	h.e.SetWindowGuard(r.guard)
	if !r.peers {
		return
	}
	var others []string
	for _, o := range r.regions {
		if o != h.region {
			others = append(others, o)
		}
	}
	if err := h.e.SetPeers(h.region, others); err != nil {
		t.Fatal(err)
	}
}

// vector draws a share per holder, Σ ≤ 1; some hold nothing.
func (r *admissionRun) vector(d *draw) []float64 {
	v := make([]float64, len(r.holders))
	left := 1.0
	for _, i := range d.r.Perm(len(v)) {
		if d.int(0, 4) == 0 {
			continue
		}
		v[i] = math.Floor(d.float(0, left)*1000) / 1000
		left -= v[i]
	}
	return v
}

func (r *admissionRun) keyName() string {
	return KeyString(r.cfg.Domains[0].Limits[0], user(fmt.Sprint(hotUser)))
}

func (r *admissionRun) at() time.Time { return time.Unix(0, r.now) }

// keyInForce is what holder h enforces for the hot key.
func (h *admissionHolder) keyInForce() float64 {
	if h.own {
		return h.key
	}
	return h.def
}

// apply puts a share in force at one holder.
func (r *admissionRun) apply(t testing.TB, p pendingRaise) {
	h := r.holders[p.h]
	var err error
	switch {
	case !p.key:
		h.def = p.to
		err = h.e.SetShare(r.at(), "api", "l", p.to)
	case p.retire:
		h.own = false
		err = h.e.SetKeyShares(r.at(), "api", "l", []KeyShare{{Key: r.keyName(), Share: -1}})
	default:
		h.key, h.own = p.to, true
		err = h.e.SetKeyShares(r.at(), "api", "l", []KeyShare{{Key: r.keyName(), Share: p.to}})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// rebalance moves the default's shares, or the hot key's (promoting it),
// or retires the hot key: every lowering at once, every raise after a
// delay. The raises of the previous rebalance are acknowledged first.
func (r *admissionRun) rebalance(t testing.TB, d *draw) {
	for _, p := range r.raises {
		r.apply(t, p)
	}
	r.raises = r.raises[:0]
	delay := d.int64(0, r.rebal)
	var todo []pendingRaise
	switch d.int(0, 3) {
	case 0, 1: // the default vector; an own key share does not follow it
		for i, to := range r.vector(d) {
			todo = append(todo, pendingRaise{h: i, to: to})
		}
		r.events[1]++
	case 2: // the hot key's own vector
		for i, to := range r.vector(d) {
			if h := r.holders[i]; !h.own { // promoted where it follows the default: same share first
				r.apply(t, pendingRaise{h: i, key: true, to: h.def})
			}
			todo = append(todo, pendingRaise{h: i, key: true, to: to})
		}
		r.events[2]++
	case 3: // the hot key follows the default again
		for i, h := range r.holders {
			if h.own {
				todo = append(todo, pendingRaise{h: i, key: true, retire: true, to: h.def})
			}
		}
		r.events[2]++
	}
	for _, p := range todo {
		h := r.holders[p.h]
		was := h.def
		if p.key {
			was = h.keyInForce()
		}
		if p.to <= was {
			r.apply(t, p)
		} else {
			p.at = r.now + delay
			r.raises = append(r.raises, p)
		}
	}
}

func (r *admissionRun) run(t testing.TB, d *draw) {
	for range r.steps {
		r.now += d.int64(0, r.rebal)
		for len(r.raises) > 0 && r.raises[0].at <= r.now {
			r.apply(t, r.raises[0])
			r.raises = r.raises[1:]
		}
		switch k := d.int(0, 19); {
		case k < 12: // requests
			h := r.holders[d.int(0, len(r.holders)-1)]
			u := d.int(0, 2)
			cost := d.int64(1, max(1, int64(r.burst)/4))
			for range d.int(1, 20) {
				if err := h.e.Check(r.at(), "api", user(fmt.Sprint(u)), cost, &r.dec); err != nil {
					t.Fatal(err)
				}
				if r.dec.Allowed {
					r.admitted = append(r.admitted, admission{r.now, u, float64(cost)})
					r.events[0]++
				}
			}
		case k < 16:
			r.rebalance(t, d)
		case k == 16: // a restart: a new instance, holding its grant from now on
			h := r.holders[d.int(0, len(r.holders)-1)]
			r.start(t, h)
			if err := h.e.ResetShare("api", "l", h.def, r.at()); err != nil {
				t.Fatal(err)
			}
			if h.own {
				if err := h.e.SetKeyShares(r.at(), "api", "l", []KeyShare{{Key: r.keyName(), Share: h.key}}); err != nil {
					t.Fatal(err)
				}
			}
			r.events[3]++
		case k == 17:
			for _, h := range r.holders {
				h.e.Sweep(r.at())
			}
			r.events[4]++
		default:
			r.lend(t, d)
		}
	}
}

// lend lets peers hear each other, then sends every loan ask to an
// instance of the peer region and credits its answer.
func (r *admissionRun) lend(t testing.TB, d *draw) {
	if !r.peers {
		return
	}
	for _, h := range r.holders {
		for _, o := range r.regions {
			if o != h.region {
				h.e.Heard(r.at(), o)
			}
		}
	}
	for _, h := range r.holders {
		for _, a := range h.e.LoanAsks(r.at()) {
			var lenders []*admissionHolder
			for _, o := range r.holders {
				if o.region == a.Peer {
					lenders = append(lenders, o)
				}
			}
			l := lenders[d.int(0, len(lenders)-1)]
			g, err := l.e.Lend(r.at(), LoanRequest{From: h.region, Domain: a.Domain, Limit: a.Limit, Key: a.Key,
				Window: a.Window, Amount: a.Amount, ID: a.ID})
			if err != nil {
				t.Fatal(err)
			}
			if h.e.Credit(r.at(), a, g, nil) {
				r.events[5]++
			}
		}
	}
}

// check is the oracle: what every holder admitted, per user, in true
// time.
func (r *admissionRun) check() error {
	for u := range 3 {
		var as []admission
		for _, a := range r.admitted {
			if a.user == u {
				as = append(as, a)
			}
		}
		if r.alg == allot.SlidingWindow {
			sums := map[int64]float64{}
			for _, a := range as {
				w := a.at / r.period
				if sums[w] += a.cost; sums[w] > r.amount {
					return fmt.Errorf("user %d: %.0f admitted in window %d over every instance, L = %.0f", u, sums[w], w, r.amount)
				}
			}
			continue
		}
		rate := r.amount / float64(r.period)
		slices.SortStableFunc(as, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
		for i := range as {
			sum := 0.0
			for j := i; j < len(as); j++ {
				sum += as[j].cost
				if bound := r.burst + rate*float64(as[j].at-as[i].at); sum > bound+1e-6 {
					return fmt.Errorf("user %d: %.0f admitted in [%v, %v] over every instance, B + r·T = %.3f",
						u, sum, time.Duration(as[i].at-t0.UnixNano()), time.Duration(as[j].at-t0.UnixNano()), bound)
				}
			}
		}
	}
	return nil
}
