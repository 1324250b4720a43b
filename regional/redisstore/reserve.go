package redisstore

import (
	"context"
	_ "embed"
	"time"

	"github.com/allot-dev/allot/regional"
)

var (
	//go:embed lua/charge.lua
	chargeLua string
	//go:embed lua/slots.lua
	slotsLua string
	//go:embed lua/free.lua
	freeLua string

	chargeScript = newCharging(bucketLua + chargeLua)
	slotsScript  = newCharging(slotsLua)
	freeScript   = newScript(freeLua) // idempotent: no deadline (lua/free.lua)
)

var _ regional.ReservationStore = (*Store)(nil)

// slotKey is the Redis key of a key's concurrency slots: a sorted set of
// reservation ids scored by expiry, in the bucket's Cluster slot.
func (s *Store) slotKey(name string) string { return s.key(name) + ":slots" }

// Charge implements regional.ReservationStore: one script over every key
// on a single server, one per key on a Cluster (nothing is all-or-nothing
// here: every cost is charged).
func (s *Store) Charge(ctx context.Context, _ time.Time, ops []regional.TakeOp, res []regional.TakeResult) error {
	groups := [][]int{make([]int, len(ops))}
	for i := range ops {
		groups[0][i] = i
	}
	if s.cluster {
		groups = byKey(ops)
	}
	calls := make([]call, len(groups))
	for g, idx := range groups {
		c := &calls[g]
		c.script = &chargeScript
		for _, i := range idx {
			c.keys = append(c.keys, s.key(ops[i].Key))
			c.args = append(bucketArgs(&ops[i].Bucket, c.args), ops[i].Cost)
		}
	}
	if err := s.do(ctx, "charge", calls); err != nil {
		return err
	}
	for g, idx := range groups {
		v, err := ints(calls[g].reply, 0, 2*len(idx))
		if err != nil {
			return err
		}
		for j, i := range idx {
			res[i] = regional.TakeResult{Allowed: true, Remaining: float64(v[2*j]), ResetAfter: us(v[2*j+1])}
		}
	}
	return nil
}

// Acquire implements regional.ReservationStore. On a single server it is
// one script, all or nothing; on a Cluster each key is its own call, and
// when one rejects, the slots the others took are freed again (a
// concurrent request may see them taken for that moment: it may reject
// more, never admit more).
func (s *Store) Acquire(ctx context.Context, now time.Time, ops []regional.SlotOp, res []regional.SlotResult) error {
	groups := [][]int{make([]int, len(ops))}
	for i := range ops {
		groups[0][i] = i
	}
	if s.cluster && len(ops) > 1 {
		groups = make([][]int, len(ops))
		for i := range ops {
			groups[i] = []int{i}
		}
	}
	calls := make([]call, len(groups))
	for g, idx := range groups {
		c := &calls[g]
		c.script = &slotsScript
		for _, i := range idx {
			c.keys = append(c.keys, s.slotKey(ops[i].Key))
			c.args = append(c.args, ops[i].Cap, ops[i].Holder, max(ops[i].TTL.Milliseconds(), 1))
		}
	}
	err := s.do(ctx, "acquire", calls)
	admit := true
	for g, idx := range groups {
		if calls[g].err != nil {
			continue
		}
		v, perr := ints(calls[g].reply, 0, 3*len(idx))
		if perr != nil {
			calls[g].err, err = perr, perr
			continue
		}
		for j, i := range idx {
			res[i] = regional.SlotResult{Allowed: v[3*j] == 1, InFlight: v[3*j+1], RetryAfter: time.Duration(v[3*j+2]) * time.Millisecond}
			admit = admit && res[i].Allowed
		}
	}
	if len(groups) > 1 && (err != nil || !admit) {
		var back []regional.SlotOp
		for g, idx := range groups {
			if calls[g].err == nil && res[idx[0]].Allowed {
				back = append(back, ops[idx[0]])
			}
		}
		if len(back) > 0 {
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
			defer cancel()
			if ferr := s.Free(bctx, now, back); ferr != nil {
				s.log.Warn("regional store: freeing partly taken concurrency slots failed; they expire with their TTL", "err", ferr)
			}
		}
	}
	return err
}

// Free implements regional.ReservationStore: one call on a single
// server, one per key on a Cluster.
func (s *Store) Free(ctx context.Context, _ time.Time, ops []regional.SlotOp) error {
	if len(ops) == 0 {
		return nil
	}
	var calls []call
	if s.cluster {
		for _, op := range ops {
			calls = append(calls, call{script: &freeScript, keys: []string{s.slotKey(op.Key)}, args: []any{op.Holder}})
		}
	} else {
		c := call{script: &freeScript}
		for _, op := range ops {
			c.keys = append(c.keys, s.slotKey(op.Key))
			c.args = append(c.args, op.Holder)
		}
		calls = []call{c}
	}
	return s.do(ctx, "free", calls)
}
