package client

import (
	"context"
	"time"

	"github.com/allot-dev/allot"
)

// Source says where a Decision was made.
type Source uint8

const (
	// SourceLease: in this process, from a lease the enforcer granted.
	SourceLease Source = iota + 1
	// SourceEnforcer: by a regional enforcer, in a Check call.
	SourceEnforcer
	// SourceFallback: no enforcer answered; the limit's on_failure policy
	// decided (open, closed, or a local bucket of region share ÷ gateways).
	SourceFallback
)

func (s Source) String() string {
	switch s {
	case SourceLease:
		return "lease"
	case SourceEnforcer:
		return "enforcer"
	case SourceFallback:
		return "fallback"
	}
	return "unknown"
}

// Decision is the answer to Allow. It describes the most restrictive
// limit that matched: the one that rejected with the longest RetryAfter,
// or, when the request passed, the one with the least Remaining. A
// request no limit matched is allowed with an empty Limit.
type Decision struct {
	Allowed bool
	// Limit is the name of the limit the other fields describe.
	Limit string
	// Amount is that limit's effective amount per Window (after plans and
	// overrides), over all regions.
	Amount int64
	Window time.Duration
	// Quota is what the limit admits at once for the key in this region,
	// as the headers say it (RateLimit-Policy's q, X-RateLimit-Limit): the
	// key's burst times the region's share, rounded down (a local limit:
	// the answering enforcer's part of it), or the whole limit's for a
	// shared-mode limit in sync with its peers. An enforcer older than
	// the quota sends none: then Quota is Amount, QuotaWindow Window and
	// Partition empty. 0 when Amount is.
	Quota int64
	// QuotaWindow is how long a spent Quota takes to refill entirely
	// (RateLimit-Policy's w): burst ÷ rate for a token bucket and GCRA,
	// the period for a sliding window.
	QuotaWindow time.Duration
	// Partition is the region whose share Quota is (the headers' pk);
	// empty when Quota is the whole limit's.
	Partition string
	// Remaining is what the limit would still admit now, as far as this
	// gateway knows (its lease, or the enforcer's answer): at most a
	// positive Quota; it may be below zero when a gateway's view ran past
	// the enforcer's between syncs (the headers then show 0).
	Remaining  int64
	ResetAfter time.Duration
	// RetryAfter is how long until the same request may pass; 0 when
	// allowed.
	RetryAfter time.Duration
	Source     Source
	// Err is set when the request was malformed (nothing was charged) or
	// when no enforcer answered and on_failure decided.
	Err error
}

// Limiter decides requests. *Client implements it; the middleware takes
// any Limiter. Implementations must be safe for concurrent use.
type Limiter interface {
	Allow(ctx context.Context, domain string, descriptors []allot.Descriptor, hits int64) Decision
}
