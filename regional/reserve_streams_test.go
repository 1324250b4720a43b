package regional

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// The streams workload: 1000 concurrent LLM streams of one tenant against
// a token budget they want twice over. docs/design.md section 10 targets
// over-admission ≤ 1% of the limit; the issue asks for false rejects
// caused by over-reservation ≤ 5%, compared with charging after the
// response.
const (
	streamsCount   = 1000
	streamsMaxOut  = 4096 // max_tokens
	streamsSpeed   = 50   // output tokens per second
	streamsTick    = 100 * time.Millisecond
	streamsHorizon = 5 * time.Minute
)

func streamsConfig(limit int64) string {
	return fmt.Sprintf(`
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: %d/1m}
`, limit)
}

// strategy is how a gateway holds a stream's tokens.
type strategy int

const (
	reserveLearned strategy = iota // Reserve: prompt + learned p90, Settle the rest
	reserveMax                     // Reserve: prompt + max_tokens, Settle the rest
	chargeAfter                    // admit while the balance is ≥ 0, charge the real cost after the response
	reserveExact                   // Reserve the real cost (an oracle): the reference for false rejects
	reserveMedian                  // Reserve: prompt + learned p50, Settle the rest
)

var strategyNames = []string{"reserve p90 (learned)", "reserve max_tokens", "charge after response", "reserve real cost (oracle)", "reserve p50 (learned)"}

type streamsResult struct {
	limit                      float64
	attempts, admitted         int64 // Reserve calls (retries too), admissions
	requests, rejectedRequests int64 // asks, and asks rejected at least once
	// falseRejects counts asks rejected at least once while the budget,
	// had every stream in flight been charged its real cost, had room for
	// them: rejected because of over-reservation.
	falseRejects int64
	consumed     float64 // real cost of every admitted stream
	// used is what the streams used by the end: the real cost of the
	// finished ones, and of those in flight their prompt and the output
	// streamed so far.
	used   float64
	budget float64 // burst + rate × horizon
	// worstAdmitted and worstUsed are the largest excess of consumed and
	// used over burst + rate × t at any tick t, over the limit.
	worstAdmitted, worstUsed float64
	peakInFlight             int64
}

func (r streamsResult) falseRejectRate() float64 {
	return float64(r.falseRejects) / float64(max(r.requests, 1))
}

// stream is one simulated client: it asks, streams for a while, settles,
// thinks, asks again. Its randomness is its own, so every strategy sees
// the same requests in the same order.
type stream struct {
	rnd      *rand.Rand
	prompt   int64
	output   int64
	id       string
	charged  int64     // what its admission holds on the limit
	next     time.Time // its next action
	inFlight bool
	since    time.Time // admitted at
	retrying bool      // its ask was rejected: the next attempt is a retry
	falsely  bool      // its ask was rejected while real costs left room
}

func (s *stream) draw() {
	s.prompt = 200 + s.rnd.Int64N(601)
	// Skewed output sizes: log-normal, median 250 tokens, σ = 1 (mean
	// ≈ 410, p90 ≈ 900, p99 ≈ 2560), cut at max_tokens.
	s.output = min(int64(math.Round(250*math.Exp(s.rnd.NormFloat64()))), streamsMaxOut)
}

