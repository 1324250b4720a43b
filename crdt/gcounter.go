package crdt

import (
	"math"
	"slices"
	"strings"
)

// GCounter is a grow-only counter with one slot per region. Only the owner
// of a slot increments it; replicas converge by [GCounter.Merge], which
// takes the per-slot maximum, so merging is commutative, associative and
// idempotent and a counter's value never decreases. Sums saturate at
// math.MaxUint64 instead of wrapping.
//
// The zero value is an empty counter, ready to use. A GCounter is not safe
// for concurrent use; the caller serialises access.
type GCounter struct {
	slots []slot // sorted by region; never holds a zero value
}

type slot struct {
	region string
	n      uint64
}

// find returns the index of region's slot, or where it would be inserted.
func (c *GCounter) find(region string) (int, bool) {
	return slices.BinarySearchFunc(c.slots, region, func(s slot, r string) int {
		return strings.Compare(s.region, r)
	})
}

// Inc adds n to region's slot. Call it only for the slot the caller owns.
func (c *GCounter) Inc(region string, n uint64) {
	if n == 0 {
		return
	}
	i, ok := c.find(region)
	if !ok {
		c.slots = slices.Insert(c.slots, i, slot{region, n})
		return
	}
	c.slots[i].n = addSat(c.slots[i].n, n)
}

// raise sets region's slot to n if n is higher and reports whether it did.
func (c *GCounter) raise(region string, n uint64) bool {
	i, ok := c.find(region)
	switch {
	case ok && n > c.slots[i].n:
		c.slots[i].n = n
	case !ok && n > 0:
		c.slots = slices.Insert(c.slots, i, slot{region, n})
	default:
		return false
	}
	return true
}

// Value returns the sum of all slots; 0 for the zero value.
func (c *GCounter) Value() uint64 {
	var sum uint64
	for _, s := range c.slots {
		sum = addSat(sum, s.n)
	}
	return sum
}

// Slot returns region's slot; 0 if region has never counted.
func (c *GCounter) Slot(region string) uint64 {
	if i, ok := c.find(region); ok {
		return c.slots[i].n
	}
	return 0
}

// Merge folds other into c: every slot becomes the maximum of both.
// other is not modified.
func (c *GCounter) Merge(other *GCounter) {
	for _, s := range other.slots {
		c.raise(s.region, s.n)
	}
}

// Clone returns an independent copy of c.
func (c *GCounter) Clone() *GCounter {
	return &GCounter{slots: slices.Clone(c.slots)}
}

// Equal reports whether c and other hold the same value in every slot.
// A missing slot equals a slot holding 0.
func (c *GCounter) Equal(other *GCounter) bool {
	return slices.Equal(c.slots, other.slots)
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// PNCounter is a counter that can go down: increments are counted in P and
// decrements in N, two [GCounter]s with one slot per region, and its value is
// P − N. Refunds (a settled reservation that cost less than estimated) are
// decrements. Like GCounter, only a slot's owner changes it and replicas
// converge by [PNCounter.Merge].
//
// The zero value is a counter at 0, ready to use. A PNCounter is not safe for
// concurrent use; the caller serialises access.
type PNCounter struct {
	P GCounter // increments
	N GCounter // decrements
}

// Inc adds n to region's slot.
func (c *PNCounter) Inc(region string, n uint64) { c.P.Inc(region, n) }

// Dec subtracts n from region's slot.
func (c *PNCounter) Dec(region string, n uint64) { c.N.Inc(region, n) }

// Value returns P − N, clamped to the range of int64; 0 for the zero value.
func (c *PNCounter) Value() int64 {
	p, n := c.P.Value(), c.N.Value()
	switch {
	case p >= n && p-n > math.MaxInt64:
		return math.MaxInt64
	case p >= n:
		return int64(p - n)
	case n-p > math.MaxInt64:
		return math.MinInt64
	default:
		return -int64(n - p)
	}
}

// Merge folds other into c, slot by slot in both P and N.
func (c *PNCounter) Merge(other *PNCounter) {
	c.P.Merge(&other.P)
	c.N.Merge(&other.N)
}

// Clone returns an independent copy of c.
func (c *PNCounter) Clone() *PNCounter {
	return &PNCounter{P: *c.P.Clone(), N: *c.N.Clone()}
}

// Equal reports whether c and other hold the same slots in P and in N.
func (c *PNCounter) Equal(other *PNCounter) bool {
	return c.P.Equal(&other.P) && c.N.Equal(&other.N)
}
