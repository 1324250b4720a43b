package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// RegisterGRPC registers the service's gRPC APIs on gs: allot.v1.RateLimiter,
// Envoy's envoy.service.ratelimit.v3.RateLimitService and Envoy's rate limit
// quota service (envoy.service.rate_limit_quota.v3, rlqs.go). Every method
// is authorized (authz.go).
func (s *Service) RegisterGRPC(gs grpc.ServiceRegistrar) {
	gs = authorizing{gs: gs, s: s}
	allotv1.RegisterRateLimiterServer(gs, rateLimiter{s: s})
	registerEnvoy(gs, s)
	registerRLQS(gs, s)
}

type rateLimiter struct {
	allotv1.UnimplementedRateLimiterServer
	s *Service
}

func (r rateLimiter) Check(ctx context.Context, req *allotv1.CheckRequest) (*allotv1.CheckResponse, error) {
	items := make([]CheckItem, len(req.GetItems()))
	for i, it := range req.GetItems() {
		items[i] = CheckItem{Domain: it.GetDomain(), Hits: 1, Descriptors: descriptors(it.GetDescriptors())}
		if it.Hits != nil {
			items[i].Hits = it.GetHits()
		}
	}
	decs := make([]allot.Decision, len(items))
	if err := r.s.checkBatch(ctx, items, decs); err != nil {
		return nil, grpcError(err)
	}
	resp := &allotv1.CheckResponse{Results: make([]*allotv1.CheckResult, len(decs))}
	for i := range decs {
		resp.Results[i] = r.s.headedResult(items[i].Domain, items[i].Descriptors, &decs[i])
	}
	return resp, nil
}

func (r rateLimiter) Lease(ctx context.Context, req *allotv1.LeaseRequest) (*allotv1.LeaseResponse, error) {
	resp, err := r.s.leases.serve(ctx, req)
	if err != nil {
		r.s.metrics.errors.WithLabelValues(reason(err)).Inc()
		return nil, grpcError(err)
	}
	return resp, nil
}

// descriptors converts wire descriptors.
func descriptors(ds []*allotv1.Descriptor) []allot.Descriptor {
	out := make([]allot.Descriptor, 0, len(ds))
	for _, d := range ds {
		out = append(out, fromEntries(d.GetEntries()))
	}
	return out
}

// fromEntries converts a wire descriptor's entries.
func fromEntries(es []*allotv1.Entry) allot.Descriptor {
	desc := make(allot.Descriptor, len(es))
	for j, e := range es {
		desc[j] = allot.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	return desc
}

// checkResult converts dec without the quotas (quota, quota_window and
// partition unset): for answers no client writes rate limit headers
// from.
func checkResult(dec *allot.Decision) *allotv1.CheckResult { return quotaResult(dec, nil) }

// headedResult converts dec, the decision of a request with descriptors
// descs in domain, for a client that may write rate limit headers from
// it (the Go SDK's middleware): its statuses carry the quota, quota
// window and partition that the enforcer's own HTTP headers say
// (Service.policies).
func (s *Service) headedResult(domain string, descs []allot.Descriptor, dec *allot.Decision) *allotv1.CheckResult {
	var inline [4]policy
	return quotaResult(dec, s.appendPolicies(inline[:0], domain, descs, dec))
}

// quotaResult converts dec; ps are policies of dec's statuses, in their
// order (appendPolicies; nil: none), and give those statuses their quota,
// quota_window and partition.
func quotaResult(dec *allot.Decision, ps []policy) *allotv1.CheckResult {
	res := &allotv1.CheckResult{Allowed: dec.Allowed, RetryAfter: durationpb.New(dec.RetryAfter)}
	for i := range dec.Statuses {
		st := &dec.Statuses[i]
		ls := &allotv1.LimitStatus{
			Name:            st.Name,
			Limit:           st.Limit,
			Remaining:       st.Remaining,
			ResetAfter:      durationpb.New(st.ResetAfter),
			RetryAfter:      durationpb.New(st.RetryAfter),
			Allowed:         st.Allowed,
			Shadow:          st.Shadow,
			DescriptorIndex: int32(st.Descriptor),
			Window:          durationpb.New(st.Window),
		}
		if len(ps) > 0 && ps[0].st == st {
			ls.Quota, ls.QuotaWindow, ls.Partition = ps[0].quota, durationpb.New(ps[0].window), ps[0].partition
			ps = ps[1:]
		}
		res.Limits = append(res.Limits, ls)
	}
	return res
}
