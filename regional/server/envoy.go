package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// Envoy's rate limit service, envoy.service.ratelimit.v3.RateLimitService,
// served so that Envoy, Istio and other Envoy-based gateways use allot
// unchanged (see deploy/envoy). ShouldRateLimit follows rls.proto and
// Envoy's own service (github.com/envoyproxy/ratelimit):
//
//   - Each descriptor costs the request's hits_addend, 1 when it is 0
//     (unset), or its own hits_addend when set, where 0 checks without
//     charging. is_negative_hits gives the hits back (Engine.RefundItems).
//     It and limit overrides need the refund role and a domain with
//     allow_refunds (authz.go); without, the request is PERMISSION_DENIED
//     and nothing is charged.
//   - A descriptor's limit override (requests_per_unit per unit_multiplier
//     × unit; a month is 30 days, a year 365) replaces the limit it
//     matches, or counts it on its own key when it matches none.
//   - The request is decided as one: charged only if every descriptor
//     passes. Refunds are made after the check.
//   - A rate_limit.replaces of the limit one descriptor matches drops the
//     limits it names from the other descriptors of the request; that
//     takes a check-only pass first, in domains that use replaces.
//   - Hits above what a limit ever admits are OVER_LIMIT, as in Envoy's
//     service, not an error: Envoy fails open on errors by default.
//
// The answer has one status per descriptor, in order: OVER_LIMIT when a
// limit that is not in shadow mode rejects it, else OK. A descriptor that
// matches no limit, or only replaced ones, is OK with no current_limit; an
// unlimited one is OK with limit_remaining 4294967295. When a descriptor
// matches several limits (allot's own format), the one that decides it is
// reported: a rejection, else the least remaining. current_limit gives the
// period in the largest unit that divides it, with unit_multiplier; a
// period that is not a whole number of seconds is rounded to the nearest
// second. duration_until_reset is how long until the request would pass
// when it is rejected, else until the key is back to full.
//
// The response always carries the RateLimit-Limit, RateLimit-Remaining
// and RateLimit-Reset (seconds) headers for the descriptor closest to its
// limit, as Envoy's service does when LIMIT_RESPONSE_HEADERS_ENABLED is
// set: allot's HTTP API always sends them too, and an Envoy route can drop
// them with response_headers_to_remove.

// registerEnvoy registers Envoy's rate limit service for s on gs.
func registerEnvoy(gs grpc.ServiceRegistrar, s *Service) {
	rlsv3.RegisterRateLimitServiceServer(gs, envoyService{s: s})
}

type envoyService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Service
}

// ShouldRateLimit decides one request of Envoy's.
func (e envoyService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := e.s.shouldRateLimit(ctx, req)
	if err != nil {
		e.s.log.Debug("envoy check refused", "domain", req.GetDomain(), "err", err)
		return nil, grpcError(err)
	}
	return resp, nil
}

// envoyBatch is the items of a request that go to one engine call, and
// their indexes in the request.
type envoyBatch struct {
	items []regional.Item
	index []int
	dec   allot.Decision
}

// shouldRateLimit decides req. Its errors are the server's and the
// engine's, for grpcError; nothing is charged when it returns one.
func (s *Service) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	items, negative, err := envoyItems(req)
	if err != nil {
		s.metrics.record(domain, nil, err, 0)
		return nil, err
	}
	d := s.engine.Config().Domain(domain) // nil: the engine reports it
	if err := s.allowRefunds(ctx, d, items, negative); err != nil {
		s.metrics.record(domain, nil, err, 0)
		return nil, err
	}
	now := s.now()
	skip := s.replaced(now, d, items)
	var check, refund envoyBatch
	for i, it := range items {
		b := &check
		switch {
		case skip != nil && skip[i]:
			continue
		case negative[i]:
			b = &refund
		}
		b.items, b.index = append(b.items, it), append(b.index, i)
	}
	if len(check.items) > 0 {
		start := time.Now()
		err := s.checkItems(ctx, now, domain, check.items, &check.dec)
		if errors.Is(err, regional.ErrCostAboveBurst) {
			err = s.overBurst(ctx, now, domain, d, &check)
		}
		s.metrics.record(domain, &check.dec, err, time.Since(start))
		if err != nil {
			return nil, err
		}
	}
	if len(refund.items) > 0 { // a refund is no decision: only its errors count
		if err := s.refundItems(ctx, now, domain, refund.items, &refund.dec); err != nil {
			s.metrics.record(domain, nil, err, 0)
			return nil, err
		}
	}
	return envoyResponse(d, len(items), &check, &refund), nil
}

