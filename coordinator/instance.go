package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/allot-dev/allot"
)

// Instance is one enforcer instance's side of the assignment protocol
// with a Fleet: it takes the instance's assignments and grants and says
// which shares to apply to the engine, in what order, and what to
// acknowledge.
//
//   - It starts holding nothing: every share it hands out is 0 until its
//     first full grant. (A restarted process is a new instance: it never
//     re-spends what an earlier process admitted in the current window,
//     because a raise from 0 counts from the next window; see
//     regional.Engine.)
//   - What it applies of a Weighted limit is its region's share × its
//     weight; other limits, the region's share.
//   - After its grant's Expires (on its own clock) it holds nothing until
//     granted again (Expire).
//   - After Reconnect it applies nothing but a full grant.
//   - An assignment without a grant comes from a coordinator that does not
//     know instances (a rolling upgrade): it is applied as a region's
//     whole share, without expiry.
//
// The zero value is not usable; call NewInstance. An Instance is not safe
// for concurrent use; the caller serialises access.
type Instance struct {
	dom      *allot.Domain
	id       string
	region   *Applier // the region's shares, as last assigned
	weighted map[string]bool
	weights  map[string]float64
	term     int64 // of the latest grant
	seq      uint64
	expires  time.Time
	held     bool // a grant is in force (or an assignment without grants)
	legacy   bool // the coordinator sends no grants
	upToDate bool // a full grant was applied since Reconnect
	applied  map[keyID]float64
	// reset, set by a full grant to an instance that held nothing: the
	// next diff gives every limit's default with Reset, in force since
	// since (the region's share) or the weight's grant, the later.
	reset bool
	since map[string]time.Time
}

// NewInstance returns the Instance id of region in domain d, holding
// nothing.
func NewInstance(d *allot.Domain, region, id string) (*Instance, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: an instance needs an id", ErrBadConfig)
	}
	x := &Instance{id: id, applied: map[keyID]float64{}, weights: map[string]float64{}}
	x.setDomain(d)
	app, err := NewApplier(d, region, Snapshot{})
	if err != nil {
		return nil, err
	}
	x.region = app
	return x, nil
}

func (x *Instance) setDomain(d *allot.Domain) {
	x.dom = d
	x.weighted = map[string]bool{}
	for _, l := range d.Limits {
		if Weighted(l) {
			x.weighted[l.Name] = true
		}
	}
}

// Reconfigure follows a new configuration of the domain: limits it adds
// are held at 0 until assigned; the others keep their shares. It returns
// the shares to apply.
func (x *Instance) Reconfigure(d *allot.Domain) ([]Share, error) {
	old := x.region
	app, err := NewApplier(d, old.region, Snapshot{Term: old.term, Version: old.version})
	if err != nil {
		return nil, err
	}
	for _, s := range old.All() {
		if _, ok := app.defaults[s.Limit]; ok {
			app.set(s)
		}
	}
	for _, l := range d.Limits {
		if _, ok := old.defaults[l.Name]; !ok {
			app.defaults[l.Name] = 0 // held at nothing until assigned
		}
	}
	x.region = app
	x.setDomain(d)
	return x.diff(), nil
}

// Shares returns what the engine must apply that Apply, Expire or
// Reconfigure have not returned yet: at first, every limit's default at 0.
func (x *Instance) Shares() []Share { return x.diff() }

// Reconnect says a new stream begins: until a full grant arrives, other
// assignments are refused.
func (x *Instance) Reconnect() { x.upToDate = false }

// Hello returns what the instance tells a coordinator when it connects:
// the latest assignment and grant it applied, and the weights it holds.
func (x *Instance) Hello() (Ack, []Weight) {
	ack := Ack{Domain: x.region.domain, Region: x.region.region, Term: x.term, Version: x.region.version, Instance: x.id, Seq: x.seq}
	if x.term != x.region.term {
		ack.Version = 0
	}
	var ws []Weight
	if x.held && !x.legacy {
		for _, l := range x.dom.Limits {
			if x.weighted[l.Name] {
				ws = append(ws, Weight{Limit: l.Name, Value: x.weights[l.Name]})
			}
		}
	}
	return ack, ws
}

