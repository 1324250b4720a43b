package crdt

import (
	"cmp"
	"errors"
	"iter"
	"slices"
)

// DefaultRetention is the number of windows a [Store] keeps when
// [NewStore] is given none: the current window and the previous one, which
// a sliding-window estimate needs.
const DefaultRetention = 2

// ErrOldWindow is returned by [Store.Inc] and [Store.Apply] for a window
// older than the store's retention horizon; the call changed nothing.
var ErrOldWindow = errors.New("crdt: window older than retention horizon")

// Delta says that slot Origin of key Key in window Window has value Value,
// and that this is the Seq-th delta origin has emitted. Value is absolute,
// not an increment, so applying a delta twice, late or out of order is
// harmless. The zero Delta is a no-op when applied.
type Delta struct {
	Key    string
	Window uint64
	Origin string
	Seq    uint64
	Value  uint64
}

// Store holds one [GCounter] per (key, window) for the last few windows,
// where a window id is floor(unix_ms / window_ms), computed by the caller.
// It belongs to one region: [Store.Inc] counts in that region's slot, and
// [Store.DeltasSince] and [Store.FullState] report that slot, numbering the
// deltas in one sequence per store. Slots of other regions arrive through
// [Store.Apply].
//
// The newest window seen by Inc, Apply or Advance sets the retention
// horizon: with retention R, windows newest−R+1 … newest are kept, older
// ones are dropped and later changes to them are refused with
// [ErrOldWindow]. A delta from a window far in the future would therefore
// drop everything; callers discard deltas from windows too far ahead of
// their own clock.
//
// Create a Store with [NewStore]; the zero Store is not usable. A Store is
// not safe for concurrent use; the caller serialises access.
type Store struct {
	region    string
	retention uint64
	newest    uint64    // newest window seen
	windows   []*window // retained windows with data, oldest first
	version   uint64    // bumped on every change of a local slot
	seq       uint64    // Seq of the last delta emitted
}

type window struct {
	id   uint64
	keys map[string]*entry
	tail *entry // the entry whose local slot changed last
}

// entry is one key's counter in one window. Entries whose local slot has
// changed (ver > 0) form a list in ver order, so DeltasSince walks only
// what changed.
type entry struct {
	key        string
	c          GCounter
	ver        uint64 // store version of the last local change; 0 if none
	prev, next *entry
}

// NewStore returns an empty store owned by region that keeps retention
// windows, or [DefaultRetention] windows if retention < 1.
func NewStore(region string, retention int) *Store {
	if retention < 1 {
		retention = DefaultRetention
	}
	return &Store{region: region, retention: uint64(retention)}
}

// Region returns the region whose slot the store owns.
func (s *Store) Region() string { return s.region }

// Version returns the current version: the number of changes to the
// store's own slots so far. Pass it to DeltasSince later.
func (s *Store) Version() uint64 { return s.version }

// old reports whether window w is older than the retention horizon.
func (s *Store) old(w uint64) bool {
	return s.newest >= s.retention && w <= s.newest-s.retention
}

// Advance moves the retention horizon to window w, dropping the windows it
// leaves behind. It does nothing if w is not newer than the newest window
// seen.
func (s *Store) Advance(w uint64) {
	if w <= s.newest {
		return
	}
	s.newest = w
	s.windows = slices.DeleteFunc(s.windows, func(x *window) bool { return s.old(x.id) })
}

// entry returns key's entry in window w, creating both if needed.
// w must not be old.
func (s *Store) entry(key string, w uint64) (*window, *entry) {
	s.Advance(w)
	i, ok := slices.BinarySearchFunc(s.windows, w, func(x *window, w uint64) int { return cmp.Compare(x.id, w) })
	if !ok {
		s.windows = slices.Insert(s.windows, i, &window{id: w, keys: make(map[string]*entry)})
	}
	win := s.windows[i]
	e := win.keys[key]
	if e == nil {
		e = &entry{key: key}
		win.keys[key] = e
	}
	return win, e
}

