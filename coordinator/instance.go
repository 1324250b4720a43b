package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
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
//     weight for the limit, for the limit's default vector and its keys
//     (a hot key's share for a hot key), except for a key its grant gives
//     a weight of its own (share × that weight) or a rest factor (share ×
//     its weight for the limit × the factor). Other limits: the region's
//     share.
//   - After its grant's Expires (on its own clock) it holds nothing until
//     granted again (Expire).
//   - After Reconnect it applies nothing but a full grant.
//   - An assignment without a grant comes from a coordinator that does not
//     know instances (a rolling upgrade): it is applied as a region's
//     whole share, without expiry.
//
// What it computes for an assignment is proportional to what the
// assignment changes: the shares and weights it carries, and the keys
// whose level they change.
//
// The zero value is not usable; call NewInstance. An Instance is not safe
// for concurrent use; the caller serialises access.
type Instance struct {
	dom      *allot.Domain
	id       string
	region   *Applier // the region's shares, as last assigned
	weighted map[string]bool
	weights  map[string]float64 // by Weighted limit: its weight for the limit
	own      map[keyID]float64  // its weights of its own, by hot key
	rest     map[keyID]float64  // the hot keys' rest factors below 1
	term     int64              // of the latest grant
	seq      uint64
	expires  time.Time
	held     bool // a grant is in force (or an assignment without grants)
	legacy   bool // the coordinator sends no grants
	left     bool // Leave: a graceful stop, for good (Hello says so)
	upToDate bool // a full grant was applied since Reconnect
	behind   bool // Reconfigure added a limit since the latest full grant
	applied  map[keyID]float64
	// dirty are the limits' defaults (key "") and keys whose level may
	// have changed since the previous diff; dirtyLimits, the limits all of
	// whose hot keys' and rest factors' levels may have (their weight
	// changed); all: every level.
	dirty       map[keyID]struct{}
	dirtyLimits map[string]bool
	all         bool
	// reset, set by a full grant to an instance that held nothing: the
	// next diff gives every limit's default with Reset, in force since
	// since (the region's share) or the weight's grant, the later.
	reset bool
	since map[string]time.Time
	// extras are those of the latest new grant, until TakeExtras; pooled,
	// the limits whose releases its coordinator pools (Grant.Pooled).
	extras             []Moved
	pooled, pooledKeys []string
	// early is the latest grant refused for coming before the first full
	// grant of its stream (the coordinator sent it after that one), until
	// TakeEarly.
	early *Assignment
}

// NewInstance returns the Instance id of region in domain d, holding
// nothing.
func NewInstance(d *allot.Domain, region, id string) (*Instance, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: an instance needs an id", ErrBadConfig)
	}
	x := &Instance{id: id, applied: map[keyID]float64{}, weights: map[string]float64{}, own: map[keyID]float64{},
		rest: map[keyID]float64{}, dirty: map[keyID]struct{}{}, dirtyLimits: map[string]bool{}, all: true}
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
	maps.DeleteFunc(x.own, func(id keyID, _ float64) bool { return !x.weighted[id.limit] })
	maps.DeleteFunc(x.rest, func(id keyID, _ float64) bool { return !x.weighted[id.limit] })
}

// Reconfigure follows a new configuration of the domain: limits it adds
// are held at 0 until assigned, and the instance is Behind until a full
// grant brings their shares (the coordinator, whose configuration may
// have had them first, sends them only when they change otherwise); the
// others keep their shares. It returns the shares to apply.
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
			x.behind = true
		}
	}
	x.region = app
	x.setDomain(d)
	x.all = true
	return x.diff(), nil
}

// Shares returns what the engine must apply that Apply, Expire or
// Reconfigure have not returned yet: at first, every limit's default at 0.
func (x *Instance) Shares() []Share { return x.diff() }

// Behind reports that Reconfigure added a limit since the latest full
// grant: a new stream (Reconnect, Hello) brings its shares.
func (x *Instance) Behind() bool { return x.behind }

// Reconnect says a new stream begins: until a full grant arrives, other
// assignments are refused.
func (x *Instance) Reconnect() { x.upToDate, x.early = false, nil }

// TakeEarly returns, once, the grant that Apply refused for coming before
// the full grant it has since applied, if it came after that one: the
// caller applies it next (a stream that does not keep its messages in
// order need not lose a lowering that followed a full grant closely).
func (x *Instance) TakeEarly() *Assignment {
	e := x.early
	if e == nil || !x.upToDate {
		return nil
	}
	x.early = nil
	if e.Term != x.term || e.Grant.Seq <= x.seq {
		return nil
	}
	return e
}

