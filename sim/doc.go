// Package sim is a deterministic simulator that runs allot's real cores
// on a virtual clock: the coordinator state machine
// ([coordinator.Coordinator]), every region's [coordinator.Applier], and
// every instance's [regional.Engine] (split mode, shared mode with peer
// sync, borrowing), [regional.Enforcer] over a regional
// [regional.MemoryStore] (leased and exact enforcement, on_failure) and
// [regional.Reservations] (LLM token budgets), connected by a simulated
// network. Like CockroachDB's allocation simulator, it models nothing of
// allot itself: only time, traffic, the network and faults.
//
// A [Scenario] (a YAML file in sim/scenarios; a new case is a new file)
// gives the allot configuration inline, the regions, their instances and
// their links to the coordinator and to each other (RTT, jitter, loss,
// duplication), traffic generators (Poisson, diurnal, bursts, Zipf over
// many keys, a key that reaches only some instances, LLM calls), faults
// (partition, coordinator failover, regional store outage, clock skew,
// a configuration reload that lowers L or removes a region) and
// assertions. [Run] simulates several systems with the same arrivals:
// allot; the naive even split (one engine per instance, each enforcing
// global ÷ instances, no coordinator, no peers, no store); for a
// shared-mode limit, allot without the staleness fallback (the engine has
// no switch for it, so stale_after is set to a day); for a limit of
// tokens, allot charging LLM calls only after the response. It returns a
// [Result], which `allot sim run FILE --out DIR` writes as report.md and
// summary.json, with PNG plots drawn by the subpackage report
// (gonum/plot, kept out of this package so that it imports only allot's
// cores and the standard library).
//
// # Regions and instances
//
// A region runs Region.Instances instances, each with an engine of its
// own and its side of the assignment protocol (coordinator.Instance, as
// regional/coordclient drives it): each connects to the coordinator (the
// production coordinator.Fleet), reports its own demand, applies its own
// assignments and grants, and holds nothing until granted. With local
// enforcement each enforces its region's share × its weight (the Fleet
// divides a region's share among its instances by their demand); with
// leased or exact enforcement each is a regional.Enforcer over the
// region's store, whose buckets hold the region's share, and on_failure
// local divides by the instance count the Enforcer learnt from
// heartbeats. The store takes time from the true clock (as Redis TIME)
// and counts its calls. With peers, every
// instance syncs and borrows through its own regional/node.Node,
// streaming to one instance of each peer region, and a region of several
// instances sums its shared-mode counts in a regional.MemoryCounts (the
// regional Redis).
//
// # Driver loop
//
// One goroutine per system, one event queue ordered by virtual time, ties
// broken by the order events were scheduled. Each traffic stream draws
// from a random source of its own (so arrivals are the same in every
// system), the network from another. The same scenario and seed give the
// same report, byte for byte. The events, as the production drivers
// (coordinator/service, regional/coordclient, regional/peersync, the
// servers' tickers) do them:
//
//	every Tick:          rd := coord.Tick(now); persist(rd.Persist); send(rd.Send)
//	every ReportEvery:   report := Report{Limits: Σ instance.Demand()}; send(report)
//	report arrives:      rd, err := coord.Step(now, report); persist; send
//	assignment arrives:  shares, ack, err := applier.Apply(a)
//	                     for each instance: SetShare / SetKeyShares  // lowerings first
//	                     send(ack)
//	ack arrives:         rd, err := coord.Step(now, ack); persist; send
//	request arrives:     enforcer.CheckItems(ctx, now, …) or engine.Check(now, …)
//	LLM call arrives:    r, err := reservations.Reserve(ctx, now, req)
//	LLM call ends:       reservations.Settle(ctx, now, r.ID, prompt, output)
//	every EnforcerTick:  enforcer.Tick(ctx, now); reservations.Tick(ctx, now)
//	every SyncTick (with peers):
//	                     batches := engine.SyncOut(now); send each to every peer, and a heartbeat
//	                     for a := range engine.LoanAsks(now) { send Lend to a.Peer }
//	batch arrives:       peer.Heard(now, from); resync, err := peer.Inbound(now, src, batch)
//	                     if resync { ask from for FullState }
//	Lend arrives:        g, err := lender.Lend(now, req); send g back
//	grant arrives:       borrower.Credit(now, ask, g, err) // or errLendTimeout after LendTimeout
//	every 5 s:           engine.Sweep(now) // drops keys back to full: no decision changes
//	failover:            coord = nil; later coordinator.New(now, {Term: term+1}, persisted)
//	store outage:        store.SetErr(err); later store.SetErr(nil)
//	clock skew:          a region's now is true time + skew in every call above
//	config:              every kept instance: engine.Reconfigure(now, cfg); node.Reconfigure(now)
//	                     coord = nil; later coordinator.NewFleet(now, {Domain: new, Term: term+1}, persisted)
//	                     a region cfg lacks: cut, its requests rejected
//
// A message is sent after RTT/2 plus jitter, or lost; one to a stopped
// coordinator is lost; a partitioned region loses what it sends and what
// is in flight to it.
//
// With Scenario.ArrivalTick set, arrivals are decided at the end of each
// tick instead of at their own instant, and those of one key at one
// instance together, in as few engine calls as give the outcome of one
// call per request (see world.decide): scale.yaml runs a million
// requests a second this way.
//
// # Figures
//
// Every request is also checked by an ideal pass: one engine holding the
// whole limit, on true time (for LLM calls, one that knows each call's
// real cost at admission). Utilisation is admitted ÷ what the ideal
// admitted. False rejects are, per region, max(0, ideal admitted −
// admitted), summed: the requests a single global limiter would have
// admitted, net (which request exactly is ambiguous, the count is not).
// Overshoot counts (key, window) pairs, windows in true time, whose
// global admitted exceeds L (an LLM call counts its real cost in the
// window that admitted it); a region's part of a window's excess is in
// proportion to what it admitted there. For a token bucket or GCRA limit,
// never_above_limit checks instead that what every instance of every
// region admitted of one key over every interval T of true time is at
// most B + r·T, in one scan per key (bound.go). At every share change the
// simulator sums the key's shares in force over regions (the
// coordinator's invariant: at most 1). Convergence is the time after the
// start and after each change of offered traffic until the shares of the
// watched key (Scenario.Watch) are within 0.05 of
// floor + (1 − Σ floors) × rate ÷ Σ rate, and stay so. Messages count
// both ways on a region's link to the coordinator and what it sends to
// peers; store calls count Take, Lease and the reservation calls
// (heartbeats apart), per request.
//
// Simplifications: the regional store answers at once (its latency, timeouts
// and breaker are not simulated: an outage fails every call); the
// measured limit is the domain's one named by Scenario.Limit, and every
// traffic stream's descriptor is one entry that limit matches.
package sim
