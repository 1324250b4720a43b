// Package client is allot's Go SDK for gateways that decide in their own
// process.
//
// A Client connects to the regional enforcers, decides requests from
// leases it holds in memory (Allow takes ~90 ns and allocates nothing with
// a lease in hand), sends one batched Lease call per sync interval
// (reports, returns, new leases), sends requests on `exact` limits to the
// enforcer batched with concurrent ones, and falls back to each limit's
// on_failure policy when no enforcer answers. docs/adr/0003 states the
// bound the leases keep.
//
//	c, err := client.New(client.Config{Addrs: []string{"127.0.0.1:8081"}})
//	if err != nil { ... }
//	defer c.Close() // returns unused tokens
//	d := c.Allow(ctx, "api", []allot.Descriptor{{{Key: "user", Value: "42"}}}, 1)
//	if !d.Allowed { ... 429, retry after d.RetryAfter ... }
//
// Middleware and UnaryServerInterceptor / StreamServerInterceptor put any
// Limiter in front of a net/http handler or a gRPC server, with the same
// headers (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After) as the
// enforcer's own HTTP API, and the same numbers: a Decision carries what
// the region admits of the key (Quota, QuotaWindow, Partition: q, w and
// pk), from the enforcer's answer or the lease's, so X-RateLimit-Limit is
// the region's quota, not the limit over all regions, and Remaining is at
// most the quota. A Remaining the enforcer answered promises the next
// requests to it; one from a lease adds what this gateway holds to what
// the enforcer had left at its last answer, and promises as much: with
// no other traffic on the key, the next Remaining requests of this
// gateway pass (a request its grants do not cover while a round moves
// tokens to or from the enforcer waits for that round, at most Timeout;
// a Check refused while a grant was asked takes the grant's tokens once
// it lands; and a key is not refused here while the enforcer's latest
// answer had enough left). Other gateways may spend what the enforcer had
// left meanwhile, and grants that expire unspent (a gateway stalled
// longer than the lease TTL) take their tokens with them.
// client/example/gateway is a runnable gateway.
//
// A Client is safe for concurrent use.
package client
