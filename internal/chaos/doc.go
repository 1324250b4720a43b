// Package chaos is allot's chaos end-to-end test: a local cluster of real
// processes (deploy/local: etcd, a Redis per region, two coordinators,
// two enforcer instances per region) with toxiproxy proxies on the links
// between regions, from each region to the coordinators and in front of
// each Redis; a load client that logs every decision; a chaos schedule;
// and a checker that reads the logs.
//
// Every link runs mutual TLS, as the local cluster does by default (its
// throwaway CA and a certificate per process); the proxies pass TLS
// through, and the load client and the scrapes present the cluster's
// operator certificate and verify the processes against its CA. With
// ALLOT_CHAOS_TLS=0 the cluster runs plain text on loopback.
//
// Run (scenario.go) drives it: the load (load.go) sends checks of a
// split-mode exact limit, a split-mode leased limit and a shared-mode
// limit, and LLM token reservations (Reserve, then Settle, Release, or
// nothing: left to expire), to every instance of every region, each
// with a deadline, and writes one Record per request (decisions.jsonl:
// time sent and answered, region, instance and its life, domain, limit,
// key, hits, allowed, latency, deadline met). Meanwhile the schedule
// kills the coordinator leader (found in etcd), partitions a region (its
// peer links both ways and its coordinator links cut), heals it, kills a
// regional Redis and restarts it, slows another, and restarts an
// enforcer instance (drained first, as a load balancer would). It times
// the failover and the recoveries (events.jsonl). Each instance's
// /metrics is scraped at the end of each of its lives.
//
// Check (check.go) verifies, on the logs alone:
//
//   - split mode: every fixed window (epoch-aligned, one period long) of
//     every key admits at most L over all regions;
//   - shared mode: at most L + the overshoot bound, the larger of
//     allot.SharedBound (docs/design.md, shared mode) and the bound the
//     enforcers export (allot_peer_overshoot_bound);
//   - every request was answered within its deadline;
//   - every admitted reservation ended: settled, released, or expired
//     (probed after its TTL, it answers late);
//   - the counters agree with the log, per instance and per life of its
//     process: allot_regional_decisions_total{domain,limit,result} and
//     allot_regional_reservations_total count every answered request of
//     that life, and no more than those plus the unanswered ones.
//
// An admission sent in one window and answered in the next is left out
// of the window totals (the log cannot say where the server counted it)
// and counted as ambiguous. Report.Table is the summary.
//
// The test (chaos_test.go) runs a short form in go test ./... and a long
// one with ALLOT_CHAOS_DURATION (make chaos).
package chaos
