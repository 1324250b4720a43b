package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Target is the system under load. Check decides one check per key in a
// single call and returns how many of them were allowed. Run calls it from
// Config.Concurrency goroutines at once.
type Target interface {
	Check(ctx context.Context, keys []int) (allowed int, err error)
}

// Config is a load shape. Duration, Concurrency and Keys must be positive;
// the zero values of the other fields mean closed loop, uniform keys,
// batches of one, seed 0.
type Config struct {
	Duration time.Duration
	// Concurrency is the number of workers, so the most calls in flight.
	Concurrency int
	// Rate is the open loop's checks per second; 0 runs a closed loop.
	Rate float64
	// Keys is the number of distinct keys, 0 … Keys-1.
	Keys int
	// Zipf, above 1, draws keys from a Zipf distribution of that exponent
	// (key 0 the hottest) instead of uniformly.
	Zipf float64
	// Batch is the number of checks per call; 0 means 1.
	Batch int
	// Seed seeds the key draws; worker i draws from (Seed, i).
	Seed uint64
}

// MaxBatch bounds Config.Batch.
const MaxBatch = 1000

// ErrBadConfig is returned by Run for a Config it cannot run.
var ErrBadConfig = errors.New("loadgen: bad config")

func (c *Config) validate() error {
	if c.Batch == 0 {
		c.Batch = 1
	}
	switch {
	case c.Duration <= 0:
		return fmt.Errorf("%w: duration %v is not positive", ErrBadConfig, c.Duration)
	case c.Concurrency < 1:
		return fmt.Errorf("%w: concurrency %d is below 1", ErrBadConfig, c.Concurrency)
	case c.Keys < 1:
		return fmt.Errorf("%w: keys %d is below 1", ErrBadConfig, c.Keys)
	case c.Rate < 0:
		return fmt.Errorf("%w: rate %v is negative", ErrBadConfig, c.Rate)
	case c.Zipf != 0 && c.Zipf <= 1:
		return fmt.Errorf("%w: zipf exponent %v must be above 1", ErrBadConfig, c.Zipf)
	case c.Batch < 1 || c.Batch > MaxBatch:
		return fmt.Errorf("%w: batch %d is outside [1, %d]", ErrBadConfig, c.Batch, MaxBatch)
	}
	return nil
}

// Result is what a run measured. Checks = Allowed + Rejected + Errors.
type Result struct {
	Calls    int64 // calls sent, answered or failed
	Checks   int64 // checks sent: Calls × batch
	Allowed  int64
	Rejected int64
	Errors   int64 // checks whose call failed
	// Unsent counts the open loop's scheduled calls that were not sent
	// before the run ended, every worker still waiting for an answer: the
	// target did not keep up with the rate.
	Unsent     int64
	FirstError error
	// Elapsed runs from the start to the last answer.
	Elapsed time.Duration

	latency *hdrhistogram.Histogram // of answered calls, in nanoseconds
}

// Throughput is the answered checks per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Allowed+r.Rejected) / r.Elapsed.Seconds()
}

// Quantile is the latency at quantile q in [0, 1] of the answered calls
// (1 is the maximum); 0 when none was answered.
func (r *Result) Quantile(q float64) time.Duration {
	if r.latency == nil {
		return 0
	}
	return time.Duration(r.latency.ValueAtQuantile(q * 100))
}

// Latencies are recorded from 1µs to a minute with 3 significant digits:
// about 130 KB of histogram per worker.
const (
	minLatency = time.Microsecond
	maxLatency = time.Minute
)

// Run puts cfg's load on t until cfg.Duration has passed, or ctx is done,
// and waits for the calls in flight. It fails only for a bad Config; the
// calls' errors are counted in the Result. Errors of calls cut short by ctx
// are not counted.
func Run(ctx context.Context, t Target, cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	s := schedule{start: time.Now()}
	s.end = s.start.Add(cfg.Duration)
	if cfg.Rate > 0 {
		s.interval = float64(time.Second) * float64(cfg.Batch) / cfg.Rate
	}
	workers := make([]*worker, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := newWorker(cfg, i)
		workers[i] = w
		wg.Go(func() { w.run(ctx, t, &s) })
	}
	wg.Wait()

	res := Result{Elapsed: time.Since(s.start), latency: workers[0].latency}
	for i, w := range workers {
		if i > 0 {
			res.latency.Merge(w.latency)
		}
		res.Calls += w.calls
		res.Allowed += w.allowed
		res.Rejected += w.rejected
		res.Errors += w.errors
		if res.FirstError == nil {
			res.FirstError = w.firstError
		}
	}
	res.Checks = res.Calls * int64(cfg.Batch)
	if s.interval > 0 {
		slots := int64(math.Ceil(float64(cfg.Duration) / s.interval))
		res.Unsent = max(0, slots-res.Calls)
	}
	return res, nil
}

// schedule hands out send times. In closed loop a call is due when a
// worker is free; in open loop call i is due at start + i × interval.
type schedule struct {
	start, end time.Time
	interval   float64 // nanoseconds between calls; 0 in closed loop
	next       atomic.Int64
}

// due returns the next call's send time, or false once the run is over.
func (s *schedule) due() (time.Time, bool) {
	now := time.Now()
	if s.interval == 0 {
		return now, now.Before(s.end)
	}
	at := s.start.Add(time.Duration(float64(s.next.Add(1)-1) * s.interval))
	return at, at.Before(s.end) && now.Before(s.end)
}

// worker sends one call at a time and keeps its own counts, so workers
// share nothing but the schedule.
type worker struct {
	rng     *rand.Rand
	zipf    *rand.Zipf // nil: uniform keys
	keys    []int
	nkeys   int
	timer   *time.Timer
	latency *hdrhistogram.Histogram

	calls, allowed, rejected, errors int64
	firstError                       error
}

func newWorker(cfg Config, id int) *worker {
	w := &worker{
		rng:     rand.New(rand.NewPCG(cfg.Seed, uint64(id))),
		keys:    make([]int, cfg.Batch),
		nkeys:   cfg.Keys,
		latency: hdrhistogram.New(int64(minLatency), int64(maxLatency), 3),
	}
	if cfg.Zipf > 1 {
		w.zipf = rand.NewZipf(w.rng, cfg.Zipf, 1, uint64(cfg.Keys-1))
	}
	return w
}

func (w *worker) run(ctx context.Context, t Target, s *schedule) {
	for ctx.Err() == nil {
		at, ok := s.due()
		if !ok {
			return
		}
		if d := time.Until(at); d > 0 {
			if !w.sleep(ctx, d) {
				return
			}
			// A call that was waited for goes out on time: the timer's
			// lateness (up to a millisecond on Linux) is the generator's,
			// not the target's. A call that was overdue when a worker came
			// free keeps its due time, so the target's backlog counts.
			at = time.Now()
		}
		for i := range w.keys {
			if w.zipf != nil {
				w.keys[i] = int(w.zipf.Uint64())
			} else {
				w.keys[i] = w.rng.IntN(w.nkeys)
			}
		}
		allowed, err := t.Check(ctx, w.keys)
		lat := time.Since(at)
		if err != nil && ctx.Err() != nil {
			return
		}
		w.calls++
		if err != nil {
			w.errors += int64(len(w.keys))
			if w.firstError == nil {
				w.firstError = err
			}
			continue
		}
		w.allowed += int64(allowed)
		w.rejected += int64(len(w.keys) - allowed)
		_ = w.latency.RecordValue(int64(min(max(lat, minLatency), maxLatency))) // in range: cannot fail
	}
}

// sleep sleeps for d, or returns false when ctx is done first.
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
