// Package redisstore keeps a region's leased and exact limits in a
// regional Redis: a single server or a Redis Cluster. It implements
// regional.Store; regional.Enforcer uses it.
//
// Each key of a limit is one Redis hash, "allot:<region>:{domain/limit:k=v}";
// the hash tag keeps it in one Cluster slot. Lua scripts (lua/) run the
// same token bucket, GCRA and sliding window math as regional/algo.go, on
// Redis time (TIME), so instances with skewed clocks agree; a key expires
// once it is full again. Scripts run by EVALSHA, and by EVAL once when a
// server answers NOSCRIPT (after a restart or a failover). Membership is
// one sorted set per region, scored by expiry.
//
// Calls from concurrent requests are pipelined together (go-redis
// autopipelining), bounded by Options.MaxInFlight so that a hung Redis
// cannot pile up goroutines or memory, and bounded in time by the
// caller's deadline. They go through one circuit breaker (sony/gobreaker):
// it opens when half of at least 20 calls in the last second failed (a
// ratio: calls in flight together time out together on a short stall),
// fails every call at once for Options.Cooldown, then lets a few calls
// probe Redis and closes when they succeed. The breaker lives here,
// at the edge, because it is a property of the connection to one Redis;
// the core sees only that a call failed, and applies on_failure.
//
// A call that arrives late does nothing. A call that timed out on the
// client is still in Redis' socket and runs when Redis gets to it, while
// its caller has decided without it (on_failure). So every script that
// charges (take, lease, charge, slots) is sent the caller's deadline as
// its first argument, in unix µs less Options.LateMargin (1ms by default,
// so that a reply that leaves Redis before it reaches the caller before
// it gives up), compares it with TIME before it changes anything, and
// past it changes nothing and answers LATE: the call fails with ErrLate,
// a context.DeadlineExceeded, and on_failure applies as for a timeout. A
// call without a deadline runs whenever it arrives. A late lease
// give-back (or refund) is lost, as a give-back that fails: under-
// admission, never returned twice. free.lua has no deadline: it removes a
// unique holder, so it is idempotent and a late free only frees a slot
// sooner than its TTL. Heartbeats and counts charge nothing.
//
// What remains: an answer that left Redis in time but reached its caller
// late (a client or network stall longer than the margin) was charged
// and decided by on_failure as well, which under-admits. Clock skew
// between the instance and Redis moves the deadline: Redis ahead by δ
// fails the calls it runs in the last δ of their time (all of them once
// δ nears the timeout: the breaker opens, the limits fall back, and
// allot_regional_store_calls_total{result="late"} shows it; nothing is
// charged wrongly); Redis behind by δ lets calls that arrive up to
// δ − margin after their deadline run, as before this rule. NTP keeps a
// region's clocks well within the margin.
//
// Atomicity: on a single server, Take is one script over every key of a
// request. A Cluster cannot run a script over keys of several slots, so
// there Take charges each key in its own script (one pipeline) and gives
// back the charges of the keys that admitted when another rejected: the
// bound is that concurrent requests may see up to this request's cost
// missing from those keys for one round trip, and that a give-back that
// fails loses the cost until the bucket refills. Neither admits more than
// the limit. Replication to Cluster replicas is asynchronous: a failover
// may lose the last writes of the dead primary, which over-admits by at
// most what was charged in its last moments.
//
//	s, err := redisstore.New(redisstore.Options{Addrs: []string{"10.0.0.5:6379"}, Registry: reg})
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	s.Ping(ctx) // load the scripts and warm the connections
//	f := regional.NewEnforcer(engine, s, regional.EnforcerOptions{Region: "us-east", Instance: id})
//
// Metrics (allot_regional_store_*): calls by operation and result, script
// calls, call latency, breaker state and queued calls.
package redisstore
