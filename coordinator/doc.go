// Package coordinator is the pure core of allot's elected coordinator: it
// splits every limit among regions by demand (split mode enforces the
// shares; shared mode falls back to them), and moves shares between
// regions without ever letting the shares in force sum above 1.
//
// The pieces:
//
//   - [Allocate]: where shares should go, over the regions heard from
//     whose demand is known: floors first; an overloaded limit by demand,
//     as one global limiter divides it; otherwise each region's use plus
//     [Headroom], then what no region needs to the regions' claims
//     (decayed peaks of their demand), max-min fair, then by demand. A
//     region not heard from, or whose demand is not known, keeps its
//     share and the others divide the rest; hysteresis applies to the
//     vector as a whole. [InitialShares] is the split with equal demand
//     that regions use before any assignment.
//   - [Coordinator]: the state machine of one domain's leader. It keeps a
//     default vector of shares per limit and one per hot key (a key some
//     region reports near its allowance or rejecting), so its memory grows
//     with hot keys, not with all keys. Demand is an average of admitted +
//     rejected cost per second weighted by the time each report covers
//     ([Config.HalfLife]), that takes a shift at once; rebalances come
//     every [Config.Period], sooner after a shift, timed for the next
//     window boundary of a sliding-window limit.
//   - [Fleet]: the leader's view of every instance of every region. It
//     drives a Coordinator and divides each region's share of a split-mode
//     local limit among the region's instances by their demand, with
//     grants that expire ([Grant]). In windows longer than the period it
//     also moves allowance within a window as a quantity (docs/adr/0005):
//     what acks release ([Ack].Released) goes, as extras in grants, to the
//     instances that want it (Ack.Wanted), never more than was released.
//   - [Applier]: a region's side. It applies assignments in order, lowerings
//     first, and says what to acknowledge. [Instance] is one instance's
//     side under a Fleet.
//   - Messages are plain structs: [Report] and [Ack] go to the coordinator,
//     [Assignment] to regions, [Record] to durable storage; a [Snapshot] of
//     the records is what a new leader or a restarting region starts from.
//
// # Concurrency and driver loop
//
// Nothing here does I/O, starts a goroutine or reads the clock: time is
// an argument. A Coordinator and an Applier are not safe for concurrent
// use; each is owned by one goroutine of its driver, like raft's RawNode.
// The leader's driver (the etcd and gRPC edges) does this:
//
//	snap := load(ctx, d.Name) // after winning the election at revision rev
//	c, err := coordinator.New(now(), coordinator.Config{Domain: d, Term: rev}, snap)
//	for {
//		var rd coordinator.Ready
//		select {
//		case m := <-fromRegions: // coordinator.Report or coordinator.Ack
//			rd, err = c.Step(now(), m)
//			if err != nil {
//				reply(m, err) // bad input: nothing applied, counted in c.Stats()
//			}
//		case <-ticker.C: // every 100-500 ms; rebalances every Config.Period
//			rd = c.Tick(now())
//		}
//		// Persist first (records, Term and Version), fenced by the term; then send.
//		if err := persist(ctx, rev, rd); err != nil {
//			return err // step down; never send what was not persisted
//		}
//		for _, a := range rd.Send {
//			streams[a.Region].Send(a) // may be lost, late, duplicated
//		}
//	}
//
// A region's driver:
//
//	app, err := coordinator.NewApplier(d, "eu-west", load(ctx, d.Name))
//	for a := range assignments {
//		shares, ack, err := app.Apply(a)
//		if err != nil {
//			continue // stale or malformed: nothing applied
//		}
//		for _, s := range shares { // lowerings first
//			if s.Key == "" {
//				engine.SetShare(now(), d.Name, s.Limit, s.Value)
//			} else {
//				engine.SetKeyShare(now(), d.Name, s.Limit, s.Key, s.Value)
//			}
//		}
//		send(ack)
//	}
//
// # Why shares in force never sum above 1
//
// For every vector (a limit's default, or a hot key) and region r, the
// coordinator keeps held_r: a bound on every share r may be applying. It is
// the largest share sent to r and not yet known to be superseded; for a hot
// key that r may be following the default vector, at least the default's
// held_r too. The coordinator keeps Σ_r held_r ≤ 1 (the invariant) and
// regions only apply shares the coordinator counts in held (the claim);
// together they give Σ shares in force ≤ 1. A property test
// (TestNeverOverAllocates) checks both after every step of random runs
// with message loss, delay, duplication, partitions, leader changes and
// region restarts.
//
// The invariant. held rises only when the coordinator grants a share above
// it, and a grant takes the rise out of the vector's free share,
// 1 − Σ held; lowering a share does not lower held. held falls only when
// the region acknowledges, which is the demarcation rule: a region may give
// share up at once, and share becomes someone else's only once the giving
// up is known to be in force. A default share followed by some hot key
// counts in that key's sum too, so a rise of the default share in a region
// is also capped by the free share of every key that may follow it there.
//
// The claim. A share is counted in held before it leaves the coordinator,
// and is persisted before it is sent. Every assignment to a region carries
// all of its shares not yet acknowledged, with their latest values, and
// has a higher (term, version) than every earlier one; a region applies an
// assignment only if it is later than every one it applied. So once the
// region acknowledges an assignment sent after the latest change of its
// shares, it applies exactly those shares, and no earlier assignment can
// bring back a share it replaced: only then does held fall to the share.
// A lost or late message leaves held high, stranding share for a while; it
// never creates share. A region not heard from keeps its held, counted,
// so the others only divide what remains.
//
// Leader changes. A new leader's term is its election revision, above every
// earlier term. Persisting is fenced by the term (it fails once a newer
// leader exists) and happens before sending, so every share an old leader
// ever sent is in the records the new leader starts from. It takes each
// recorded bound (and for keys, the default share too) as held until the
// region acknowledges an assignment of the new term, which it sends to
// every region at once. Regions that have seen the new term ignore older
// ones; until then, what they may apply from the old leader is in the
// records. Records of different vectors are written at different times,
// so this may count a key above 1; such a key's shares, and the default
// shares it may follow, do not rise until the regions acknowledge.
//
// Region restarts. A restarting region starts from the latest snapshot and
// ignores every assignment up to its Term and Version, which every Ready
// persists with its records: so it cannot apply again an assignment it had
// replaced before restarting, and any later one carries what the records
// say. It never starts from InitialShares once records exist.
//
// Shares are float32 values, every grant rounded down, summed in float64:
// rounding cannot take a sum above 1.
package coordinator
