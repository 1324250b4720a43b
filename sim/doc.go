// Package sim is a deterministic simulator that runs allot's real cores
// on a virtual clock: the coordinator state machine
// ([coordinator.Coordinator]) and every region's [coordinator.Applier] and
// [regional.Engine] (split mode, shared mode with peer sync, borrowing),
// connected by a simulated network. Like CockroachDB's allocation
// simulator, it models nothing of allot itself: only time, traffic and
// the network.
//
// A [Scenario] (a YAML file in sim/scenarios; a new case is a new file)
// gives the allot configuration inline, the regions and their links to
// the coordinator and to each other (RTT, jitter, loss, duplication),
// Poisson traffic generators (per region, from/until, Zipf over many
// keys, reaching some instances), faults (partition a region from the
// coordinator and its peers; coordinator failover, which restarts it
// from the persisted snapshot under a higher term) and assertions. [Run]
// simulates several systems with the same arrivals: allot; the naive
// even split (one engine per instance, each enforcing global ÷
// instances, no coordinator, no peers); and for a shared-mode limit,
// allot without the staleness fallback (the engine has no switch for it,
// so stale_after is set to a day). It returns a [Result], which
// `allot sim run FILE --out DIR` writes as report.md and summary.json,
// with PNG plots drawn by the subpackage report (gonum/plot, kept out of
// this package so that it imports only allot's cores and the standard
// library).
//
// # Driver loop
//
// One goroutine, one event queue ordered by virtual time, ties broken by
// the order events were scheduled; randomness comes from two *rand.Rand
// seeded by the scenario (one for arrivals, drawn the same way in every
// system, one for the network). The same scenario and seed give the same
// report, byte for byte. The events, as the production drivers
// (coordinator/service, regional/coordclient, regional/peersync) do them:
//
//	every Tick:          rd := coord.Tick(now); persist(rd.Persist); send(rd.Send)
//	every ReportEvery:   report := Report{Limits: engine.Demand()}; send(report)
//	report arrives:      rd, err := coord.Step(now, report); persist; send
//	assignment arrives:  shares, ack, err := applier.Apply(a)
//	                     for s := range shares { engine.SetShare / SetKeyShare } // lowerings first
//	                     send(ack)
//	ack arrives:         rd, err := coord.Step(now, ack); persist; send
//	request arrives:     engine.Check(now, domain, desc, cost, &dec)
//	every SyncTick (with peers):
//	                     batches := engine.SyncOut(now); send each to every peer, and a heartbeat
//	                     for a := range engine.LoanAsks(now) { send Lend to a.Peer }
//	batch arrives:       peer.Heard(now, from); resync, err := peer.Inbound(now, src, batch)
//	                     if resync { ask from for FullState }
//	Lend arrives:        g, err := lender.Lend(now, req); send g back
//	grant arrives:       borrower.Credit(now, ask, g, err) // or errLendTimeout after LendTimeout
//	failover:            coord = nil; later coordinator.New(now, {Term: term+1}, persisted)
//
// A message is sent after RTT/2 plus jitter, or lost; one to a stopped
// coordinator is lost; a partitioned region loses what it sends and what
// is in flight to it.
//
// # Figures
//
// Every request is also checked by an ideal engine: one region holding
// the whole limit. Utilisation is admitted ÷ what the ideal admitted.
// False rejects are, per region, max(0, ideal admitted − admitted),
// summed: the requests a single global limiter would have admitted, net
// (which request exactly is ambiguous, the count is not). Overshoot
// counts (key, window) pairs whose global admitted exceeds L. At every
// share change the simulator sums the key's shares in force over regions
// (the coordinator's invariant: at most 1). Convergence is the time after
// a change of offered traffic until every region's share of the watched
// key (Scenario.Watch) is within 0.05 of
// floor + (1 − Σ floors) × rate ÷ Σ rate, and stays so.
//
// Simplifications: allot's region is one engine with local enforcement
// (instances shape only the naive baseline); the regional store and its
// outages, token budgets and clock skew are not simulated yet.
package sim
