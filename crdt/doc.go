// Package crdt holds the replicated counters that regions exchange to
// enforce a shared-mode limit: each region counts its own usage in its own
// slot, ships the slots that changed to its peers, and admits a request if
// the sum of all slots for the key's window stays under the limit.
//
// The pieces:
//
//   - [GCounter]: a grow-only counter with one slot per region; merge is the
//     per-slot maximum, so duplicated, reordered or repeated merges are
//     harmless. [PNCounter] pairs two of them for counts that go down
//     (refunds when a token reservation settles below its estimate).
//   - [Store]: a GCounter per (key, window) for the last few windows, owned
//     by one region. Window ids are floor(unix_ms / window_ms) and are
//     passed in; the package never reads a clock.
//   - [Delta]: "slot Origin of Key in Window is Value", the Seq-th delta of
//     Origin. [Store.DeltasSince] extracts them, [Store.Apply] merges them,
//     [Store.FullState] gives all of them for a resync.
//   - [Tracker]: follows each origin's sequence numbers and reports a [Gap]
//     when deltas were lost.
//   - [AppendBatch] and [DecodeBatch]: a compact binary encoding of a batch
//     of deltas, with keys and region names written once per batch.
//
// # Concurrency
//
// No type in this package is safe for concurrent use: the caller serialises
// access, for example by having one goroutine own a region's Store and
// Tracker, or by holding a mutex around them. The functions AppendBatch and
// DecodeBatch keep no state and may be called from any goroutine.
//
// # Driver loop
//
// The package does no I/O; a driver moves the data. In region us-east:
//
//	store := crdt.NewStore("us-east", crdt.DefaultRetention)
//	var peers crdt.Tracker
//	var version uint64
//
//	// On every admitted request:
//	w := uint64(now.UnixMilli()) / windowMs
//	store.Inc(key, w, cost)
//
//	// Every sync interval (100-250 ms), the same batch to every peer:
//	var ds []crdt.Delta
//	ds, version = store.DeltasSince(version)
//	broadcast(crdt.AppendBatch(nil, ds))
//
//	// For every batch received from a peer:
//	ds, err := crdt.DecodeBatch(b)
//	for _, d := range ds {
//		if peers.Observe(d.Origin, d.Seq) == crdt.Gap {
//			askFullState(d.Origin) // deltas were lost
//		}
//		store.Apply(d) // always: applying is idempotent; ErrOldWindow is harmless
//	}
//
//	// Asked for a resync, the origin answers in order with its stream:
//	full, seq := store.FullState()
//	send(peer, full, seq)
//
//	// The peer applies the full state without observing it, then resets:
//	for _, d := range full {
//		store.Apply(d)
//	}
//	peers.Reset(origin, seq)
package crdt
