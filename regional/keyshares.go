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
	ls, hs, err := e.keyShares(domain, limit, shares)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ls.setKeyShares(now.UnixNano(), e.guard.Load(), hs, shares, nil)
	return nil
}

// keyShares checks shares of hot keys of one limit and returns the limit
// and the keys' hashes.
func (e *Engine) keyShares(domain, limit string, shares []KeyShare) (*limitState, []uint64, error) {
	ls, err := e.limitFor(domain, limit, 0)
	if err != nil {
		return nil, nil, err
	}
	hs := make([]uint64, len(shares))
	for i, s := range shares {
		if _, err := e.limitFor(domain, limit, max(s.Share, 0)); err != nil {
			return nil, nil, err
		}
		if hs[i], err = e.keyOf(ls, s.Key); err != nil {
			return nil, nil, err
		}
	}
	return ls, hs, nil
}

// setKeyShares puts shares (of keys hs) in force from t under the window
// guard g; edit, if not nil, may change each new history before it is
// stored. The caller holds the engine's mu.
func (ls *limitState) setKeyShares(t, g int64, hs []uint64, shares []KeyShare, edit func(*shareHist) *shareHist) {
	if edit == nil {
		edit = func(h *shareHist) *shareHist { return h }
	}
	old := ls.shares.keys.Load()
	m := make(map[uint64]*keyShare, len(shares))
	if old != nil {
		maps.Copy(m, *old)
	}
	def := ls.shares.def.Load()
	for i, s := range shares {
		ks := m[hs[i]]
		switch {
		case s.Share < 0 && (ks == nil || ks.follow):
			continue // follows the default already
		case s.Share < 0: // retired: it follows the default from now
			m[hs[i]] = &keyShare{name: s.Key, hist: edit(ks.hist.with(t, def.current(), ls.windowPer(), g)), follow: true, until: t + ls.base.period}
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
		m[hs[i]] = &keyShare{name: s.Key, hist: edit(prev.with(t, s.Share, ls.windowPer(), g))}
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
}
