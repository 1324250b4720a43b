package server

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// policy is what the rate limit headers say of one limit for the
// request's key: what this instance enforces, not the limit over all
// regions.
type policy struct {
	st *allot.LimitStatus
	// quota (q) is what a full budget admits at once: the key's burst (a
	// token bucket's or GCRA's; a sliding window's amount) × this
	// instance's share, rounded down as the engine's comparisons do.
	quota int64
	// window (w) is how long a spent budget takes to refill entirely:
	// burst ÷ rate for a token bucket and GCRA (which then admit quota
	// every window), the period for a sliding window.
	window time.Duration
	// partition (pk) is the region, when the quota is the region's (or,
	// for a local limit, this instance's part of it); empty when it is
	// the whole limit's: a shared-mode limit in sync with its peers.
	partition string
	// remaining (r) is what the next sequential requests to this instance
	// may count on: at most quota, and never more than the next check
	// admits.
	remaining int64
}

// policies returns a policy for every status of d that the headers
// describe, in order: shadow limits and limits without an amount
// (unlimited) are left out. descs are the request's descriptors, as
// checked in domain; nil means unknown (a settlement), and then the
// quotas are the statuses' whole limits with no partition.
func (s *Service) policies(domain string, descs []allot.Descriptor, d *allot.Decision) []policy {
	return s.appendPolicies(nil, domain, descs, d)
}

// appendPolicies appends policies(domain, descs, d) to dst: the HTTP
// headers and the gRPC answers' quotas (quotaResult) both come from it.
func (s *Service) appendPolicies(dst []policy, domain string, descs []allot.Descriptor, d *allot.Decision) []policy {
	// A descriptor's limits are looked up once: the engine reports the
	// statuses grouped by descriptor, in order (another order is only
	// slower).
	var inline [4]regional.QuotaLimit
	var qs []regional.QuotaLimit
	at := -1
	var shared map[string]regional.SyncStats
	now := s.now()
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if st.Shadow || st.Limit == 0 {
			continue
		}
		p := policy{st: st, quota: st.Limit, window: st.Window, remaining: st.Remaining}
		var ql *regional.QuotaLimit
		if st.Descriptor >= 0 && st.Descriptor < len(descs) {
			if st.Descriptor != at {
				at = st.Descriptor
				qs, _ = s.engine.QuotaLimits(now, domain, descs[at], inline[:0])
			}
			for j := range qs {
				if qs[j].Limit.Name == st.Name {
					ql = &qs[j]
					break
				}
			}
		}
		if ql != nil && !ql.Limit.Unlimited {
			if ql.Limit.Mode == allot.Shared && shared == nil {
				shared = map[string]regional.SyncStats{}
				for _, ss := range s.engine.SyncStats() {
					if ss.Domain == domain {
						shared[ss.Limit] = ss
					}
				}
			}
			s.enforced(&p, ql, s.sharedState(now, domain, shared[ql.Limit.Name]))
		}
		p.remaining = min(max(p.remaining, 0), p.quota)
		dst = append(dst, p)
	}
	return dst
}

// sharing is how a limit is decided here as to its peers.
type sharing uint8

const (
	split       sharing = iota // on this region's share (split mode, or shared with no peers)
	sharedWhole                // shared mode in sync: the whole limit, less the peers' counts
	sharedStale                // shared mode with a stale peer: a sliding window on the split share
)

// sharedState says how a shared-mode limit with sync stats ss is decided
// at now: as regional/shared.go does, stale when a peer was not heard
// within stale_after (or never).
func (s *Service) sharedState(now time.Time, domain string, ss regional.SyncStats) sharing {
	if !ss.Shared {
		return split
	}
	if ss.Fallback {
		return sharedStale
	}
	for _, at := range s.engine.LastHeard(domain, ss.Limit) {
		if at.IsZero() || now.Sub(at) > ss.StaleAfter {
			return sharedStale
		}
	}
	return sharedWhole
}

// enforced sets p's quota, window and partition from what this instance
// enforces of ql's key (regional/check.go, regional/shared.go): the
// key's effective limit scaled by ql.Share, the whole limit for a shared
// limit in sync with its peers. It lowers p.remaining where the engine's
// report may promise more than its next check admits.
func (s *Service) enforced(p *policy, ql *regional.QuotaLimit, how sharing) {
	l, eff, share := ql.Limit, ql.Effective, ql.Share
	alg := l.Algorithm
	p.partition = s.region
	switch how {
	case sharedWhole:
		alg, share, p.partition = allot.SlidingWindow, 1, ""
	case sharedStale:
		alg = allot.SlidingWindow
	}
	amount, burst, period := float64(eff.Rate.Amount), float64(eff.Burst), eff.Rate.Period
	if alg == allot.SlidingWindow {
		burst = amount
	}
	// The same products as the engine's params.scaled, so that the floor
	// is the engine's whole number of admissions.
	p.quota = int64(math.Floor(burst * share))
	p.window = period
	if alg != allot.SlidingWindow && amount > 0 {
		p.window = time.Duration(math.Ceil(float64(period) * burst / amount))
	}
}

// setRateLimitHeaders sets, from a decision d and its policies ps
// (Service.policies):
//
//	RateLimit-Policy: "per-user";q=5;w=1;pk=:dXMtZWFzdA==:, "per-tenant";q=333;w=60;pk=:dXMtZWFzdA==:
//	RateLimit: "per-user";r=4;t=1;pk=:dXMtZWFzdA==:, "per-tenant";r=332;t=1;pk=:dXMtZWFzdA==:
//	X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (seconds)
//	Retry-After (seconds, at least 1) when rejected
//
// RateLimit-Policy and RateLimit follow the IETF httpapi draft's
// structured-field form, one item per enforced limit, and describe what
// this instance enforces for the key (see policy): q is the region's
// share of the key's burst (a local limit's: this instance's part), w the
// seconds a spent budget takes to refill, pk the region's name (base64,
// a byte sequence) unless the quota is the whole limit's. The X- headers
// describe the most constraining limit (mostConstraining), with the same
// numbers.
func setRateLimitHeaders(h http.Header, ps []policy, d *allot.Decision) {
	var items, state []string
	var top *policy
	for i := range ps {
		p := &ps[i]
		pk := ""
		if p.partition != "" {
			pk = ";pk=:" + base64.StdEncoding.EncodeToString([]byte(p.partition)) + ":"
		}
		items = append(items, fmt.Sprintf("%q;q=%d;w=%d%s", p.st.Name, p.quota, max(seconds(p.window), 1), pk))
		state = append(state, fmt.Sprintf("%q;r=%d;t=%d%s", p.st.Name, p.remaining, seconds(p.st.ResetAfter), pk))
		top = mostConstraining(top, p)
	}
	if top != nil {
		h.Set("RateLimit-Policy", strings.Join(items, ", "))
		h.Set("RateLimit", strings.Join(state, ", "))
		h.Set("X-RateLimit-Limit", strconv.FormatInt(top.quota, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(top.remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(seconds(top.st.ResetAfter), 10))
	}
	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(max(seconds(d.RetryAfter), 1), 10))
	}
}

// mostConstraining returns of top (nil: none yet) and p the one the X-
// headers describe: the one that rejected with the longest wait, else
// the one with the least remaining.
func mostConstraining(top, p *policy) *policy {
	switch {
	case top == nil:
		return p
	case !p.st.Allowed && (top.st.Allowed || p.st.RetryAfter > top.st.RetryAfter):
		return p
	case p.st.Allowed && top.st.Allowed && p.remaining < top.remaining:
		return p
	}
	return top
}
