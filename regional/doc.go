// Package regional is allot's enforcement engine: it decides, from memory
// and without I/O, whether a request passes the limits of its domain in
// this region.
//
// An Engine matches a request's descriptors against the domain's limits
// (every matching limit applies: per-user AND per-tenant), finds each key's
// state in a bounded, sharded key table, scales the key's effective limit
// (plan multiplier, then overrides) by the region's share, and admits the
// request only if every non-shadow limit admits it. A rejected request is
// charged nothing.
//
// Algorithms, per limit:
//   - token_bucket: cost-weighted with lazy refill. Charge (settling real
//     usage) may take the balance below zero; later requests then wait.
//   - gcra: the same admission as a token bucket, kept as one theoretical
//     arrival time (the form the Redis scripts use).
//   - sliding_window: fixed windows aligned on the epoch (window id =
//     floor(unix_ns / period)), estimated as prev·(1−x) + cur.
//
// Over any interval T a key admits at most burst + rate·T (a property test
// checks it for every algorithm).
//
// Shares: SetShare and SetKeyShare change the region's share of a limit or
// of one hot key. The rate and burst scale by the share; a lowered share
// clamps a key's tokens to the new burst at the instant of the change, and
// the key then refills at the new rate. Keys are brought up to date lazily
// the next time they are touched, so a share change costs O(1) however many
// keys the limit has.
//
// Keys: each key is identified by a 64-bit seeded hash of its domain, limit
// name and matched values (KeyString names it for people). The table keeps
// 40 bytes per key at a load factor of at most 3/4. A key whose state is
// back to full is equivalent to an absent one; Sweep drops such keys (no
// decision changes). Past Options.MaxKeys the key closest to full is
// evicted, and its state kept aside for when it is made again (two in one
// place merge into a state as charged as either); Stats counts them.
//
// The engine never reads the clock: every method takes now. An Engine is
// safe for concurrent use; checks on keys in different shards run in
// parallel, and a check that touches several keys locks their shards in a
// fixed order, so a multi-limit decision is atomic.
//
// Regional store: limits with enforcement leased or exact are shared by
// the instances of a region through a Store (a regional Redis, see
// regional/redisstore; MemoryStore for tests and the simulator). An
// Enforcer wraps the Engine and the Store; domains without such limits go
// straight to the Engine.
//
//   - exact: one Store.Take per request, all-or-nothing over its exact
//     keys.
//
//   - leased: an instance takes leases of tokens from the store and spends
//     them in memory; lease.go states their sizing and the bound, at most
//     burst + rate·T + burst/2 over any interval T.
//
//   - A request that matches several limits is charged on all or none:
//     local limits first, in the Engine, then leases, then the exact
//     limits in one Take; when a later one rejects, the earlier charges,
//     all in memory, are given back (refunds never exceed a full bucket).
//     Take is atomic on one Redis server (one script over every key); on
//     a Redis Cluster, whose scripts cannot span slots, regional/redisstore
//     charges per key and gives back the partial charges of a rejected
//     request, so concurrent requests may see a cost missing for a moment
//     (they may reject more, never admit more).
//
//   - Every store call has a deadline (EnforcerOptions.StoreTimeout, 5ms);
//     when it fails, each limit follows its on_failure: open allows, closed
//     rejects, local decides in an in-process bucket of share ÷ instances,
//     the instance count coming from heartbeats in the store.
//     docs/adr/0001-regional-store-failure-policy.md says why.
//
//     f := regional.NewEnforcer(e, store, regional.EnforcerOptions{Region: "us-east", Instance: id})
//     err := f.CheckItems(ctx, now, "api", items, &dec)
//     // every few hundred ms: membership, expired leases
//     f.Tick(ctx, now)
//     // at shutdown: unused lease tokens go back
//     f.Close(ctx, now)
//
// LLM token budgets (reserve.go): Reservations holds, at admission, a
// call's prompt plus an estimate of its output on the limits with unit
// tokens (one hit on request limits), and settles the real usage later:
// the unused part is refunded, the extra charged even below zero. The
// estimate is the p90 of recently settled outputs per limit and model
// (a Sketch; regional/sketch adapts DDSketch), a fraction of max_tokens
// until there are enough. A reservation not settled within its TTL is
// settled at what it holds by Tick, which frees its concurrency slot (in
// memory for local limits, in the Store, a ReservationStore, for leased
// and exact ones); a late Settle still corrects it for a grace period.
//
//	rs := regional.NewReservations(e, f, regional.ReservationOptions{}) // f may be nil
//	r, err := rs.Reserve(ctx, now, regional.ReserveRequest{Domain: "llm", Descriptors: ds, PromptTokens: 900, MaxTokens: 4096, Model: "m"})
//	// … the call streams …
//	s, err := rs.Settle(ctx, now, r.ID, inputTokens, outputTokens)
//	// every few hundred ms:
//	rs.Tick(ctx, now)
//
// Other regions (peer.go, shared.go, borrow.go, counts.go): after
// SetPeers, shared-mode limits are decided as a sliding window that admits
// own + Σ known others + cost ≤ L, the others' counts coming from the
// peers' G-counter slots (crdt), and beyond what the peers have seen a
// region admits at most allot.SharedBudget, max(rate × 2 × sync_interval,
// 5 % of L); while a peer is silent for stale_after, or has lost deltas
// not yet resynced, the limit falls back to what the region may still
// spend of its split share in the window. Every window aligned on the
// period then admits at most L + allot.SharedBound: (regions − 1) ×
// SharedBudget × max(1, ⌈one-way delay / sync_interval⌉), bursts
// included, and twice that through a partition (SyncStats.PartitionBound:
// the counts in flight at the cut are lost), with one instance per
// region, no clock skew and no other lost deltas. Split-mode limits with
// local enforcement borrow unused allowance from peers when exhausted,
// and lend theirs; the lender
// deducts before it grants, so a loan moves allowance and never creates
// it. A region of several instances sums their counts in a CountStore
// (docs/adr/0002-shared-mode-slots-across-instances.md; regional/node
// merges them). The driver, regional/peersync through regional/node,
// ticks a few times per sync interval:
//
//	batches := e.SyncOut(now)                 // to every peer, in order
//	resync, err := e.Inbound(now, src, batch) // from a peer; on resync, ask for its FullState
//	e.Heard(now, peer)                        // every message, heartbeats too
//	for _, a := range e.LoanAsks(now) {       // Lend on a.Peer, then
//		e.Credit(now, a, grant, err)
//	}
//	grant, err := e.Lend(now, req) // a peer's ask
//
// A driver (the gRPC/HTTP edge, or the simulator) calls it like this:
//
//	e := regional.New(cfg, regional.Options{})
//	var dec allot.Decision
//	if err := e.Check(now, "api", desc, 1, &dec); err != nil {
//		return err // bad input: nothing was charged
//	}
//	if !dec.Allowed {
//		reject(dec.RetryAfter)
//	}
//	// from time to time:
//	e.Sweep(now)
//	e.SetShare(now, "api", "per-user", 0.4) // from the coordinator
//
// Split-mode local sliding windows longer than a minute may be persisted,
// so that a restarted process of the same instance takes them up where it
// left them (persist.go; docs/adr/0004-instances-in-the-cores.md,
// decision 10). The driver, regional/node for allot regional:
//
//	e.EnablePersistence(regional.PersistOptions{}) // before any check
//	marks, _ := store.LoadMarks(ctx, instance, e.Persisted(now))
//	e.Restore(now, marks) // before the first grant and before serving
//	// every persistence interval (1 s):
//	if snap := e.Snapshot(now); snap != nil && store.SaveMarks(ctx, now, instance, snap.Marks) == nil {
//		e.AckSnapshot(snap)
//	}
package regional