// Hello returns what the instance tells a coordinator when it connects:
// the latest assignment and grant it applied, and the weights it holds:
// KeyAware, then for the limits, its own for hot keys, and the rest
// factors it applies.
func (x *Instance) Hello() (Ack, []Weight) {
	ws := []Weight{KeyAware}
	if x.held && !x.legacy {
		for _, l := range x.dom.Limits {
			if x.weighted[l.Name] {
				ws = append(ws, Weight{Limit: l.Name, Value: x.weights[l.Name]})
			}
		}
		start := len(ws)
		for id, v := range x.own {
			ws = append(ws, Weight{Limit: id.limit, Key: id.key, Value: v})
		}
		for id, v := range x.rest {
			ws = append(ws, Weight{Limit: id.limit, Key: id.key, Value: v, Rest: true})
		}
		slices.SortFunc(ws[start:], func(a, b Weight) int {
			rest := func(w Weight) int {
				if w.Rest {
					return 1
				}
				return 0
			}
			return cmp.Or(cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Key, b.Key), cmp.Compare(rest(a), rest(b)))
		})
	}
	ack := x.ack()
	ack.Leaving = x.left // a new leader frees at once what it held
	return ack, ws
}

// ack is the ack of the latest assignment and grant applied.
func (x *Instance) ack() Ack {
	ack := Ack{Domain: x.region.domain, Region: x.region.region, Term: x.term, Version: x.region.version, Instance: x.id, Seq: x.seq}
	if x.term != x.region.term {
		ack.Version = 0
	}
	return ack
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
// weight, anything but a full grant after Reconnect, and anything after
// Leave (the coordinator was told it holds nothing: an assignment sent
// before that arrived must not make it hold again).
func (x *Instance) Apply(now time.Time, m Assignment) ([]Share, Ack, error) {
	if x.left {
		return nil, Ack{}, fmt.Errorf("%w: instance %q left", ErrStale, x.id)
	}
	if m.Grant == nil {
		if m.Instance != "" {
			return nil, Ack{}, fmt.Errorf("%w: an assignment for instance %q without a grant", ErrBadValue, m.Instance)
		}
		changed, ack, err := x.region.Apply(m)
		if err != nil {
			return nil, Ack{}, err
		}
		if !x.legacy || !x.held {
			x.all = true // every weight becomes 1
			clear(x.own)
			clear(x.rest)
		}
		x.legacy, x.held, x.upToDate = true, true, true
		x.pooled, x.pooledKeys = nil, nil
		for l := range x.weighted {
			x.weights[l] = 1
		}
		x.regionChanged(changed)
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
		if x.early == nil || m.Term > x.early.Term || m.Term == x.early.Term && g.Seq > x.early.Grant.Seq {
			x.early = &m
		}
		return nil, Ack{}, fmt.Errorf("%w: a grant that is not full before the first full grant of a stream", ErrStale)
	case g.Full && (m.Term < x.region.term || m.Term == x.region.term && m.Version < x.region.version):
		return nil, Ack{}, fmt.Errorf("%w: a full grant of version %d, applied %d", ErrStale, m.Version, x.region.version)
	case newGrant && !now.Before(g.Expires):
		return nil, Ack{}, fmt.Errorf("%w: a grant that expired at %v (now %v)", ErrStale, g.Expires, now)
	}
	weights, own, rest := map[string]float64{}, map[keyID]float64{}, map[keyID]float64{}
	for _, w := range g.Weights {
		if _, ok := x.region.defaults[w.Limit]; !ok && w.Value >= 0 && w.Value <= 1 {
			continue // a limit of a newer configuration: not enforced here
		}
		if !x.weighted[w.Limit] || !(w.Value >= 0 && w.Value <= 1) || w.Rest && w.Key == "" {
			return nil, Ack{}, fmt.Errorf("%w: weight %v of %q %q", ErrBadValue, w.Value, w.Limit, w.Key)
		}
		switch id := (keyID{w.Limit, w.Key}); {
		case w.Key == "":
			weights[w.Limit] = w.Value
		case w.Rest:
			rest[id] = w.Value
		default:
			own[id] = w.Value
		}
	}
	var extras []Moved
	for _, e := range g.Extras {
		switch {
		case !(e.Value >= 0 && e.Value <= 1):
			return nil, Ack{}, fmt.Errorf("%w: extra %v of %q", ErrBadValue, e.Value, e.Limit)
		case x.weighted[e.Limit] && newGrant && e.Value > 0 && !e.Window.IsZero():
			extras = append(extras, e)
		}
	}
	switch {
	case g.Full:
		app, err := NewApplier(x.dom, x.region.region, Snapshot{})
		if err != nil {
			return nil, Ack{}, err
		}
		for _, s := range m.Shares {
			if !validShare(s.Value, s.Key) {
				return nil, Ack{}, fmt.Errorf("%w: share %v of %s %q", ErrBadValue, s.Value, s.Limit, s.Key)
			}
		}
		for _, s := range app.known(m.Shares) {
			app.set(s)
		}
		app.term, app.version = m.Term, m.Version
		x.region = app
		x.all = true
	case m.Version == 0 && len(m.Shares) == 0: // a grant only
	default:
		changed, _, err := x.region.Apply(Assignment{Domain: m.Domain, Region: m.Region, Term: m.Term, Version: m.Version, Shares: m.Shares})
		if err != nil && !errors.Is(err, ErrStale) { // a late one: its grant may still be new
			return nil, Ack{}, err
		}
		x.regionChanged(changed)
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
	if newGrant || g.Full {
		x.setWeights(weights, own)
		x.setRest(rest, g.Full)
		if !x.held || x.legacy {
			x.all = true
		}
		x.term, x.seq, x.expires = m.Term, g.Seq, g.Expires
		x.held, x.legacy = true, false
		x.extras, x.pooled, x.pooledKeys = extras, g.Pooled, g.PooledKeys
	}
	x.upToDate = x.upToDate || g.Full
	x.behind = x.behind && !g.Full
	return x.diff(), x.ack(), nil
}

// TakeExtras returns the extras of the latest new grant applied, once:
// what the instance may add to the current window for what it wanted
// (Engine.AddExtra), after it has applied the grant's shares.
func (x *Instance) TakeExtras() []Moved {
	e := x.extras
	x.extras = nil
	return e
}

// Pooled reports whether the coordinator pools what a lowering of limit's
// default share (keys false) or of its hot keys' own shares releases
// (Grant.Pooled, PooledKeys): the instance then moves those shares
// (Engine.MoveShare, MoveKeyShares) and acks the releases.
func (x *Instance) Pooled(limit string, keys bool) bool {
	if keys {
		return x.weighted[limit] && slices.Contains(x.pooledKeys, limit)
	}
	return x.weighted[limit] && slices.Contains(x.pooled, limit)
}

// regionChanged marks what the region's changed shares need recomputing:
// a limit's default share sets the level of its default and of the keys
// with a weight or rest factor of their own that follow it; a key's
// share, that key's.
func (x *Instance) regionChanged(changed []Share) {
	for _, s := range changed {
		if s.Key == "" {
			x.defaultChanged(s.Limit)
		} else {
			x.touch(keyID{s.Limit, s.Key})
		}
	}
}

// setWeights takes the weights of a new grant, marking what they change.
func (x *Instance) setWeights(weights map[string]float64, own map[keyID]float64) {
	for l := range x.weighted {
		if weights[l] != x.weights[l] {
			x.weightChanged(l)
		}
	}
	for id, v := range x.own {
		if w, ok := own[id]; !ok || w != v {
			x.touch(id)
		}
	}
	for id := range own {
		if _, ok := x.own[id]; !ok {
			x.touch(id)
		}
	}
	x.weights, x.own = weights, own
}

// setRest takes the rest factors of a new grant: all of them (full), or
// those that changed (1: back to the default), marking what they change.
func (x *Instance) setRest(rest map[keyID]float64, full bool) {
	if full {
		for id := range x.rest {
			if _, ok := rest[id]; !ok {
				delete(x.rest, id)
				x.touch(id)
			}
		}
	}
	for id, v := range rest {
		if old, ok := x.rest[id]; !ok && v < 1 || ok && old != v {
			x.touch(id)
		}
		if v < 1 {
			x.rest[id] = v
		} else {
			delete(x.rest, id)
		}
	}
}

func (x *Instance) touch(id keyID) {
	if !x.all {
		x.dirty[id] = struct{}{}
	}
}

// defaultChanged marks the levels that limit l's default share sets: its
// default's and those of its keys with a weight or rest factor of their
// own that follow it.
func (x *Instance) defaultChanged(l string) {
	if x.all {
		return
	}
	x.touch(keyID{limit: l})
	for _, m := range []map[keyID]float64{x.own, x.rest} {
		for id := range m {
			if _, regionOwn := x.region.keys[id]; id.limit == l && !regionOwn {
				x.touch(id)
			}
		}
	}
}

// weightChanged marks the levels that the weight for limit l sets: its
// default's, its hot keys' and those with a rest factor.
func (x *Instance) weightChanged(l string) {
	if x.all {
		return
	}
	x.touch(keyID{limit: l})
	x.dirtyLimits[l] = true
}

// Leave drops every share to nothing for good (a graceful stop) and
// returns the shares to apply and the ack that tells the coordinator so.
func (x *Instance) Leave() ([]Share, Ack) {
	x.held, x.legacy, x.all, x.left = false, false, true, true
	ack := x.ack()
	ack.Leaving = true
	return x.diff(), ack
}

// Expire drops every share to nothing once the grant in force has expired
// at now, and returns the shares to apply.
func (x *Instance) Expire(now time.Time) []Share {
	if !x.held || x.legacy || now.Before(x.expires) {
		return nil
	}
	x.held, x.all = false, true
	return x.diff()
}

// level is what the engine applies for the default (key "") or a key of
// a limit by the state now, and whether the key has a share of its own in
// the engine (false: it follows the limit's default there).
func (x *Instance) level(id keyID) (float64, bool) {
	if id.key == "" {
		if !x.held {
			return 0, true
		}
		s := x.region.defaults[id.limit]
		if x.weighted[id.limit] {
			s *= x.weights[id.limit]
		}
		return s, true
	}
	if !x.held {
		return 0, false
	}
	s, regionOwn := x.region.keys[id]
	if !x.weighted[id.limit] || x.legacy { // undivided, or all of it (weight 1)
		return s, regionOwn
	}
	if !regionOwn {
		s = x.region.defaults[id.limit]
	}
	w := x.weights[id.limit]
	if own, ok := x.own[id]; ok {
		w = own
	} else if r, ok := x.rest[id]; ok {
		w *= r
	} else if !regionOwn {
		return 0, false // it follows the limit's default
	}
	return s * w, true
}

// diff returns the shares that changed since the previous diff, the ones
// that lower what the instance applies first. It recomputes only the
// levels marked dirty (all of them after a full grant, a change of held,
// or a reconfiguration).
func (x *Instance) diff() []Share {
	var ids []keyID
	if x.all {
		seen := map[keyID]bool{}
		add := func(id keyID) {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
		for l := range x.region.defaults {
			add(keyID{limit: l})
		}
		for id := range x.region.keys {
			add(id)
		}
		for id := range x.own {
			add(id)
		}
		for id := range x.rest {
			add(id)
		}
		for id := range x.applied {
			add(id)
		}
	} else {
		ids = slices.AppendSeq(make([]keyID, 0, len(x.dirty)), maps.Keys(x.dirty))
		if len(x.dirtyLimits) > 0 {
			for id := range x.region.keys {
				if _, ok := x.dirty[id]; !ok && x.dirtyLimits[id.limit] {
					ids = append(ids, id)
				}
			}
			for id := range x.rest {
				_, ok := x.dirty[id]
				_, inRegion := x.region.keys[id] // added above
				if !ok && !inRegion && x.dirtyLimits[id.limit] {
					ids = append(ids, id)
				}
			}
		}
	}
	if len(x.dirty) > 1024 {
		x.dirty = map[keyID]struct{}{} // do not keep a map the size of every hot key
	} else {
		clear(x.dirty)
	}
	clear(x.dirtyLimits)
	x.all = false
	slices.SortFunc(ids, func(a, b keyID) int { return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key)) })
	next := make([]float64, len(ids))
	has := make([]bool, len(ids))
	for i, id := range ids {
		next[i], has[i] = x.level(id)
	}
	defaultOf := func(limit string, applied bool) float64 {
		if !applied {
			if i, ok := slices.BinarySearchFunc(ids, keyID{limit: limit}, func(a, b keyID) int {
				return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key))
			}); ok {
				return next[i]
			}
		}
		return x.applied[keyID{limit: limit}]
	}
	nextLevel := func(i int) float64 {
		if has[i] {
			return next[i]
		}
		return defaultOf(ids[i].limit, false)
	}
	appliedLevel := func(id keyID) float64 {
		if v, ok := x.applied[id]; ok {
			return v
		}
		return defaultOf(id.limit, true)
	}
	var lower, raise []Share
	if x.reset {
		x.reset = false
		for _, l := range x.dom.Limits {
			id := keyID{limit: l.Name}
			i, ok := slices.BinarySearchFunc(ids, id, func(a, b keyID) int {
				return cmp.Or(cmp.Compare(a.limit, b.limit), cmp.Compare(a.key, b.key))
			})
			if !ok {
				continue
			}
			s := Share{Limit: l.Name, Value: next[i], Reset: true, Since: x.since[l.Name]}
			if next[i] < appliedLevel(id) {
				lower = append(lower, s)
			} else {
				raise = append(raise, s)
			}
			x.applied[id] = next[i]
		}
	}
	for i, id := range ids {
		ov, had := x.applied[id]
		if has[i] == had && next[i] == ov {
			continue
		}
		s := Share{Limit: id.limit, Key: id.key, Value: next[i]}
		if !has[i] {
			s.Value = Follow
		}
		if nextLevel(i) < appliedLevel(id) {
			lower = append(lower, s)
		} else {
			raise = append(raise, s)
		}
	}
	for i, id := range ids {
		if has[i] {
			x.applied[id] = next[i]
		} else {
			delete(x.applied, id)
		}
	}
	return append(lower, raise...)
}