// touch records a change of e's local slot: e gets a new version and moves
// to the end of its window's list.
func (s *Store) touch(w *window, e *entry) {
	s.version++
	e.ver = s.version
	if w.tail == e {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next = w.tail, nil
	if w.tail != nil {
		w.tail.next = e
	}
	w.tail = e
}

// Inc adds n to the store's own slot of key in window w. It returns
// [ErrOldWindow] if w is older than the retention horizon; a newer w
// advances the horizon.
func (s *Store) Inc(key string, w uint64, n uint64) error {
	if s.old(w) {
		return ErrOldWindow
	}
	if n == 0 {
		return nil
	}
	win, e := s.entry(key, w)
	e.c.Inc(s.region, n)
	s.touch(win, e)
	return nil
}

// Apply merges d into the store: slot d.Origin of key d.Key in window
// d.Window becomes the maximum of its value and d.Value. Applying the same
// deltas in any order, any number of times, gives the same state. It
// returns [ErrOldWindow] if d.Window is older than the retention horizon; a
// newer window advances the horizon. A delta that raises the store's own
// slot (its value echoed back after a restart) counts as a local change
// and is reported again by DeltasSince.
func (s *Store) Apply(d Delta) error {
	if s.old(d.Window) {
		return ErrOldWindow
	}
	if d.Value == 0 {
		return nil
	}
	win, e := s.entry(d.Key, d.Window)
	if e.c.raise(d.Origin, d.Value) && d.Origin == s.region {
		s.touch(win, e)
	}
	return nil
}

// Value returns the sum of all slots of key in window w; 0 if the store
// holds nothing for them.
func (s *Store) Value(key string, w uint64) uint64 {
	if e := s.lookup(key, w); e != nil {
		return e.c.Value()
	}
	return 0
}

// Slot returns region's slot of key in window w; 0 if the store holds
// nothing for them.
func (s *Store) Slot(key string, w uint64, region string) uint64 {
	if e := s.lookup(key, w); e != nil {
		return e.c.Slot(region)
	}
	return 0
}

func (s *Store) lookup(key string, w uint64) *entry {
	for _, win := range s.windows {
		if win.id == w {
			return win.keys[key]
		}
	}
	return nil
}

// DeltasSince returns one delta for every own slot changed after version,
// however often it changed, with its current value, and the version to
// pass next time. Every delta takes the next sequence number of the store,
// so the driver sends each returned batch to every peer; a peer that misses
// one sees a gap. Slots of dropped windows are not reported.
func (s *Store) DeltasSince(version uint64) ([]Delta, uint64) {
	var ds []Delta
	for w, e := range s.changedSince(version) {
		s.seq++
		ds = append(ds, Delta{Key: e.key, Window: w, Origin: s.region, Seq: s.seq, Value: e.c.Slot(s.region)})
	}
	return ds, s.version
}

// FullState returns one delta for every own slot the store holds, for a
// peer that must resync, and the sequence number they are current as of.
// Every delta carries that number; no new numbers are taken. The peer
// applies them all and then calls [Tracker.Reset] with seq. Send the full
// state in order with the delta stream, so that the deltas the peer has
// seen before it are exactly those up to seq.
func (s *Store) FullState() (ds []Delta, seq uint64) {
	for w, e := range s.changedSince(0) {
		ds = append(ds, Delta{Key: e.key, Window: w, Origin: s.region, Seq: s.seq, Value: e.c.Slot(s.region)})
	}
	return ds, s.seq
}

// changedSince yields, window by window and in version order, the entries
// whose own slot changed after version.
func (s *Store) changedSince(version uint64) iter.Seq2[uint64, *entry] {
	return func(yield func(uint64, *entry) bool) {
		for _, win := range s.windows {
			first := win.tail
			if first == nil || first.ver <= version {
				continue
			}
			for first.prev != nil && first.prev.ver > version {
				first = first.prev
			}
			for e := first; e != nil; e = e.next {
				if !yield(win.id, e) {
					return
				}
			}
		}
	}
}
