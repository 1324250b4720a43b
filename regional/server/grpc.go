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
// quota service (envoy.service.rate_limit_quota.v3, rlqs.go).
func (s *Service) RegisterGRPC(gs grpc.ServiceRegistrar) {
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
		resp.Results[i] = checkResult(&decs[i])
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

func checkResult(dec *allot.Decision) *allotv1.CheckResult {
	res := &allotv1.CheckResult{Allowed: dec.Allowed, RetryAfter: durationpb.New(dec.RetryAfter)}
	for _, st := range dec.Statuses {
		res.Limits = append(res.Limits, &allotv1.LimitStatus{
			Name:            st.Name,
			Limit:           st.Limit,
			Remaining:       st.Remaining,
			ResetAfter:      durationpb.New(st.ResetAfter),
			RetryAfter:      durationpb.New(st.RetryAfter),
			Allowed:         st.Allowed,
			Shadow:          st.Shadow,
			DescriptorIndex: int32(st.Descriptor),
			Window:          durationpb.New(st.Window),
		})
	}
	return res
}
