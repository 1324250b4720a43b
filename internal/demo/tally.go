package demo

import "sync"

// Count is admitted and rejected decisions.
type Count struct {
	Admitted, Rejected uint64
}

// cell names one region's counts of one limit.
type cell struct {
	region, limit string
}

// Tally counts decisions by region and limit ("domain/limit") between
// two Takes. The zero value is ready; safe for concurrent use.
type Tally struct {
	mu     sync.Mutex
	counts map[cell]Count
}

// Add counts one decision of limit in region.
func (t *Tally) Add(region, limit string, admitted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = map[cell]Count{}
	}
	c := t.counts[cell{region, limit}]
	if admitted {
		c.Admitted++
	} else {
		c.Rejected++
	}
	t.counts[cell{region, limit}] = c
}

// Take returns the counts since the previous Take, region → limit →
// count, and starts over.
func (t *Tally) Take() map[string]map[string]Count {
	t.mu.Lock()
	counts := t.counts
	t.counts = nil
	t.mu.Unlock()
	out := map[string]map[string]Count{}
	for k, c := range counts {
		if out[k.region] == nil {
			out[k.region] = map[string]Count{}
		}
		out[k.region][k.limit] = c
	}
	return out
}