// runStreams drives streamsCount goroutines, one per stream, on a virtual
// clock: every tick, the streams due to act do so concurrently, and the
// clock advances when they all have.
func runStreams(t testing.TB, strat strategy, limit int64, seed uint64) streamsResult {
	opts := ReservationOptions{Rand: rand.New(rand.NewPCG(seed, 99)), TTL: time.Hour}
	if strat == reserveMedian {
		opts.Quantile = 0.5
	}
	rs := NewReservations(New(mustConfig(t, streamsConfig(limit)), Options{}), nil, opts)
	e := rs.engine
	desc := []allot.Descriptor{tenant("acme")}
	var res streamsResult
	var slack atomic.Int64 // Σ over streams in flight of (charged − real cost)
	var inFlight atomic.Int64
	var consumed atomic.Int64
	var attempts, admitted, requests, rejected, falseRejects atomic.Int64

	balance := func(now time.Time) float64 { return tokenBalance(e, "llm", "tenant-tokens", tenant("acme"), now) }

	act := func(s *stream, now time.Time) {
		if s.inFlight { // the response is complete
			cost := s.prompt + s.output
			switch strat {
			case chargeAfter:
				if err := e.Charge(now, "llm", tenant("acme"), cost); err != nil {
					t.Error(err)
				}
			default:
				if _, err := rs.Settle(bg, now, s.id, s.prompt, s.output); err != nil {
					t.Error(err)
				}
			}
			slack.Add(-(s.charged - cost))
			inFlight.Add(-1)
			s.inFlight, s.retrying, s.falsely = false, false, false
			s.next = now.Add(time.Duration(s.rnd.Int64N(int64(2 * time.Second))))
			s.draw()
			return
		}
		attempts.Add(1)
		if !s.retrying {
			requests.Add(1)
		}
		cost := s.prompt + s.output
		var ok bool
		var retry time.Duration
		switch strat {
		case chargeAfter:
			var dec allot.Decision
			if err := e.Check(now, "llm", tenant("acme"), 0, &dec); err != nil {
				t.Error(err)
			}
			ok, retry, s.charged = dec.Allowed, dec.RetryAfter, 0
		default:
			req := ReserveRequest{Domain: "llm", Descriptors: desc, PromptTokens: s.prompt, MaxTokens: streamsMaxOut, Model: "m"}
			switch strat {
			case reserveMax:
				req.Estimate = streamsMaxOut
			case reserveExact:
				req.Estimate = max(s.output, 1)
			}
			r, err := rs.Reserve(bg, now, req)
			if err != nil {
				t.Error(err)
				return
			}
			ok, retry, s.id, s.charged = r.Allowed, r.RetryAfter, r.ID, r.Reserved
		}
		if !ok {
			if !s.retrying {
				rejected.Add(1)
			}
			s.retrying = true
			// Would it have passed had every stream in flight been
			// charged its real cost? Then over-reservation rejected it.
			if !s.falsely && balance(now)+float64(slack.Load()) >= float64(cost) {
				s.falsely = true
				falseRejects.Add(1)
			}
			s.next = now.Add(max(retry, streamsTick) + time.Duration(s.rnd.Int64N(int64(time.Second))))
			return
		}
		admitted.Add(1)
		consumed.Add(cost)
		slack.Add(s.charged - cost)
		n := inFlight.Add(1)
		for p := atomic.LoadInt64(&res.peakInFlight); n > p && !atomic.CompareAndSwapInt64(&res.peakInFlight, p, n); p = atomic.LoadInt64(&res.peakInFlight) {
		}
		s.inFlight, s.since = true, now
		s.next = now.Add(300*time.Millisecond + time.Duration(s.output)*time.Second/streamsSpeed)
	}

	streams := make([]*stream, streamsCount)
	wake := make([]chan time.Time, streamsCount)
	var wg sync.WaitGroup
	for i := range streams {
		s := &stream{rnd: rand.New(rand.NewPCG(seed, uint64(i)))}
		s.draw()
		s.next = t0.Add(time.Duration(s.rnd.Int64N(int64(5 * time.Second)))) // arrivals spread over 5s
		streams[i], wake[i] = s, make(chan time.Time)
		go func() {
			for now := range wake[i] {
				act(s, now)
				wg.Done()
			}
		}()
	}
	end := t0.Add(streamsHorizon)
	// usedBy is what the streams used by at: the in-flight ones stream
	// their output at an even pace. Called between ticks.
	usedBy := func(at time.Time) float64 {
		used := float64(consumed.Load())
		for _, s := range streams {
			if s.inFlight {
				left := float64(s.next.Sub(at)) / float64(s.next.Sub(s.since))
				used -= float64(s.output) * min(1, max(0, left))
			}
		}
		return used
	}
	for now := t0; now.Before(end); now = now.Add(streamsTick) {
		for i, s := range streams {
			if !s.next.After(now) { // read between ticks: the goroutine is idle
				wg.Add(1)
				wake[i] <- now
			}
		}
		wg.Wait()
		budget := float64(limit) * (1 + now.Sub(t0).Minutes())
		res.worstAdmitted = max(res.worstAdmitted, (float64(consumed.Load())-budget)/float64(limit))
		res.worstUsed = max(res.worstUsed, (usedBy(now)-budget)/float64(limit))
	}
	for _, w := range wake {
		close(w)
	}
	res.used = usedBy(end)
	res.attempts, res.admitted, res.requests, res.rejectedRequests = attempts.Load(), admitted.Load(), requests.Load(), rejected.Load()
	res.falseRejects, res.consumed, res.limit = falseRejects.Load(), float64(consumed.Load()), float64(limit)
	res.budget = res.limit + res.limit*streamsHorizon.Minutes()
	return res
}

