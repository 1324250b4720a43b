package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// keySpace numbers the keys of a scenario's traffic: for each descriptor
// entry, the ids base … base+n−1 are its values "k0" … "k<n−1>". It is
// built once per Run and read by every system.
type keySpace struct {
	entries []string
	base    []int    // by entry
	values  []string // by id
	hot     int      // the watched key's id, −1 if no traffic reaches it
	hotName string   // the watched key, as regional.KeyString names it
	lim     *allot.Limit
}

func newKeySpace(sc *Scenario, lim *allot.Limit) *keySpace {
	ks := &keySpace{hot: -1, lim: lim}
	var sizes []int
	for _, t := range sc.Traffic {
		i := slices.Index(ks.entries, t.Entry)
		if i < 0 {
			ks.entries, sizes = append(ks.entries, t.Entry), append(sizes, 0)
			i = len(ks.entries) - 1
		}
		sizes[i] = max(sizes[i], t.Keys)
	}
	var b []byte
	var ends []int
	for _, n := range sizes {
		ks.base = append(ks.base, len(ends))
		for k := range n {
			b = strconv.AppendInt(append(b, 'k'), int64(k), 10)
			ends = append(ends, len(b))
		}
	}
	all, start := string(b), 0 // one allocation for every value
	ks.values = make([]string, len(ends))
	for id, end := range ends {
		ks.values[id], start = all[start:end], end
	}
	entry := "user"
	if len(sc.Traffic) > 0 {
		entry = sc.Traffic[0].Entry
	}
	ks.hotName = regional.KeyString(lim, allot.Descriptor{{Key: entry, Value: sc.Watch}})
	if k, err := strconv.Atoi(strings.TrimPrefix(sc.Watch, "k")); err == nil && strings.HasPrefix(sc.Watch, "k") && k >= 0 && len(ks.entries) > 0 && k < sizes[0] {
		ks.hot = ks.base[0] + k
	}
	return ks
}

// id is the id of value k of entry i.
func (ks *keySpace) id(entry, k int) int { return ks.base[entry] + k }

// name is key id's name, as regional.KeyString gives it.
func (ks *keySpace) name(id int) string {
	e := 0
	for e+1 < len(ks.base) && ks.base[e+1] <= id {
		e++
	}
	return regional.KeyString(ks.lim, allot.Descriptor{{Key: ks.entries[e], Value: ks.values[id]}})
}

// stream is one traffic stream of one system. It draws from a random
// source of its own, in the same order in every system: the gap to the
// next candidate arrival; for a shaped stream, whether the candidate is
// kept; for a kept one its key, its instance and, for LLM calls, their
// sizes.
type stream struct {
	t     *Traffic
	r     *region
	rng   *rand.Rand
	zipf  *rand.Zipf
	entry int // in the key space
	reach int
	peak  float64 // candidates per second
	next  time.Time
	end   time.Time
	desc  allot.Descriptor // one entry, reused for request traffic
}

// arrival is one kept arrival: its key id, instance and LLM sizes.
type arrival struct {
	key, inst      int
	prompt, output int64
}

func (w *world) newStream(i int) *stream {
	t := &w.sc.Traffic[i]
	s := &stream{t: t, r: w.byName(t.Region), rng: rand.New(rand.NewPCG(w.sc.Seed, uint64(100+i))),
		entry: slices.Index(w.keys.entries, t.Entry), reach: w.sc.region(t.Region).Instances,
		peak: t.Rate, next: T0.Add(t.From), end: T0.Add(t.Until)}
	if t.Reach > 0 {
		s.reach = min(t.Reach, s.reach)
	}
	if t.Keys > 1 {
		s.zipf = rand.NewZipf(s.rng, t.Zipf, 1, uint64(t.Keys-1))
	}
	if t.Shape == "diurnal" {
		s.peak = t.Rate * (1 + t.Amplitude)
	}
	s.desc = allot.Descriptor{{Key: t.Entry}}
	s.advance()
	return s
}

