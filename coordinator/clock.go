package coordinator

import "time"

// ClockSync estimates an instance's clock offset from the coordinator's,
// from the echoes of its reports (ClockEcho) as NTP does: for a report
// sent at t1 (the instance's clock), taken at T2 and echoed at T3 (the
// coordinator's) and received back at t4, the offset is
// ((T2 − t1) + (T3 − t4)) / 2, within half the round trip less the
// coordinator's hold, (t4 − t1 − (T3 − T2)) / 2, whatever the asymmetry
// of the two ways. The estimate is the sample with the least such error
// among the recent ones, its error grown by the drift since it was taken.
//
// The zero value knows nothing: Offset reports ok false. Not safe for
// concurrent use; the caller serialises.
type ClockSync struct {
	samples [clockSamples]clockSample
	n, next int
}

type clockSample struct {
	at     time.Time // t4, the instance's clock
	offset time.Duration
	err    time.Duration
}

const (
	clockSamples = 16
	// clockSampleAge is how long a sample is kept: older ones are
	// replaced by newer ones in turn.
	clockSampleAge = 5 * time.Minute
	// ClockDrift is what the estimate's error grows by per second of the
	// sample's age: 100 ppm, twice what a common crystal is rated for.
	ClockDrift = 100e-6
)

// Sample adds the echo e of a report, received back at now (the
// instance's clock). An echo that contradicts itself (the coordinator
// sent before it received, or the answer came before the report left) is
// ignored; Sample reports whether it was used.
func (c *ClockSync) Sample(now time.Time, e ClockEcho) bool {
	hold, rtt := e.Sent.Sub(e.Received), now.Sub(e.ReportAt)
	if hold < 0 || rtt < hold || e.ReportAt.IsZero() || e.Received.IsZero() {
		return false
	}
	s := clockSample{at: now, offset: (e.Received.Sub(e.ReportAt) + e.Sent.Sub(now)) / 2, err: (rtt - hold + 1) / 2}
	c.samples[c.next] = s
	c.next = (c.next + 1) % clockSamples
	c.n = min(c.n+1, clockSamples)
	return true
}

// Offset returns what to add to the instance's clock at now to read the
// coordinator's, and the most that may be off by; ok is false before the
// first sample and when every sample is older than clockSampleAge.
//
// Each sample bounds the offset to its own offset ± its error (grown by
// the drift since): the estimate is the middle of where the recent
// samples' bounds overlap, newest first, and its error half that
// overlap. It is as strict a bound as the best sample's and, as the
// fastest trip each way may come from different samples, closer to true
// time than any one of them: one sample's offset is off by half the
// asymmetry of its two trips, the overlap's middle by half that of the
// fastest trip each way (NTP's intersection of correct intervals). A
// sample whose bound misses those of the newer ones (the clock was set,
// or stepped) ends the overlap: the older ones are not taken.
func (c *ClockSync) Offset(now time.Time) (offset, err time.Duration, ok bool) {
	var lo, hi time.Duration
	for i := range c.n {
		s := c.samples[(c.next-1-i+2*clockSamples)%clockSamples] // newest first
		age := now.Sub(s.at)
		if age > clockSampleAge {
			continue
		}
		e := s.err + time.Duration(float64(max(age, 0))*ClockDrift)
		l, h := s.offset-e, s.offset+e
		if ok && (l > hi || h < lo) {
			break
		}
		if !ok {
			lo, hi, ok = l, h, true
			continue
		}
		lo, hi = max(lo, l), min(hi, h)
	}
	if !ok {
		return 0, 0, false
	}
	return lo + (hi-lo)/2, (hi - lo + 1) / 2, true
}