// envoyItems converts and validates a request before anything is charged:
// the engine validates too, but a request may take two calls.
func envoyItems(req *rlsv3.RateLimitRequest) ([]regional.Item, []bool, error) {
	ds := req.GetDescriptors()
	switch {
	case req.GetDomain() == "":
		return nil, nil, fmt.Errorf("%w: empty domain", ErrBadRequest)
	case len(ds) == 0:
		return nil, nil, fmt.Errorf("%w: no descriptors", ErrBadRequest)
	case len(ds) > regional.MaxItems:
		return nil, nil, fmt.Errorf("%w: %d descriptors, at most %d", ErrBadRequest, len(ds), regional.MaxItems)
	}
	hits := uint64(max(req.GetHitsAddend(), 1)) // unset (0) counts 1
	items, negative := make([]regional.Item, len(ds)), make([]bool, len(ds))
	for i, d := range ds {
		es := d.GetEntries()
		switch {
		case len(es) == 0:
			return nil, nil, fmt.Errorf("%w: descriptor %d has no entries", ErrBadRequest, i)
		case len(es) > regional.MaxEntries:
			return nil, nil, fmt.Errorf("%w: descriptor %d: %d entries, at most %d", regional.ErrBadDescriptor, i, len(es), regional.MaxEntries)
		}
		desc := make(allot.Descriptor, len(es))
		for j, e := range es {
			if e.GetKey() == "" {
				return nil, nil, fmt.Errorf("%w: descriptor %d: entry %d has an empty key", regional.ErrBadDescriptor, i, j)
			}
			desc[j] = allot.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		h := hits
		if d.GetHitsAddend() != nil {
			h = d.GetHitsAddend().GetValue()
		}
		if h > allot.MaxAmount {
			return nil, nil, fmt.Errorf("%w: descriptor %d: hits_addend %d, at most %d", regional.ErrBadCost, i, h, int64(allot.MaxAmount))
		}
		items[i] = regional.Item{Descriptor: desc, Hits: int64(h)}
		if o := d.GetLimit(); o != nil {
			r, err := envoyRate(o)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: descriptor %d: limit: %v", regional.ErrBadDescriptor, i, err)
			}
			items[i].Limit = &r
		}
		negative[i] = d.GetIsNegativeHits()
	}
	return items, negative, nil
}

// overrideUnits are the periods of a limit override's units.
var overrideUnits = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// envoyRate converts a descriptor's limit override.
func envoyRate(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (allot.Rate, error) {
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return allot.Rate{}, fmt.Errorf("unit %s, want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", o.GetUnit())
	}
	mult := uint64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = uint64(m.GetValue())
	}
	if most := uint64(366 * 24 * time.Hour / unit); mult == 0 || mult > most {
		return allot.Rate{}, fmt.Errorf("unit_multiplier %d, want [1, %d] (a period of at most 366 days)", mult, most)
	}
	r := allot.Rate{Amount: int64(o.GetRequestsPerUnit()), Period: time.Duration(mult) * unit}
	return r, r.Validate()
}

