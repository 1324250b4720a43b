package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// call decides one LLM call now and, if it is admitted, ends it when its
// response has streamed. Its figures count its real cost (prompt +
// output) in the window it was admitted in: over-admission is what the
// calls a window let in really cost, above L.
//
//   - allot (and naive): regional.Reservations holds prompt + the p90 of
//     recent outputs (a fraction of max_tokens until it has samples) and
//     settles the real cost when the call ends.
//   - charge-after: admitted while the token limit is not exhausted (a
//     check of 0 tokens), charged its real cost when the call ends.
//   - the ideal limiter knows the real cost at admission and charges it.
func (w *world) call(s *stream, in *instance, id int, a arrival) {
	r, c := s.r, s.t.LLM
	cost := a.prompt + a.output
	dur := c.Latency + time.Duration(float64(a.output)/c.TokensPerS*float64(time.Second))
	desc := allot.Descriptor{{Key: s.t.Entry, Value: w.keys.values[id]}}
	var ok bool
	var err error
	var end func()
	switch w.sys {
	case ideal:
		ok, err = w.check(r, in, desc, cost)
	case ChargeAfter:
		if ok, err = w.check(r, in, desc, 0); ok {
			end = func() {
				if err := in.e.Charge(w.clockOf(r, in), w.dom.Name, desc, cost); err != nil {
					panic(fmt.Sprintf("%s: charge %v: %v", r.name, desc, err))
				}
			}
		}
	default:
		var res regional.Reservation
		res, err = in.rs.Reserve(w.ctx, w.clockOf(r, in), regional.ReserveRequest{Domain: w.dom.Name,
			Descriptors: []allot.Descriptor{desc}, PromptTokens: a.prompt, MaxTokens: c.MaxTokens, Model: c.Model})
		if ok = err == nil && res.Allowed; ok {
			end = func() {
				if _, err := in.rs.Settle(w.ctx, w.clockOf(r, in), res.ID, a.prompt, a.output); err != nil {
					panic(fmt.Sprintf("%s: settle %s: %v", r.name, res.ID, err))
				}
			}
		}
	}
	if err != nil && !errors.Is(err, regional.ErrCostAboveBurst) {
		panic(fmt.Sprintf("%s: %s call %v: %v", r.name, w.sys, desc, err))
	}
	if ok {
		w.m.add(w.now, r.idx, id, 1, float64(cost), 0)
		w.m.inFlight++
		w.m.maxInFlight = max(w.m.maxInFlight, w.m.inFlight)
		w.after(dur, func() {
			w.m.inFlight--
			if end != nil {
				end()
			}
		})
	} else {
		w.m.add(w.now, r.idx, id, 1, 0, float64(cost))
	}
}
