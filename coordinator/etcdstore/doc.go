// Package etcdstore is the etcd edge of allot's coordinator: it elects one
// leader per domain, persists the leader's assignments fenced by its term,
// reads them back for a new leader or a restarting region, and stores the
// fleet's versioned limits configuration, its overrides and plan
// assignments, and the regions' registrations. It only moves the data of
// the pure core in package coordinator; it makes no decision.
//
// # Key layout
//
// Every key lives under the Store's prefix (default "/allot/"). Path
// segments taken from names (domain, limit, key) are escaped with
// url.PathEscape, so they hold no '/' and the layout is unambiguous.
// Values are JSON, readable with `etcdctl get --prefix /allot/`: the
// records are small, written once per change of a share, and being able to
// inspect them during an incident is worth more than the bytes a compact
// encoding would save.
//
//	<prefix>config/limits                              the limits YAML of the fleet
//	<prefix>config/versions/<n, 20 digits>             {"version":3,"time":…,"author":…,"summary":…,"rollback_of":2,
//	                                                    "yaml":…}: every configuration ApplyConfig stored, all
//	                                                   kept; config/limits is put in the same transaction
//	<prefix>config/overrides/<domain>/<limit>/<match>  {"domain":"api","limit":"per-user","match":[{"key":"user","value":"42"}],
//	                                                    "multiplier":5,"expires":…,"reason":…,"author":…,"created":…}
//	                                                   bound to a lease that ends when it expires; <limit> is "*"
//	                                                   for every limit; <match> is k=v,… sorted by k, query-escaped
//	<prefix>config/plans/<domain>/<match>              {"domain":"api","match":[…],"plan":"pro","author":…,"created":…}
//	<prefix>regions/<region>/<lease id, hex>           {"region":"us-east","addr":…,"http":…}: a regional enforcer's
//	                                                   read-only Admin API, bound to its session's lease
//	<prefix>domains/<domain>/election/<lease id, hex>  one key per campaigner, bound to its session's lease;
//	                                                   value: its gRPC address; the oldest (lowest create
//	                                                   revision) leads, and that revision is its term
//	<prefix>domains/<domain>/assignments/meta          {"term":7,"version":42}: Term and Version of the
//	                                                   latest Ready that persisted a record
//	<prefix>domains/<domain>/assignments/records/<limit>/<key>
//	                                                   {"limit":"per-user","key":"user=42",
//	                                                    "cells":[{"region":"us-east","share":0.5,"bound":0.5},…]}
//	                                                   one per share vector; <key> is empty (the key ends
//	                                                   in '/') for the limit's default vector
//
// # Fencing and chunking
//
// [Store.Persist] writes a Ready's records, then its meta, in etcd
// transactions of at most 100 operations (etcd refuses more than 128 by
// default, --max-txn-ops) and about 512 KiB. Each transaction succeeds
// only if the leader's election key still has the create revision that is
// the leader's term, so nothing is written once a newer leader may exist.
//
// A crash or a lost leadership between two transactions leaves some
// records of the Ready written and the others, and the meta, as they were.
// That is safe: the driver sends a Ready's assignments only after Persist
// returned nil, so a written record is one whose share was never sent;
// its Bound covers both the share the region may still apply and the new
// one, and a new leader (with a higher term) or a restarting region takes
// it exactly as if the whole Ready had been persisted and then the leader
// had crashed before sending. Records not yet written still describe what
// was sent before.
//
// # Concurrency
//
// A Store and a Leadership are safe for concurrent use. Persist calls of
// one Leadership must be serialised by the caller (the leader's driver
// loop), so that the meta written last is the latest Ready's.
//
// The leader's driver:
//
//	l, err := store.Campaign(ctx, "api", grpcAddr) // blocks until elected
//	defer l.Resign(context.Background())
//	snap, err := store.Snapshot(ctx, "api")
//	c, err := coordinator.New(now(), coordinator.Config{Domain: d, Term: l.Term}, snap)
//	for {
//		rd := … // c.Step or c.Tick
//		if err := store.Persist(ctx, l, "api", rd); err != nil {
//			return err // ErrNotLeader or etcd down: send nothing, drop c, campaign again
//		}
//		send(rd.Send)
//	}
//
// with a select on l.Done() to step down as soon as the session is lost.
package etcdstore
