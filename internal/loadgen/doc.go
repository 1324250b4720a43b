// Package loadgen drives a rate limiter's check API with a fixed load shape
// and measures what comes back: throughput, allowed and rejected counts,
// errors, and the latency distribution (an HDR histogram).
//
// The load is closed loop (Config.Rate 0: each of Config.Concurrency
// workers sends its next call as soon as the previous one is answered) or
// open loop (Config.Rate checks/s: calls are scheduled at fixed intervals
// whatever the answers, at most Config.Concurrency in flight). In open loop
// a call that is overdue when a worker comes free is timed from its
// scheduled send time, not from the moment it could be sent, so a stalled
// server shows up in the percentiles instead of slowing the load down
// (coordinated omission).
//
// The system under load is a Target; NewAllot drives allot's
// allot.v1.RateLimiter/Check, and Main adds others (gubernator, in the
// separate module deploy/bench/gubernator-target) to the same command line:
//
//	res, err := loadgen.Run(ctx, loadgen.NewAllot(conn, "api"), loadgen.Config{
//		Duration: 10 * time.Second, Concurrency: 128, Keys: 10000,
//	})
//	fmt.Println(res.Throughput(), res.Quantile(0.99))
package loadgen
