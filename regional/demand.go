package regional

import "github.com/allot-dev/allot"

// Demand of hot keys.
//
// A key's traffic is counted on its own (a hotKey of its shard) from the
// first request that leaves it near its allowance here (rejected, or a
// tenth of its burst or less left) and then every request, in every
// report interval in full, for as long as it is near in the interval
// before or the region holds a share of its own for it. Before, a key was
// counted again in each interval only from the request that made it hot
// there, so a region with room for a key reported a part of its demand
// for it, or none, and the key's shares swung from report to report. A
// key the region holds a share of its own for is counted from the drain
// after the share came (Engine.Demand registers it), near its allowance
// or not.
//
// Cost: no byte per key of the table (the tally lives in the shard's hot
// map, at most maxHotPerShard entries of 48 bytes); on the decision path,
// a comparison (near) and a call for every counted request.

// tallyKey counts admitted and rejected cost of work w, whose descriptor
// is d, to its key if the key is tracked, or starts tracking it if near.
// The caller holds the shard's lock.
func (sh *shard) tallyKey(w *work, d allot.Descriptor, admitted, rejected float64, near bool) {
	h := sh.hot[w.key]
	if h == nil {
		if !near || len(sh.hot) >= maxHotPerShard {
			return
		}
		if sh.hot == nil {
			sh.hot = make(map[uint64]*hotKey)
		}
		h = &hotKey{shares: w.ls.shares, name: KeyString(w.ls.l, d)}
		sh.hot[w.key] = h
	}
	h.admitted += admitted
	h.rejected += rejected
	h.near = h.near || near
}

// drainHot calls emit with every tracked key's traffic since the previous
// drain and starts a new interval: a key that was near its allowance in
// this one, or that the region holds a share of its own for (own, this
// shard's), stays tracked; the others are dropped; the keys of own not
// tracked yet are from now on. The caller holds the shard's lock.
func (sh *shard) drainHot(emit func(h *hotKey), own []ownKey) {
	for _, o := range own {
		if h := sh.hot[o.key]; h != nil {
			h.own = true
		}
	}
	for k, h := range sh.hot {
		if h.admitted > 0 || h.rejected > 0 || h.near {
			emit(h)
		}
		if !h.near && !h.own {
			delete(sh.hot, k)
			continue
		}
		h.admitted, h.rejected, h.near, h.own = 0, 0, false, false
	}
	for _, o := range own {
		if sh.hot[o.key] == nil && len(sh.hot) < maxHotPerShard {
			if sh.hot == nil {
				sh.hot = make(map[uint64]*hotKey)
			}
			sh.hot[o.key] = &hotKey{shares: o.shares, name: o.name}
		}
	}
}

// ownKey is a key the region holds a share of its own for.
type ownKey struct {
	key    uint64
	shares *limitShares
	name   string
}

// ownKeys returns the keys the region holds a share of its own for, by
// shard.
func (e *Engine) ownKeys() *[numShards][]ownKey {
	var own [numShards][]ownKey
	for _, ds := range e.cfg.Load().list {
		for _, ls := range ds.limits {
			m := ls.shares.keys.Load()
			if m == nil {
				continue
			}
			for h, ks := range *m {
				if !ks.follow {
					own[shardOf(h)] = append(own[shardOf(h)], ownKey{h, ls.shares, ks.name})
				}
			}
		}
	}
	return &own
}
