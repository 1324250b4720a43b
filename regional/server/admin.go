package server

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// AdminOptions configure a region's read-only Admin service and its
// status page. Every field is optional.
type AdminOptions struct {
	// Addr is the region's advertised gRPC address, reported in Status.
	Addr string
	// ConfigVersion reports the configuration version in force and the
	// latest refused one (from regional/configwatch); nil reports 0.
	ConfigVersion func() (version int64, refused error)
	// Applied reports the latest share assignment applied for a domain
	// (from regional/coordclient); nil reports none.
	Applied func(domain string) (term int64, version uint64)
	// Shares reads the fleet's persisted shares of a domain's limits,
	// limit → region → share, for the status page
	// (etcdstore.Store.DefaultShares); nil shows this region's only.
	Shares func(ctx context.Context, domain string, limits []string) (map[string]map[string]float64, error)
	// Refresh is how often the status page reloads; 0 means 5s.
	Refresh time.Duration
}

// RegisterAdmin registers the read-only part of allot.v1.Admin on gs:
// Usage and Status, answered for this region. The other methods answer
// UNIMPLEMENTED: writes go to the coordinator. Usage and Status need the
// viewer role (authz.go).
func (s *Service) RegisterAdmin(gs grpc.ServiceRegistrar, opts AdminOptions) {
	allotv1.RegisterAdminServer(authorizing{gs: gs, s: s}, regionAdmin{s: s, opts: opts})
}

type regionAdmin struct {
	allotv1.UnimplementedAdminServer
	s    *Service
	opts AdminOptions
}

// Usage reports this region's usage of the key the descriptor selects.
func (a regionAdmin) Usage(ctx context.Context, req *allotv1.UsageRequest) (*allotv1.UsageResponse, error) {
	limits, err := a.s.usage(ctx, req.GetDomain(), fromEntries(req.GetDescriptor_()))
	if err != nil {
		return nil, grpcError(err)
	}
	return &allotv1.UsageResponse{
		Regions: []*allotv1.RegionUsage{{Region: a.s.region, Addr: a.opts.Addr, Limits: limits}},
		Global:  limits,
	}, nil
}

// Status reports this region's view: its configuration, shares and
// decisions.
func (a regionAdmin) Status(context.Context, *allotv1.StatusRequest) (*allotv1.StatusResponse, error) {
	cfg := a.s.engine.Config()
	rs := a.s.regionStatus(cfg, a.opts)
	resp := &allotv1.StatusResponse{Config: &allotv1.ConfigVersion{Version: rs.GetConfigVersion()}, Regions: []*allotv1.RegionStatus{rs}}
	for _, d := range cfg.Domains {
		ds := &allotv1.DomainStatus{Name: d.Name}
		for _, l := range d.Limits {
			ds.Limits = append(ds.Limits, &allotv1.LimitInfo{Name: l.Name, Rate: rateText(l), Burst: l.Burst, Mode: l.Mode.String(),
				Enforcement: l.Enforcement.String(), Shadow: l.Shadow,
				Shares: map[string]float64{a.s.region: a.s.engine.Share(d.Name, l.Name, "")}})
		}
		resp.Domains = append(resp.Domains, ds)
	}
	return resp, nil
}

func rateText(l *allot.Limit) string {
	if l.Unlimited {
		return "unlimited"
	}
	return l.Rate.String()
}

// usage checks desc without charging it (through the regional store for
// leased and exact limits) and reports, for every limit it matches, what
// this region's allowance of the key has spent and still holds.
func (s *Service) usage(ctx context.Context, domain string, desc allot.Descriptor) ([]*allotv1.LimitUsage, error) {
	if err := checkItem(CheckItem{Domain: domain, Descriptors: []allot.Descriptor{desc}}); err != nil {
		return nil, err
	}
	now := s.now()
	var dec allot.Decision
	if err := s.checkItems(ctx, now, domain, []regional.Item{{Descriptor: desc}}, &dec); err != nil {
		return nil, err
	}
	d := s.engine.Config().Domain(domain)
	if d == nil {
		return nil, fmt.Errorf("%w %q", regional.ErrUnknownDomain, domain)
	}
	var out []*allotv1.LimitUsage
	for _, st := range dec.Statuses {
		l := d.Limit(st.Name)
		if l == nil || l.Unlimited {
			continue
		}
		key := regional.KeyString(l, desc)
		share := s.engine.Share(domain, l.Name, key)
		capacity := d.Effective(l, desc, now).Burst
		if l.Algorithm == allot.SlidingWindow {
			capacity = st.Limit
		}
		used := max(int64(math.Floor(float64(capacity)*share))-st.Remaining, 0)
		out = append(out, &allotv1.LimitUsage{Limit: l.Name, Key: key, Amount: st.Limit, Window: durationpb.New(st.Window),
			Used: used, Remaining: st.Remaining, ResetAfter: durationpb.New(st.ResetAfter), Share: share, Shadow: l.Shadow})
	}
	return out, nil
}

