// Package peersync is a regional enforcer's link to the enforcers of the
// other regions (allot.v1.Peer): it carries the counters of shared-mode
// limits both ways and the loans of split-mode allowance. The decisions
// stay in the engine (package regional), which never waits for a peer;
// this package only moves the engine's data over gRPC and reads the
// clock.
//
// # Streams
//
// Each instance dials every peer region's address (a load balancer in
// front of that region's instances, or one of them) and keeps one Sync
// stream to it, reconnecting with backoff. On the stream it sends its
// hello, the full state of every shared-mode limit, then one message per
// tick with the deltas that are due (crdt's compact encoding, one batch
// per limit) or, when nothing changed for a while, an empty message: a
// heartbeat, with a mark of the last sequence number per limit. The
// accepting side answers with its hello, heartbeats, resync requests
// (it saw a gap, or a mark above what it received: it wants that limit's
// full state, which the sender queues in order with its deltas) and
// rejections. Since every region dials every other, each direction of
// data has a stream of its own, and each side hears from the other on
// both.
//
// Messages to a peer go through a bounded queue; when it is full (a slow
// or cut-off peer) the message is dropped, and the peer sees a gap and
// resyncs. A new stream starts with full states, so a reconnection loses
// nothing.
//
// # Driver loop
//
//	s, err := peersync.New(peersync.Options{Region: "us-east", Engine: engine,
//		Peers: map[string]string{"eu-west": "eu.example:8081", "ap-south": "ap.example:8081"}})
//	s.Register(grpcServer) // serves allot.v1.Peer next to the RateLimiter
//	go s.Run(ctx)          // dials the peers; every tick:
//	                       //   node.SyncOut(ctx, now) → batches to every peer
//	                       //   engine.LoanAsks(now) → Lend on a peer → engine.Credit
//
// What a tick sends and what a received batch does are the instance's
// core's (regional/node, Options.Node, shared with the coordinator link;
// the simulator runs the same): with Options.Counts (the region's
// instances share a CountStore, the regional Redis), a tick merges this
// instance's counts and the peer slots it received into the store first,
// so that the region's slot is the sum over its instances and every
// instance knows what any of them received. The tick and heartbeat
// default to node.PeerIntervals.
//
// # Bad input
//
// A stream that opens without a hello, or from a region that is not a
// configured peer, ends with INVALID_ARGUMENT or PERMISSION_DENIED. A
// batch that does not decode, or that carries another region's slot,
// ends the stream with INVALID_ARGUMENT. A batch for a domain or limit
// this region does not have, or does not run in shared mode, is refused
// with a rejection and the stream goes on: configurations roll out
// region by region. Every refusal is counted by reason
// (allot_peer_rejections_total).
//
// # Identities
//
// Over TLS a peer is who its certificate says (internal/tlsx): a Sync
// hello must name the region of the caller's certificate, and its
// instance if the hello names one; a Lend must name the certificate's
// region. A certificate of no enforcer (a gateway's, an operator's, a
// coordinator's) may do neither. Otherwise the stream or the call ends
// with PERMISSION_DENIED, counted with reason "identity". In plain text
// (loopback only) there is nothing to check against.
//
// A Syncer is safe for concurrent use.
package peersync
