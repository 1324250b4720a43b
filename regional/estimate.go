package regional

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Sketch summarises the output sizes recently settled for one limit and
// model, for a quantile. Reservations keep one per (domain, limit, model)
// and serialise the calls to it. regional/sketch adapts DDSketch to it (the
// servers' default); NewWindowSketch is the in-memory version that the
// core, its tests and the simulator use.
type Sketch interface {
	// Add records one settled output size (≥ 0).
	Add(v float64)
	// Quantile returns the q-quantile (0 < q < 1) of what it holds; 0 when
	// empty.
	Quantile(q float64) float64
	// Count is the weight of what it holds: the number of samples, less
	// what Decay took.
	Count() float64
	// Decay keeps the fraction f (0 < f < 1) of its weight, the older
	// samples going first where it can tell them apart, so that the
	// estimate follows recent traffic.
	Decay(f float64)
}

// WindowSketch is an exact Sketch over the last N samples: a ring buffer,
// sorted on demand. It is not safe for concurrent use.
type WindowSketch struct {
	buf    []float64 // ring of the last len(buf) samples
	next   int       // where the next sample goes
	n      int       // samples held, ≤ len(buf)
	sorted []float64 // scratch for Quantile
}

// NewWindowSketch returns a WindowSketch holding up to n samples.
func NewWindowSketch(n int) *WindowSketch { return &WindowSketch{buf: make([]float64, max(n, 1))} }

// Add implements Sketch.
func (w *WindowSketch) Add(v float64) {
	w.buf[w.next] = v
	w.next = (w.next + 1) % len(w.buf)
	w.n = min(w.n+1, len(w.buf))
}

// Quantile implements Sketch: the smallest held value with at least a
// fraction q of the samples at or below it.
func (w *WindowSketch) Quantile(q float64) float64 {
	if w.n == 0 {
		return 0
	}
	w.sorted = w.sorted[:0]
	for i := range w.n {
		w.sorted = append(w.sorted, w.buf[(w.next-1-i+2*len(w.buf))%len(w.buf)])
	}
	slices.Sort(w.sorted)
	i := int(math.Ceil(q*float64(w.n))) - 1
	return w.sorted[min(max(i, 0), w.n-1)]
}

// Count implements Sketch.
func (w *WindowSketch) Count() float64 { return float64(w.n) }

// Decay implements Sketch: it forgets the oldest samples.
func (w *WindowSketch) Decay(f float64) { w.n = int(math.Floor(float64(w.n) * f)) }

// Defaults of the output estimate.
const (
	DefaultEstimateQuantile = 0.9
	DefaultInitialFraction  = 0.5
	DefaultMinSamples       = 20
	DefaultHalfLife         = 5 * time.Minute
	DefaultMaxModels        = 64
	windowSketchSize        = 1024
)

// otherModels is the estimate key of the models past MaxModels of a limit.
const otherModels = "\x00other"

// estimator learns, per limit and model, the quantile of settled output
// tokens. It is safe for concurrent use.
type estimator struct {
	q        float64
	fraction float64
	minN     float64
	halfLife int64
	maxModel int
	newSk    func() Sketch

	mu      sync.Mutex
	entries map[estKey]*estEntry
	models  map[[2]string]int // (domain, limit) → models tracked
}

type estKey struct{ domain, limit, model string }

// estEntry is one limit and model's sketch. mu guards the fields.
type estEntry struct {
	mu      sync.Mutex
	sk      Sketch
	decayed int64   // unix ns of the last decay
	adds    int     // samples since value was computed
	value   float64 // the cached quantile
	stale   bool    // value must be computed again before use
}

// refreshEvery is how many samples an entry takes before its cached
// quantile is computed again.
const refreshEvery = 16

func (es *estimator) entry(domain, limit, model string, create bool, now int64) *estEntry {
	k := estKey{domain, limit, model}
	es.mu.Lock()
	defer es.mu.Unlock()
	if e := es.entries[k]; e != nil || !create {
		if e == nil && model != otherModels && es.models[[2]string{domain, limit}] >= es.maxModel {
			return es.entries[estKey{domain, limit, otherModels}]
		}
		return e
	}
	lk := [2]string{domain, limit}
	if es.models[lk] >= es.maxModel && model != otherModels {
		k.model = otherModels
		if e := es.entries[k]; e != nil {
			return e
		}
	} else {
		es.models[lk]++
	}
	e := &estEntry{sk: es.newSk(), decayed: now}
	es.entries[k] = e
	return e
}

// decay brings e's weights to now. The caller holds e.mu.
func (es *estimator) decay(e *estEntry, now int64) {
	if es.halfLife <= 0 || now-e.decayed < es.halfLife {
		return
	}
	halves := (now - e.decayed) / es.halfLife
	e.sk.Decay(math.Pow(0.5, float64(min(halves, 64))))
	e.decayed += halves * es.halfLife
	e.stale = true
}

// estimate is the output tokens to reserve for a request of maxTokens on
// a limit and model: the learned quantile once there are MinSamples
// (decayed) samples, else fraction × maxTokens; never above maxTokens,
// at least 1.
func (es *estimator) estimate(domain, limit, model string, maxTokens int64, now int64) (est int64, learned bool) {
	fallback := max(int64(math.Ceil(es.fraction*float64(maxTokens))), 1)
	e := es.entry(domain, limit, model, false, now)
	if e == nil {
		return min(fallback, maxTokens), false
	}
	e.mu.Lock()
	es.decay(e, now)
	if e.sk.Count() < es.minN {
		e.mu.Unlock()
		return min(fallback, maxTokens), false
	}
	if e.stale {
		e.value, e.adds, e.stale = e.sk.Quantile(es.q), 0, false
	}
	v := e.value
	e.mu.Unlock()
	return min(max(int64(math.Ceil(v)), 1), maxTokens), true
}

// observe records a settled output size.
func (es *estimator) observe(domain, limit, model string, output int64, now int64) {
	e := es.entry(domain, limit, model, true, now)
	e.mu.Lock()
	es.decay(e, now)
	e.sk.Add(float64(output))
	e.adds++
	if e.stale || e.sk.Count() < es.minN+refreshEvery || e.adds >= refreshEvery {
		e.value, e.adds, e.stale = e.sk.Quantile(es.q), 0, false
	}
	e.mu.Unlock()
}