// tokenBalance reads a token bucket's balance, negative after an
// overcharge, without charging it.
func tokenBalance(e *Engine, domain, limit string, d allot.Descriptor, now time.Time) float64 {
	ls := e.cfg.Load().domain(domain).byName[limit]
	key, _ := e.matchKey(ls, d)
	sh := &e.table.shards[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(key)
	if i < 0 {
		return ls.base.burst
	}
	s := &sh.slots[i]
	return tokensAt(s, max(now.UnixNano(), lastUpdate(s, ls.base.alg)), ls.base)
}

// TestThousandStreams measures, on one workload, what each way of holding
// tokens admits above the budget and how many asks it rejects that real
// costs would have let through, at three loads. Run it with -v for the
// table; the race detector runs one load and three strategies.
//
// Over-admission is measured at every tick t as what the streams used by
// t above burst + rate × t (an in-flight stream has used its prompt and
// the output streamed so far), and also as what was admitted (the whole
// real cost of every stream admitted by t), over the limit.
func TestThousandStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("streams: -short")
	}
	// Unhindered, the streams want ≈ 4.9M tokens a minute.
	loads := []struct {
		name  string
		limit int64
	}{{"demand ≈ limit", 4_900_000}, {"demand ≈ 1.2 × limit", 4_000_000}, {"demand ≈ 2 × limit", 2_500_000}}
	strategies := []strategy{reserveLearned, reserveMax, chargeAfter, reserveExact, reserveMedian}
	if raceEnabled {
		loads, strategies = loads[1:2], []strategy{reserveLearned, chargeAfter, reserveExact}
	}
	for _, load := range loads {
		t.Run(load.name, func(t *testing.T) {
			results := make(map[strategy]streamsResult)
			for _, s := range strategies {
				results[s] = runStreams(t, s, load.limit, 42)
			}
			// vs oracle: asks rejected above those rejected when reserving
			// real costs; it varies by a few percent from run to run (the
			// order of the streams within a tick), so it is only reported.
			oracle := results[reserveExact]
			excess := func(r streamsResult) float64 {
				return float64(r.rejectedRequests-oracle.rejectedRequests) / float64(r.requests)
			}
			t.Logf("%d streams, limit %d tokens/min, %v: budget %.0f tokens", streamsCount, load.limit, streamsHorizon, oracle.budget)
			t.Logf("%-27s %8s %7s %8s %8s %14s %10s %9s %10s %10s %5s", "strategy", "attempts", "asks", "admitted", "rejected",
				"false rejects", "vs oracle", "budget", "over-use", "over-adm.", "peak")
			for _, s := range strategies {
				r := results[s]
				t.Logf("%-27s %8d %7d %8d %8d %6d %6.2f%% %9.2f%% %8.2f%% %9.3f%% %9.3f%% %5d", strategyNames[s], r.attempts, r.requests, r.admitted,
					r.rejectedRequests, r.falseRejects, 100*r.falseRejectRate(), 100*excess(r),
					100*r.consumed/r.budget, 100*r.worstUsed, 100*r.worstAdmitted, r.peakInFlight)
			}
			learned := results[reserveLearned]
			if learned.worstUsed > 0.01 {
				t.Errorf("reserve-then-settle used %.3f%% of the limit above the budget, target ≤ 1%%", 100*learned.worstUsed)
			}
			if learned.consumed < 0.97*learned.budget && learned.rejectedRequests > 0 {
				t.Errorf("reserve-then-settle rejected asks with %.1f%% of the budget used", 100*learned.consumed/learned.budget)
			}
			if load.limit >= 4_900_000 && learned.falseRejectRate() > 0.05 {
				t.Errorf("reserve-then-settle: %.2f%% of asks falsely rejected, target ≤ 5%%", 100*learned.falseRejectRate())
			}
			if after := results[chargeAfter]; learned.rejectedRequests > 0 && after.worstUsed <= learned.worstUsed {
				t.Errorf("charging after the response used no more than reserving: the workload does not stress the budget")
			}
		})
	}
}