// advance draws the next candidate arrival.
func (s *stream) advance() {
	s.next = s.next.Add(time.Duration(s.rng.ExpFloat64() / s.peak * float64(time.Second)))
}

// rate is the stream's rate at true time t.
func (s *stream) rate(t time.Time) float64 {
	rel := t.Sub(T0) - s.t.From + s.t.Phase
	switch s.t.Shape {
	case "diurnal":
		return s.t.Rate * (1 + s.t.Amplitude*math.Sin(2*math.Pi*rel.Seconds()/s.t.Period.Seconds()))
	case "burst":
		if rel%s.t.Period < s.t.On {
			return s.t.Rate
		}
		return 0
	}
	return s.t.Rate
}

// draw draws the candidate arrival at s.next: whether it is kept and,
// if so, what it is.
func (s *stream) draw() (arrival, bool) {
	if s.t.Shape != "" && s.rng.Float64()*s.peak >= s.rate(s.next) {
		return arrival{}, false
	}
	k := 0
	if s.zipf != nil {
		k = int(s.zipf.Uint64())
	}
	a := arrival{key: k, inst: s.rng.IntN(s.reach)}
	if c := s.t.LLM; c != nil {
		a.prompt = c.PromptMin + s.rng.Int64N(c.PromptMax-c.PromptMin+1)
		out := math.Round(c.OutputMedian * math.Exp(c.OutputSigma*s.rng.NormFloat64()))
		a.output = int64(min(max(out, 1), float64(c.MaxTokens)))
	}
	return a, true
}

// traffic schedules the arrivals of every stream: each at its own
// instant, or by ArrivalTick.
func (w *world) traffic() {
	var ss []*stream
	for i := range w.sc.Traffic {
		ss = append(ss, w.newStream(i))
	}
	if tick := w.sc.ArrivalTick; tick > 0 {
		w.every(T0.Add(tick), tick, func() {
			for _, s := range ss {
				w.tickArrivals(s)
			}
		})
		return
	}
	for _, s := range ss {
		var next func()
		next = func() {
			if a, ok := s.draw(); ok {
				w.arrive(s, a, 1)
			}
			s.advance()
			if s.next.Before(s.end) {
				w.at(s.next, next)
			}
		}
		if s.next.Before(s.end) {
			w.at(s.next, next)
		}
	}
}

// tickArrivals decides, now, the arrivals of s since the previous tick:
// those of one key at one instance together.
func (w *world) tickArrivals(s *stream) {
	w.batch = w.batch[:0]
	for !s.next.After(w.now) && s.next.Before(s.end) {
		if a, ok := s.draw(); ok {
			if s.t.LLM != nil {
				w.arrive(s, a, 1) // every call has its own size
			} else {
				a.inst = s.r.instance(a.inst)
				w.batch = append(w.batch, uint64(a.inst)<<32|uint64(a.key))
			}
		}
		s.advance()
	}
	slices.Sort(w.batch)
	for i := 0; i < len(w.batch); {
		j := i + 1
		for j < len(w.batch) && w.batch[j] == w.batch[i] {
			j++
		}
		w.arrive(s, arrival{inst: int(w.batch[i] >> 32), key: int(uint32(w.batch[i]))}, j-i)
		i = j
	}
}

// instance maps an instance drawn among the region's configured ones to
// the instance that decides: the region's only one when it runs one, the
// gateway itself in the gateways system.
func (r *region) instance(i int) int {
	if r.gw != nil {
		return i // the gateway
	}
	if len(r.inst) == 1 {
		return 0
	}
	return i
}

