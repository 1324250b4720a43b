package coordinator

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/allot-dev/allot"
)

// Applier is a region's side of the assignment protocol: it takes the
// coordinator's assignments and says which shares to apply to the engine,
// in what order, and what to acknowledge. It applies an assignment only if
// it is later (by term, then version) than every one it applied, so a
// late or repeated assignment can never bring back a share the
// coordinator has since counted as given up.
//
// The zero value is not usable; call NewApplier. An Applier is not safe
// for concurrent use; the caller serialises access.
type Applier struct {
	domain   string
	region   string
	term     int64
	version  uint64
	defaults map[string]float64 // by limit
	order    []string           // the limits, in configuration order
	keys     map[keyID]float64  // hot keys' own shares
	keyed    map[string]int     // len(keys) by limit
}

type keyID struct{ limit, key string }

// NewApplier returns the Applier of region in domain d. It starts from
// snap, what the coordinator persisted, and from InitialShares for limits
// without a record; it then ignores every assignment not later than
// snap's Term and Version. A region that restarts must start from the
// latest snapshot, never from InitialShares alone, which would take back
// share the coordinator gave to other regions.
func NewApplier(d *allot.Domain, region string, snap Snapshot) (*Applier, error) {
	i := slices.Index(d.Regions, region)
	if i < 0 {
		return nil, fmt.Errorf("%w: region %q is not a region of domain %q", ErrBadConfig, region, d.Name)
	}
	a := &Applier{domain: d.Name, region: region, term: snap.Term, version: snap.Version,
		defaults: make(map[string]float64, len(d.Limits)), keys: map[keyID]float64{}, keyed: map[string]int{}}
	for _, l := range d.Limits {
		a.defaults[l.Name] = InitialShares(l.Floors, d.Regions)[i]
		a.order = append(a.order, l.Name)
	}
	for _, rec := range snap.Records {
		if _, ok := a.defaults[rec.Limit]; !ok || rec.Cells == nil {
			continue
		}
		s := Share{Limit: rec.Limit, Key: rec.Key} // a region the record lacks holds nothing
		if rec.Key != "" {
			s.Value = Follow
		}
		for _, c := range rec.Cells {
			if c.Region == region {
				s.Value = c.Share
			}
		}
		if !validShare(s.Value, s.Key) {
			return nil, fmt.Errorf("%w: record of %s %q: share %v", ErrBadConfig, rec.Limit, rec.Key, s.Value)
		}
		a.set(s)
	}
	return a, nil
}

// Apply takes an assignment and returns the shares to apply to the
// engine, in order, and the ack to send once they are applied. Shares
// that lower what the region may use come first, so the region never uses
// more than the old and the new assignment allow. A repeated assignment
// changes nothing and is acknowledged again. A share of a limit the
// region's configuration lacks is skipped: the coordinator's configuration
// is newer, and a limit the region does not know it does not enforce (see
// Instance.Reconfigure). An assignment older than the latest applied
// returns ErrStale; one with a bad share, ErrBadValue; nothing is applied
// then.
func (a *Applier) Apply(m Assignment) ([]Share, Ack, error) {
	switch {
	case m.Domain != a.domain:
		return nil, Ack{}, fmt.Errorf("%w %q", ErrUnknownDomain, m.Domain)
	case m.Region != a.region:
		return nil, Ack{}, fmt.Errorf("%w %q, this is %s", ErrUnknownRegion, m.Region, a.region)
	case m.Term < a.term || m.Term == a.term && m.Version < a.version:
		return nil, Ack{}, fmt.Errorf("%w: assignment of term %d version %d, applied term %d version %d",
			ErrStale, m.Term, m.Version, a.term, a.version)
	}
	ack := Ack{Domain: a.domain, Region: a.region, Term: m.Term, Version: m.Version}
	if m.Term == a.term && m.Version == a.version {
		return nil, ack, nil
	}
	for _, s := range m.Shares {
		if !validShare(s.Value, s.Key) {
			return nil, Ack{}, fmt.Errorf("%w: share %v of %s %q", ErrBadValue, s.Value, s.Limit, s.Key)
		}
	}
	shares := a.known(m.Shares)
	before := make([]float64, len(shares))
	changed := make([]bool, len(shares))
	for i, s := range shares {
		before[i] = a.Share(s.Limit, s.Key)
	}
	for i, s := range shares {
		changed[i] = a.set(s)
	}
	var lower, raise []Share
	for i, s := range shares {
		switch {
		case !changed[i]:
		case a.Share(s.Limit, s.Key) < before[i]:
			lower = append(lower, s)
		default:
			raise = append(raise, s)
		}
	}
	a.term, a.version = m.Term, m.Version
	return append(lower, raise...), ack, nil
}

// known returns the shares of limits the region's configuration has.
func (a *Applier) known(shares []Share) []Share {
	for i, s := range shares {
		if _, ok := a.defaults[s.Limit]; !ok {
			out := slices.Clone(shares[:i])
			for _, s := range shares[i+1:] {
				if _, ok := a.defaults[s.Limit]; ok {
					out = append(out, s)
				}
			}
			return out
		}
	}
	return shares
}

// set records s and reports whether it changed what is stored.
func (a *Applier) set(s Share) bool {
	if s.Key == "" {
		old := a.defaults[s.Limit]
		a.defaults[s.Limit] = s.Value
		return old != s.Value
	}
	id := keyID{s.Limit, s.Key}
	old, had := a.keys[id]
	if s.Value == Follow {
		if had {
			delete(a.keys, id)
			a.keyed[s.Limit]--
		}
		return had
	}
	if !had {
		a.keyed[s.Limit]++
	}
	a.keys[id] = s.Value
	return !had || old != s.Value
}

// Share returns the share the region applies for a key of a limit (key
// empty: the limit's default): the key's own, or the limit's default.
func (a *Applier) Share(limit, key string) float64 {
	if v, ok := a.keys[keyID{limit, key}]; ok {
		return v
	}
	return a.defaults[limit]
}

// All returns every share the region applies: each limit's default, in
// configuration order, then the hot keys with shares of their own, sorted.
func (a *Applier) All() []Share {
	out := make([]Share, 0, len(a.defaults)+len(a.keys))
	for _, l := range a.order {
		out = append(out, Share{Limit: l, Value: a.defaults[l]})
	}
	ids := make([]keyID, 0, len(a.keys))
	for id := range a.keys {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(x, y keyID) int { return cmp.Or(cmp.Compare(x.limit, y.limit), cmp.Compare(x.key, y.key)) })
	for _, id := range ids {
		out = append(out, Share{Limit: id.limit, Key: id.key, Value: a.keys[id]})
	}
	return out
}

// Applied returns the term and version of the latest assignment applied
// (or of the snapshot the Applier started from): what a region tells the
// coordinator when it reconnects.
func (a *Applier) Applied() (term int64, version uint64) { return a.term, a.version }
