package crdt

import "fmt"

// Verdict is what [Tracker.Observe] concludes from a sequence number. The
// zero Verdict is [Duplicate].
type Verdict uint8

// Verdicts, for an origin whose last sequence number seen is last.
const (
	// Duplicate: seq == last. The delta was seen already.
	Duplicate Verdict = iota
	// Old: seq < last. The delta is late or repeated, or the origin
	// restarted its numbering (see [Tracker.Reset]).
	Old
	// Next: seq == last+1. Nothing was missed.
	Next
	// Gap: seq > last+1. Deltas last+1 … seq−1 were missed: ask the origin
	// for its full state.
	Gap
)

var verdictNames = [...]string{"Duplicate", "Old", "Next", "Gap"}

// String returns the verdict's name.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", v)
}

// Tracker follows the sequence numbers of the deltas received from each
// origin and says whether any were missed. Origins number their deltas
// 1, 2, 3 …; an origin never seen has last = 0.
//
// Apply every delta whatever the verdict: [Store.Apply] is idempotent and
// order-insensitive, and the verdict only says whether something was lost.
// On [Gap], ask the origin for its [Store.FullState], apply it and call
// [Tracker.Reset] with its sequence number.
//
// The zero value tracks no origin and is ready to use. A Tracker is not safe
// for concurrent use; the caller serialises access.
type Tracker struct {
	last map[string]uint64
}

// Observe records seq from origin and returns its verdict. On [Next] and
// [Gap] seq becomes origin's last, so one loss is reported once.
func (t *Tracker) Observe(origin string, seq uint64) Verdict {
	last := t.last[origin]
	switch {
	case seq == last:
		return Duplicate
	case seq < last:
		return Old
	}
	if t.last == nil {
		t.last = make(map[string]uint64)
	}
	t.last[origin] = seq
	if seq == last+1 {
		return Next
	}
	return Gap
}

// Reset sets origin's last sequence number to seq, lower or higher: after
// the receiver applied origin's full state as of seq, or when origin
// restarted and numbers its deltas from 1 again.
func (t *Tracker) Reset(origin string, seq uint64) {
	if t.last == nil {
		t.last = make(map[string]uint64)
	}
	t.last[origin] = seq
}

// Last returns the last sequence number recorded for origin; 0 if none.
func (t *Tracker) Last(origin string) uint64 { return t.last[origin] }