// Held reports whether a grant is in force.
func (x *Instance) Held() bool { return x.held }

// Serving reports whether a grant is in force with a part of every
// Weighted limit: the instance admits traffic of each limit.
func (x *Instance) Serving() bool {
	if !x.held {
		return false
	}
	for l := range x.weighted {
		if x.weights[l] <= 0 {
			return false
		}
	}
	return true
}

// Expires returns the expiry of the grant in force (zero: none, or one
// that does not expire).
func (x *Instance) Expires() time.Time {
	if !x.held || x.legacy {
		return time.Time{}
	}
	return x.expires
}

// Apply takes an assignment at now and returns the shares to apply to the
// engine, lowerings first, and the ack to send once they are applied. Its
// two parts are taken apart: the region's shares if its version is later
// than the one applied (an assignment of Version 0 without shares carries
// a grant only), the grant if its Seq is later than the one applied. A
// repeated one changes nothing and is acknowledged again. Refused, with
// nothing applied: an assignment for another instance or region, of an
// older term, a later grant already expired on this clock, a bad share or
// weight, and anything but a full grant after Reconnect.
func (x *Instance) Apply(now time.Time, m Assignment) ([]Share, Ack, error) {
	if m.Grant == nil {
		if m.Instance != "" {
			return nil, Ack{}, fmt.Errorf("%w: an assignment for instance %q without a grant", ErrBadValue, m.Instance)
		}
		_, ack, err := x.region.Apply(m)
		if err != nil {
			return nil, Ack{}, err
		}
		x.legacy, x.held, x.upToDate = true, true, true
		for l := range x.weighted {
			x.weights[l] = 1
		}
		ack.Instance = x.id
		return x.diff(), ack, nil
	}
	g := m.Grant
	newGrant := m.Term > x.term || g.Seq > x.seq
	switch {
	case m.Instance != x.id:
		return nil, Ack{}, fmt.Errorf("%w: an assignment for instance %q, this is %q", ErrBadValue, m.Instance, x.id)
	case m.Domain != x.region.domain:
		return nil, Ack{}, fmt.Errorf("%w %q", ErrUnknownDomain, m.Domain)
	case m.Region != x.region.region:
		return nil, Ack{}, fmt.Errorf("%w %q, this is %s", ErrUnknownRegion, m.Region, x.region.region)
	case m.Term < x.term:
		return nil, Ack{}, fmt.Errorf("%w: grant of term %d, applied term %d", ErrStale, m.Term, x.term)
	case !g.Full && !x.upToDate:
		return nil, Ack{}, fmt.Errorf("%w: a grant that is not full before the first full grant of a stream", ErrStale)
	case g.Full && (m.Term < x.region.term || m.Term == x.region.term && m.Version < x.region.version):
		return nil, Ack{}, fmt.Errorf("%w: a full grant of version %d, applied %d", ErrStale, m.Version, x.region.version)
	case newGrant && !now.Before(g.Expires):
		return nil, Ack{}, fmt.Errorf("%w: a grant that expired at %v (now %v)", ErrStale, g.Expires, now)
	}
	weights := map[string]float64{}
	for _, w := range g.Weights {
		if !x.weighted[w.Limit] || !(w.Value >= 0 && w.Value <= 1) {
			return nil, Ack{}, fmt.Errorf("%w: weight %v of %q", ErrBadValue, w.Value, w.Limit)
		}
		weights[w.Limit] = w.Value
	}
	if g.Full && !x.held {
		// An instance that held nothing learns from when each share was in
		// force: the region's since then, its weight since now (or since
		// always, from allowance no instance held before).
		x.reset, x.since = true, map[string]time.Time{}
		for _, s := range m.Shares {
			if s.Key == "" {
				x.since[s.Limit] = s.Since
			}
		}
		for l := range x.weighted {
			if !g.Fresh && x.since[l].Before(now) {
				x.since[l] = now
			}
		}
	}
	switch {
	case g.Full:
		app, err := NewApplier(x.dom, x.region.region, Snapshot{})
		if err != nil {
			return nil, Ack{}, err
		}
		for _, s := range m.Shares {
			if _, ok := app.defaults[s.Limit]; !ok {
				return nil, Ack{}, fmt.Errorf("%w %q", ErrUnknownLimit, s.Limit)
			}
			if !validShare(s.Value, s.Key) {
				return nil, Ack{}, fmt.Errorf("%w: share %v of %s %q", ErrBadValue, s.Value, s.Limit, s.Key)
			}
			app.set(s)
		}
		app.term, app.version = m.Term, m.Version
		x.region = app
	case m.Version == 0 && len(m.Shares) == 0: // a grant only
	default:
		_, _, err := x.region.Apply(Assignment{Domain: m.Domain, Region: m.Region, Term: m.Term, Version: m.Version, Shares: m.Shares})
		if err != nil && !errors.Is(err, ErrStale) { // a late one: its grant may still be new
			return nil, Ack{}, err
		}
	}
	if newGrant || g.Full {
		x.weights, x.term, x.seq, x.expires = weights, m.Term, g.Seq, g.Expires
		x.held, x.legacy = true, false
	}
	x.upToDate = x.upToDate || g.Full
	ack, _ := x.Hello()
	return x.diff(), ack, nil
}

