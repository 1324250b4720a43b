package loadgen

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeTarget allows even keys and rejects odd ones, after delay, and
// records the keys it was asked about and when each call came.
type fakeTarget struct {
	delay time.Duration
	err   error

	mu    sync.Mutex
	seen  map[int]int
	calls []time.Time
}

func (f *fakeTarget) Check(ctx context.Context, keys []int) (int, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	f.mu.Unlock()
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[int]int{}
	}
	allowed := 0
	for _, k := range keys {
		f.seen[k]++
		if k%2 == 0 {
			allowed++
		}
	}
	return allowed, f.err
}

func TestClosedLoop(t *testing.T) {
	f := &fakeTarget{}
	res, err := Run(t.Context(), f, Config{Duration: 100 * time.Millisecond, Concurrency: 4, Keys: 10, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls == 0 || res.Checks != 3*res.Calls {
		t.Fatalf("calls %d, checks %d: want some calls of 3 checks", res.Calls, res.Checks)
	}
	if res.Allowed == 0 || res.Rejected == 0 || res.Allowed+res.Rejected != res.Checks {
		t.Errorf("allowed %d + rejected %d, want both > 0 summing to checks %d", res.Allowed, res.Rejected, res.Checks)
	}
	if res.Errors != 0 || res.Unsent != 0 || res.FirstError != nil {
		t.Errorf("errors %d, unsent %d, first error %v; want none", res.Errors, res.Unsent, res.FirstError)
	}
	for k := range f.seen {
		if k < 0 || k >= 10 {
			t.Errorf("key %d outside [0, 10)", k)
		}
	}
	p50, p99, top := res.Quantile(0.5), res.Quantile(0.99), res.Quantile(1)
	if p50 <= 0 || p50 > p99 || p99 > top {
		t.Errorf("p50 %v, p99 %v, max %v: want 0 < p50 ≤ p99 ≤ max", p50, p99, top)
	}
	if res.Elapsed < 100*time.Millisecond || res.Throughput() <= 0 {
		t.Errorf("elapsed %v, throughput %v", res.Elapsed, res.Throughput())
	}
}

func TestOpenLoopKeepsTheRate(t *testing.T) {
	// 2000 checks/s in batches of 2 for 500 ms: 500 calls, 1 ms apart.
	f := &fakeTarget{}
	start := time.Now()
	res, err := Run(t.Context(), f, Config{Duration: 500 * time.Millisecond, Concurrency: 8, Keys: 100, Batch: 2, Rate: 2000})
	if err != nil {
		t.Fatal(err)
	}
	// How many are sent depends on the machine's load; how many were
	// scheduled does not, and no call may go ahead of its time: the k-th
	// call to arrive was due k ms after the start, or later.
	if res.Calls > 500 || res.Calls < 100 || res.Calls+res.Unsent != 500 {
		t.Errorf("calls %d, unsent %d: want most of the 500 scheduled calls sent", res.Calls, res.Unsent)
	}
	slices.SortFunc(f.calls, time.Time.Compare)
	for k, at := range f.calls {
		if due := start.Add(time.Duration(k) * time.Millisecond); at.Before(due) {
			t.Fatalf("call %d sent %v ahead of its time", k, due.Sub(at))
		}
	}
}

// A server that takes 20 ms per call, under 200 calls/s with one call in
// flight, falls further behind with every call. Measured from its
// scheduled send time, the k-th call takes at least k × 15 ms + 20 ms,
// where a closed loop reports 20 ms.
func TestOpenLoopAvoidsCoordinatedOmission(t *testing.T) {
	slow := &fakeTarget{delay: 20 * time.Millisecond}
	cfg := Config{Duration: 400 * time.Millisecond, Concurrency: 1, Keys: 10}
	closed, err := Run(t.Context(), slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rate = 200
	open, err := Run(t.Context(), slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p := closed.Quantile(0.5); p < 20*time.Millisecond || p > 100*time.Millisecond {
		t.Errorf("closed loop p50 %v, want about 20ms", p)
	}
	// One worker sends at most 400/20 + 1 of the 80 calls scheduled.
	if open.Calls < 2 || open.Calls > 21 || open.Unsent != 80-open.Calls {
		t.Fatalf("open loop: calls %d, unsent %d; want at most 21 of 80 sent", open.Calls, open.Unsent)
	}
	if want := time.Duration(open.Calls-1) * 14 * time.Millisecond; open.Quantile(1) < want {
		t.Errorf("open loop max %v after %d calls, want the backlog (≥ %v) counted", open.Quantile(1), open.Calls, want)
	}
}

func TestErrorsAreCounted(t *testing.T) {
	boom := errors.New("boom")
	res, err := Run(t.Context(), &fakeTarget{err: boom}, Config{Duration: 50 * time.Millisecond, Concurrency: 2, Keys: 10, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls == 0 || res.Errors != res.Checks || res.Allowed+res.Rejected != 0 || !errors.Is(res.FirstError, boom) {
		t.Errorf("calls %d, checks %d, errors %d, allowed %d, rejected %d, first %v: want every check an error",
			res.Calls, res.Checks, res.Errors, res.Allowed, res.Rejected, res.FirstError)
	}
	if res.Quantile(0.99) != 0 || res.Throughput() != 0 {
		t.Errorf("p99 %v, throughput %v: want no answered call", res.Quantile(0.99), res.Throughput())
	}
}

func TestCancelStopsWithoutCountingErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, &fakeTarget{delay: time.Hour}, Config{Duration: time.Hour, Concurrency: 4, Keys: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls != 0 || res.Errors != 0 {
		t.Errorf("calls %d, errors %d: calls cut short by the context must not count", res.Calls, res.Errors)
	}
}

func TestZipfFavoursLowKeys(t *testing.T) {
	f := &fakeTarget{}
	if _, err := Run(t.Context(), f, Config{Duration: 100 * time.Millisecond, Concurrency: 2, Keys: 100, Zipf: 1.5, Batch: 10}); err != nil {
		t.Fatal(err)
	}
	tail := 0
	for k, n := range f.seen {
		if k < 0 || k >= 100 {
			t.Errorf("key %d outside [0, 100)", k)
		}
		if k >= 50 {
			tail += n
		}
	}
	if f.seen[0] <= tail {
		t.Errorf("key 0 drawn %d times, keys 50-99 %d times: want key 0 hotter than the whole upper half", f.seen[0], tail)
	}
}

func TestBadConfig(t *testing.T) {
	ok := Config{Duration: time.Second, Concurrency: 1, Keys: 1}
	for name, mutate := range map[string]func(*Config){
		"no duration":      func(c *Config) { c.Duration = 0 },
		"no concurrency":   func(c *Config) { c.Concurrency = 0 },
		"no keys":          func(c *Config) { c.Keys = 0 },
		"negative rate":    func(c *Config) { c.Rate = -1 },
		"zipf exponent 1":  func(c *Config) { c.Zipf = 1 },
		"batch too large":  func(c *Config) { c.Batch = MaxBatch + 1 },
		"negative batch":   func(c *Config) { c.Batch = -1 },
		"negative seconds": func(c *Config) { c.Duration = -time.Second },
	} {
		cfg := ok
		mutate(&cfg)
		if _, err := Run(t.Context(), &fakeTarget{}, cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: got %v, want ErrBadConfig", name, err)
		}
	}
}

func TestMainRefusesBadFlags(t *testing.T) {
	systems := map[string]System{"allot": NewAllot}
	for _, args := range [][]string{
		{"--system", "gubernator"},
		{"--conns", "0"},
		{"--concurrency", "0"},
		{"--zipf", "0.5"},
		{"extra"},
	} {
		if err := Main(t.Context(), "bench", systems, args, io.Discard, io.Discard); err == nil {
			t.Errorf("%q: want an error", args)
		}
	}
}
