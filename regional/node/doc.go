// Package node is the core of one enforcer instance beside its engine:
// what the instance does with the coordinator's assignments and grants
// (through coordinator.Instance: lowerings first, nothing until its first
// grant, nothing after a grant expires), the demand reports it sends, and
// its side of a peer sync tick (with several instances in a region, the
// merge of their shared-mode counts in the region's CountStore).
//
// A Node has no goroutines and reads no clock: time is an argument, and
// what must be sent is returned as data. Its edges only move that data:
// regional/coordclient (the Connect stream to the coordinator),
// regional/peersync (the Peer streams), and the simulator (sim/), which
// runs one Node per instance on a virtual clock.
//
//	n, _ := node.New(node.Options{Region: "us-east", Instance: id, Engine: e, Counts: redisStore, Marks: redisStore})
//	n.Restore(ctx, now) // with Marks, a stable id: the long windows in progress
//	n.Link(now)         // every coordinated share is 0 until granted
//	// on every (re)connect to a domain's coordinator:
//	hello, weights, _ := n.Connect(time.Now(), "api") // send them first
//	// for every assignment received:
//	_, ack, err := n.Assign(now, a) // send ack unless err
//	// every report interval:
//	for _, r := range n.Reports(now) { send(r) }
//	// when the grant in force expires (n.Expires(domain)):
//	n.Expire(now)
//	// every peer tick:
//	batches, _ := n.SyncOut(ctx, now) // to every peer
//	resync, err := n.Inbound(now, src, batch) // from a peer
//	// every persistence interval, with Marks:
//	n.Persist(ctx, now)
//	// on a graceful stop, once no request is served:
//	for d, ack := range n.Leave(now) { send(d, ack) }
package node