// Leave drops every share to nothing for good (a graceful stop) and
// returns the shares to apply and the ack that tells the coordinator so.
func (x *Instance) Leave() ([]Share, Ack) {
	x.held, x.legacy = false, false
	ack, _ := x.Hello()
	ack.Leaving = true
	return x.diff(), ack
}

// Expire drops every share to nothing once the grant in force has expired
// at now, and returns the shares to apply.
func (x *Instance) Expire(now time.Time) []Share {
	if !x.held || x.legacy || now.Before(x.expires) {
		return nil
	}
	x.held = false
	return x.diff()
}

// level is what the engine applies for the default (key "") or a hot key
// with a share of its own, by the state now.
func (x *Instance) level(limit string, own float64, hasOwn bool) float64 {
	if !x.held {
		return 0
	}
	s := x.region.defaults[limit]
	if hasOwn {
		s = own
	}
	if x.weighted[limit] {
		s *= x.weights[limit]
	}
	return s
}

// diff returns the shares that changed since the previous diff, the ones
// that lower what the instance applies first.
func (x *Instance) diff() []Share {
	next := map[keyID]float64{}
	for l := range x.region.defaults {
		next[keyID{limit: l}] = x.level(l, 0, false)
	}
	for id, v := range x.region.keys {
		if x.held {
			next[id] = x.level(id.limit, v, true)
		}
	}
	levelOf := func(m map[keyID]float64, id keyID) float64 {
		if v, ok := m[id]; ok {
			return v
		}
		return m[keyID{limit: id.limit}]
	}
	var lower, raise []Share
	if x.reset {
		x.reset = false
		for _, l := range x.dom.Limits {
			id := keyID{limit: l.Name}
			s := Share{Limit: l.Name, Value: next[id], Reset: true, Since: x.since[l.Name]}
			if next[id] < levelOf(x.applied, id) {
				lower = append(lower, s)
			} else {
				raise = append(raise, s)
			}
			x.applied[id] = next[id]
		}
	}
	ids := make([]keyID, 0, len(next)+len(x.applied))
	for id := range next {
		ids = append(ids, id)
	}
	for id := range x.applied {
		if _, ok := next[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b keyID) int { return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key)) })
	for _, id := range ids {
		nv, has := next[id]
		ov, had := x.applied[id]
		if has == had && nv == ov {
			continue
		}
		s := Share{Limit: id.limit, Key: id.key, Value: nv}
		if !has {
			s.Value = Follow
		}
		if levelOf(next, id) < levelOf(x.applied, id) {
			lower = append(lower, s)
		} else {
			raise = append(raise, s)
		}
	}
	x.applied = next
	return append(lower, raise...)
}
