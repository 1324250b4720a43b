package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/allot-dev/allot/regional"
)

//go:embed lua/counts.lua
var countsLua string

var countsScript = newScript(countsLua)

var _ regional.CountStore = (*Store)(nil)

// MergeCounts implements regional.CountStore: the instances of a region
// share the counts of shared-mode keys in one hash per key and window,
// "<prefix>{domain/limit:key@window}", one field per instance and per
// peer region, each raised by a script and never lowered
// (lua/counts.lua). One script call per op, pipelined. The hash expires
// two periods after its window ends, on this process's clock.
func (s *Store) MergeCounts(ctx context.Context, instance string, ops []regional.CountOp, res []regional.RegionCount) error {
	now := time.Now()
	calls := make([]call, len(ops))
	for i := range ops {
		op := &ops[i]
		ttl := time.Second
		if p := op.Period.Milliseconds(); p > 0 {
			end := time.UnixMilli(int64(op.Window+3) * p)
			ttl = max(end.Sub(now), time.Second)
		}
		args := make([]any, 0, 3+2*len(op.Peers))
		args = append(args, instance, op.Value, ttl.Milliseconds())
		for _, p := range op.Peers {
			args = append(args, p.Region, p.Value)
		}
		calls[i] = call{script: &countsScript, keys: []string{s.key(regional.CountKey(op.Count))}, args: args}
	}
	if err := s.do(ctx, "counts", calls); err != nil {
		return err
	}
	for i := range calls {
		r := calls[i].reply
		if len(r) < 2 || len(r)%2 != 0 {
			return fmt.Errorf("%w: %d values", ErrBadReply, len(r))
		}
		v, err := ints(r, 0, 2)
		if err != nil {
			return err
		}
		rc := regional.RegionCount{Count: ops[i].Count, Region: uint64(v[1])}
		rc.Value = uint64(v[0])
		for j := 2; j < len(r); j += 2 {
			region, ok := r[j].(string)
			n, ok2 := r[j+1].(int64)
			if !ok || !ok2 {
				return fmt.Errorf("%w: peer field %T %T", ErrBadReply, r[j], r[j+1])
			}
			rc.Peers = append(rc.Peers, regional.PeerCount{Region: region, Value: uint64(n)})
		}
		res[i] = rc
	}
	return nil
}