// replaced reports which items Envoy's service leaves out: those whose
// limit a limit of another item replaces. It is nil when the domain has
// no replaces, or when the engine refuses the request (the charging call
// then reports why).
func (s *Service) replaced(now time.Time, d *allot.Domain, items []regional.Item) []bool {
	if d == nil || !d.EnvoyPaths || !slices.ContainsFunc(d.Limits, func(l *allot.Limit) bool { return len(l.Replaces) > 0 }) {
		return nil
	}
	var dec allot.Decision
	if s.engine.CheckItems(now, d.Name, checkOnly(items), &dec) != nil {
		return nil
	}
	gone := map[string]bool{}
	for _, st := range dec.Statuses {
		if l := d.Limit(st.Name); l != nil {
			for _, r := range l.Replaces {
				gone[r] = true
			}
		}
	}
	skip := make([]bool, len(items))
	for _, st := range dec.Statuses {
		skip[st.Descriptor] = skip[st.Descriptor] || gone[st.Name]
	}
	return skip
}

// overBurst answers a check that the engine refused because an item costs
// more than a limit ever admits: it reports the state without charging,
// each limit that cannot take its item's hits rejecting.
func (s *Service) overBurst(ctx context.Context, now time.Time, domain string, d *allot.Domain, b *envoyBatch) error {
	if err := s.checkItems(ctx, now, domain, checkOnly(b.items), &b.dec); err != nil {
		return err
	}
	for i := range b.dec.Statuses {
		st := &b.dec.Statuses[i]
		if !unlimited(d, st.Name) && b.items[st.Descriptor].Hits > st.Remaining {
			st.Allowed = false
			b.dec.Allowed = b.dec.Allowed && st.Shadow
		}
	}
	return nil
}

func checkOnly(items []regional.Item) []regional.Item {
	probe := slices.Clone(items)
	for i := range probe {
		probe[i].Hits = 0
	}
	return probe
}

// unlimited reports whether the limit called name is unlimited; d may be nil.
func unlimited(d *allot.Domain, name string) bool {
	if d == nil {
		return false
	}
	l := d.Limit(name)
	return l != nil && l.Unlimited
}

// envoyResponse answers n descriptors from the decisions of the batches.
func envoyResponse(d *allot.Domain, n int, batches ...*envoyBatch) *rlsv3.RateLimitResponse {
	deciding := make([]*allot.LimitStatus, n)
	for _, b := range batches {
		for i := range b.dec.Statuses {
			st := &b.dec.Statuses[i]
			j := b.index[st.Descriptor]
			if cur := deciding[j]; cur == nil || rejects(st) && !rejects(cur) || rejects(st) == rejects(cur) && st.Remaining < cur.Remaining {
				deciding[j] = st
			}
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	var closest *rlsv3.RateLimitResponse_DescriptorStatus // for the headers
	for i, st := range deciding {
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = ds
		switch {
		case st == nil:
			continue
		case unlimited(d, st.Name):
			ds.LimitRemaining = math.MaxUint32
			continue
		case rejects(st):
			ds.Code, resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
		}
		unit, mult := envoyUnit(st.Window)
		ds.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: st.Name, RequestsPerUnit: clampUint32(st.Limit), Unit: unit}
		if mult != 1 {
			ds.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
		ds.LimitRemaining = clampUint32(st.Remaining)
		ds.DurationUntilReset = durationpb.New(cmp.Or(st.RetryAfter, st.ResetAfter))
		// Envoy's choice: the last rejection, else the least remaining.
		if closest == nil || ds.Code != rlsv3.RateLimitResponse_OK ||
			closest.Code == rlsv3.RateLimitResponse_OK && ds.LimitRemaining < closest.LimitRemaining {
			closest = ds
		}
	}
	if closest != nil {
		reset := (closest.DurationUntilReset.AsDuration() + time.Second - 1) / time.Second
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(int64(reset), 10)},
		}
	}
	return resp
}

// rejects reports whether st rejects its descriptor: shadow limits never do.
func rejects(st *allot.LimitStatus) bool { return !st.Allowed && !st.Shadow }

// responseUnits are the units of current_limit, largest first.
var responseUnits = []struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
}

// envoyUnit expresses a period as a unit and a multiplier: the largest
// unit that divides it, else seconds, rounded.
func envoyUnit(period time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range responseUnits {
		if period >= u.d && period%u.d == 0 {
			return u.unit, uint32(period / u.d)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_SECOND, uint32(max(1, period.Round(time.Second)/time.Second))
}

func clampUint32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }
