package sim

import (
	"context"
	"time"

	"github.com/allot-dev/allot/regional"
)

// simStore is a region's regional store: a regional.MemoryStore that
// takes time from the simulation's true clock, as the Redis store takes
// it from Redis (TIME), whatever the calling instance's clock says, and
// that counts the calls made to it for the figures. A store outage is
// the MemoryStore's own SetErr.
type simStore struct {
	m regional.MemoryStore
	w *world
	r int // the region's index, for the counts
}

var (
	_ regional.Store            = (*simStore)(nil)
	_ regional.ReservationStore = (*simStore)(nil)
)

func (s *simStore) call() time.Time {
	s.w.m.storeCalls[s.r]++
	return s.w.now
}

// Take implements regional.Store.
func (s *simStore) Take(ctx context.Context, _ time.Time, ops []regional.TakeOp, res []regional.TakeResult) error {
	return s.m.Take(ctx, s.call(), ops, res)
}

// Lease implements regional.Store.
func (s *simStore) Lease(ctx context.Context, _ time.Time, ops []regional.LeaseOp, res []regional.LeaseResult) error {
	return s.m.Lease(ctx, s.call(), ops, res)
}

// Heartbeat implements regional.Store. Heartbeats are background calls,
// counted apart from the request path's.
func (s *simStore) Heartbeat(ctx context.Context, _ time.Time, region, instance string, ttl time.Duration) (int, error) {
	s.w.m.heartbeats[s.r]++
	return s.m.Heartbeat(ctx, s.w.now, region, instance, ttl)
}

// Charge implements regional.ReservationStore.
func (s *simStore) Charge(ctx context.Context, _ time.Time, ops []regional.TakeOp, res []regional.TakeResult) error {
	return s.m.Charge(ctx, s.call(), ops, res)
}

// Acquire implements regional.ReservationStore.
func (s *simStore) Acquire(ctx context.Context, _ time.Time, ops []regional.SlotOp, res []regional.SlotResult) error {
	return s.m.Acquire(ctx, s.call(), ops, res)
}

// Free implements regional.ReservationStore.
func (s *simStore) Free(ctx context.Context, _ time.Time, ops []regional.SlotOp) error {
	return s.m.Free(ctx, s.call(), ops)
}