// arrive decides n arrivals of the same key at the same instance, now.
func (w *world) arrive(s *stream, a arrival, n int) {
	r := s.r
	if r.gone { // removed by a config event: nothing serves it
		id := w.keys.id(s.entry, a.key)
		cost := s.t.Cost
		if s.t.LLM != nil {
			cost = a.prompt + a.output
		}
		w.m.add(w.now, r.idx, id, n, 0, float64(cost*int64(n)))
		return
	}
	if r.gw != nil && s.t.LLM == nil {
		id := w.keys.id(s.entry, a.key)
		s.desc[0].Value = w.keys.values[id]
		ok := w.gatewayDecide(r, r.gw[a.inst], id, s.desc, s.t.Cost, n)
		w.m.add(w.now, r.idx, id, n, float64(s.t.Cost*int64(ok)), float64(s.t.Cost*int64(n-ok)))
		return
	}
	in := r.inst[r.instance(a.inst)]
	id := w.keys.id(s.entry, a.key)
	if s.t.LLM != nil {
		w.call(s, in, id, a)
		return
	}
	s.desc[0].Value = w.keys.values[id]
	cost := s.t.Cost
	ok := w.decide(r, in, s.desc, cost, n)
	w.m.add(w.now, r.idx, id, n, float64(cost*int64(ok)), float64(cost*int64(n-ok)))
}

// decide decides n requests of cost on desc at instance in of region r,
// at this instant, and returns how many were admitted, with as few engine
// calls as it can and each request counted once in the engine's demand
// (what the coordinator sees): one request first; if it passes, as many
// more at once as the allowance it leaves says; then one by one until
// one is rejected; the rest, which would be rejected too (nothing changes
// between requests at one instant), in one call. Only a batch that the
// allowance said would pass and did not (a lease whose store had less
// than last seen) is counted twice. The ideal pass, which reports no
// demand, tries all n at once first.
func (w *world) decide(r *region, in *instance, desc allot.Descriptor, cost int64, n int) int {
	if n > 1 && w.sys == ideal {
		if ok, err := w.check(r, in, desc, cost*int64(n)); ok {
			return n
		} else if err != nil && !errors.Is(err, regional.ErrCostAboveBurst) {
			panic(fmt.Sprintf("%s: check %v: %v", r.name, desc, err))
		}
	}
	a := 0
	for a < n {
		ok, err := w.check(r, in, desc, cost)
		if err != nil {
			panic(fmt.Sprintf("%s: check %v: %v", r.name, desc, err))
		}
		if !ok {
			break
		}
		a++
		if k := min(w.remaining()/cost, int64(n-a)); a == 1 && k > 1 {
			if ok, err := w.check(r, in, desc, cost*k); ok {
				a += int(k)
			} else if err != nil && !errors.Is(err, regional.ErrCostAboveBurst) {
				panic(fmt.Sprintf("%s: check %v: %v", r.name, desc, err))
			}
		}
	}
	if rest := n - a - 1; rest > 0 {
		ok, err := w.check(r, in, desc, cost*int64(rest))
		switch {
		case ok:
			a += rest // cannot happen (a smaller cost was just rejected); counted as it went
		case errors.Is(err, regional.ErrCostAboveBurst):
			for range rest {
				if ok, _ := w.check(r, in, desc, cost); ok {
					a++
				}
			}
		case err != nil:
			panic(fmt.Sprintf("%s: check %v: %v", r.name, desc, err))
		}
	}
	return a
}

// check decides one request of hits at instance in, on r's clock.
func (w *world) check(r *region, in *instance, desc allot.Descriptor, hits int64) (bool, error) {
	var err error
	if in.f != nil {
		w.items[0] = regional.Item{Descriptor: desc, Hits: hits}
		err = in.f.CheckItems(w.ctx, w.clockOf(r, in), w.dom.Name, w.items[:], &w.dec)
	} else {
		err = in.e.Check(w.clockOf(r, in), w.dom.Name, desc, hits, &w.dec)
	}
	return err == nil && w.dec.Allowed, err
}

// remaining is the least Remaining of the last decision's limits.
func (w *world) remaining() int64 {
	rem := int64(math.MaxInt64)
	for _, st := range w.dec.Statuses {
		if !st.Shadow {
			rem = min(rem, st.Remaining)
		}
	}
	if rem == math.MaxInt64 {
		return 0
	}
	return rem
}
