package regional

import (
	"maps"
	"time"
)

// KeyShare is one hot key's share, for SetKeyShares.
type KeyShare struct {
	Key   string  // as KeyString names it
	Share float64 // in [0, 1]; negative: follow the limit's default again
}

// SetKeyShares sets the shares of several hot keys of one limit from now
// on, as SetKeyShare does for each in turn, but copies the limit's key
// shares once rather than once per key: applying an assignment of K hot
// keys costs O(K) instead of O(K²). Nothing is set when an error is
// returned.
func (e *Engine) SetKeyShares(now time.Time, domain, limit string, shares []KeyShare) error {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return err
	}
	hs := make([]uint64, len(shares))
	for i, s := range shares {
		if _, err := e.limitFor(domain, limit, max(s.Share, 0)); err != nil {
			return err
		}
		if hs[i], err = e.keyOf(ls, s.Key); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := ls.shares.keys.Load()
	m := make(map[uint64]*keyShare, len(shares))
	if old != nil {
		maps.Copy(m, *old)
	}
	t, g := now.UnixNano(), e.guard.Load()
	def := ls.shares.def.Load()
	for i, s := range shares {
		ks := m[hs[i]]
		switch {
		case s.Share < 0 && (ks == nil || ks.follow):
			continue // follows the default already
		case s.Share < 0: // retired: it follows the default from now
			m[hs[i]] = &keyShare{name: s.Key, hist: ks.hist.with(t, def.current(), ls.windowPer(), g), follow: true, until: t + ls.base.period}
			ls.shares.following++
			continue
		}
		prev := def
		if ks != nil {
			prev = ks.hist
			if ks.follow {
				ls.shares.following--
			}
		}
		m[hs[i]] = &keyShare{name: s.Key, hist: prev.with(t, s.Share, ls.windowPer(), g)}
	}
	if ls.shares.following > 0 { // m is this call's own copy: drop the ones retired long enough
		for h, ks := range m {
			if ks.follow && ks.until <= t {
				delete(m, h)
				ls.shares.following--
			}
		}
	}
	ls.shares.keys.Store(&m)
	return nil
}