// regionStatus is this region's configuration version, and each limit of
// cfg (the engine's) with its share, shadow and fallback state and
// decisions, in cfg's order.
func (s *Service) regionStatus(cfg *allot.Config, opts AdminOptions) *allotv1.RegionStatus {
	rs := &allotv1.RegionStatus{Region: s.region, Addr: opts.Addr}
	if opts.ConfigVersion != nil {
		v, err := opts.ConfigVersion()
		rs.ConfigVersion = v
		if err != nil {
			rs.ConfigError = err.Error()
		}
	}
	fallback := map[[2]string]bool{}
	if s.enforcer != nil {
		for _, l := range s.enforcer.Stats().Limits {
			fallback[[2]string{l.Domain, l.Limit}] = l.Fallback
		}
	}
	// A shared limit with a stale peer is on its split share: a fallback
	// too. The sync lag to a peer is the time since it was last heard on
	// any limit.
	heard := map[string]time.Time{}
	for _, st := range s.engine.SyncStats() {
		if st.Fallback {
			fallback[[2]string{st.Domain, st.Limit}] = true
		}
		for p, at := range s.engine.LastHeard(st.Domain, st.Limit) {
			if at.After(heard[p]) {
				heard[p] = at
			} else if _, ok := heard[p]; !ok {
				heard[p] = at
			}
		}
	}
	now := s.now()
	for _, p := range slices.Sorted(maps.Keys(heard)) {
		ps := &allotv1.PeerSync{Region: p}
		if at := heard[p]; !at.IsZero() {
			ps.Lag = durationpb.New(now.Sub(at))
		}
		rs.Peers = append(rs.Peers, ps)
	}
	counts := s.decisionCounts()
	for _, d := range cfg.Domains {
		rd := &allotv1.RegionDomain{Name: d.Name}
		if opts.Applied != nil {
			rd.Term, rd.Version = opts.Applied(d.Name)
		}
		for _, l := range d.Limits {
			id := [2]string{d.Name, l.Name}
			c := counts[id]
			rd.Limits = append(rd.Limits, &allotv1.RegionLimit{Name: l.Name, Share: s.engine.Share(d.Name, l.Name, ""),
				Shadow: l.Shadow, Fallback: fallback[id], Allowed: c.allowed, Rejected: c.rejected, ShadowRejected: c.shadowRejected})
		}
		rs.Domains = append(rs.Domains, rd)
	}
	return rs
}

// decisionCount is one limit's decisions since the service started.
type decisionCount struct{ allowed, rejected, shadowRejected uint64 }

// decisionCounts reads the decisions counters, by domain and limit,
// without creating series.
func (s *Service) decisionCounts() map[[2]string]decisionCount {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		s.metrics.decisions.Collect(ch)
		close(ch)
	}()
	out := map[[2]string]decisionCount{}
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		var id [2]string
		var result string
		for _, lp := range pb.GetLabel() {
			switch lp.GetName() {
			case "domain":
				id[0] = lp.GetValue()
			case "limit":
				id[1] = lp.GetValue()
			case "result":
				result = lp.GetValue()
			}
		}
		c, n := out[id], uint64(pb.GetCounter().GetValue())
		switch result {
		case "allowed":
			c.allowed += n
		case "rejected":
			c.rejected += n
		case "shadow_rejected":
			c.shadowRejected += n
		}
		out[id] = c
	}
	return out
}
