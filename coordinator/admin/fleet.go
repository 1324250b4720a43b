package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// regions returns the registered regions and a client for each; it drops
// the connections to regions no longer registered.
func (s *Server) regions(ctx context.Context) ([]etcdstore.Region, []allotv1.AdminClient, error) {
	rs, err := s.store.Regions(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[string]bool{}
	clients := make([]allotv1.AdminClient, len(rs))
	for i, r := range rs {
		live[r.Addr] = true
		cc := s.conns[r.Addr]
		if cc == nil {
			if cc, err = grpc.NewClient(r.Addr, grpc.WithTransportCredentials(s.regionCredentials())); err != nil {
				return nil, nil, fmt.Errorf("region %s at %s: %w", r.Region, r.Addr, err)
			}
			s.conns[r.Addr] = cc
		}
		clients[i] = allotv1.NewAdminClient(cc)
	}
	for addr, cc := range s.conns {
		if !live[addr] {
			cc.Close()
			delete(s.conns, addr)
		}
	}
	return rs, clients, nil
}

// regionCredentials are those of the connections to the regions.
func (s *Server) regionCredentials() credentials.TransportCredentials {
	if s.opts.Credentials != nil {
		return s.opts.Credentials
	}
	return insecure.NewCredentials()
}

// fanOut calls ask on every registered region at once, each bounded by
// RegionTimeout, and returns when all have answered or timed out.
func (s *Server) fanOut(ctx context.Context, ask func(ctx context.Context, r etcdstore.Region, c allotv1.AdminClient)) error {
	rs, clients, err := s.regions(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := range rs {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, s.opts.RegionTimeout)
			defer cancel()
			ask(rctx, rs[i], clients[i])
		})
	}
	wg.Wait()
	return nil
}

// regionError describes a region's failure to answer.
func regionError(err error) string {
	st := status.Convert(err)
	return fmt.Sprintf("%s: %s", st.Code(), st.Message())
}

// Usage asks every region for its usage of the key and sums them up.
func (s *Server) Usage(ctx context.Context, req *allotv1.UsageRequest) (*allotv1.UsageResponse, error) {
	if req.GetDomain() == "" || len(req.GetDescriptor_()) == 0 {
		return nil, grpcError(fmt.Errorf("%w: want a domain and a key such as tenant=acme", ErrBadRequest))
	}
	var mu sync.Mutex
	resp := &allotv1.UsageResponse{}
	err := s.fanOut(ctx, func(ctx context.Context, r etcdstore.Region, c allotv1.AdminClient) {
		ru := &allotv1.RegionUsage{Region: r.Region, Addr: r.Addr}
		if out, err := c.Usage(ctx, req); err != nil {
			ru.Error = regionError(err)
		} else if len(out.GetRegions()) > 0 {
			ru.Limits = out.GetRegions()[0].GetLimits()
		}
		mu.Lock()
		resp.Regions = append(resp.Regions, ru)
		mu.Unlock()
	})
	if err != nil {
		return nil, grpcError(err)
	}
	slices.SortFunc(resp.Regions, func(a, b *allotv1.RegionUsage) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Addr, b.Addr))
	})
	resp.Global = sumUsage(resp.Regions)
	return resp, nil
}

// sumUsage adds the regions' usage of each limit's key up: used,
// remaining and shares add; the reset is the latest. The amount and
// window are the key's effective limit as the regions enforce it: the
// same everywhere once a change has propagated; while the regions still
// disagree (an override or a new version reaching one region before
// another), the lowest rate, the one every answering region enforces at
// least, so that the sum never shows a raised limit in force before every
// region applies it (each region's own row shows what it enforces).
func sumUsage(regions []*allotv1.RegionUsage) []*allotv1.LimitUsage {
	var out []*allotv1.LimitUsage
	at := map[string]*allotv1.LimitUsage{}
	for _, r := range regions {
		for _, l := range r.GetLimits() {
			g := at[l.GetKey()]
			if g == nil {
				g = &allotv1.LimitUsage{Limit: l.GetLimit(), Key: l.GetKey(), Amount: l.GetAmount(), Window: l.GetWindow(), ResetAfter: durationpb.New(0)}
				at[l.GetKey()] = g
				out = append(out, g)
			}
			g.Used += l.GetUsed()
			g.Remaining += l.GetRemaining()
			g.Share += l.GetShare()
			g.Shadow = g.Shadow || l.GetShadow()
			if perSecond(l) < perSecond(g) {
				g.Amount, g.Window = l.GetAmount(), l.GetWindow()
			}
			if l.GetResetAfter().AsDuration() > g.GetResetAfter().AsDuration() {
				g.ResetAfter = l.GetResetAfter()
			}
		}
	}
	return out
}

// perSecond is a usage's rate, to compare limits of different windows.
func perSecond(l *allotv1.LimitUsage) float64 {
	if w := l.GetWindow().AsDuration(); w > 0 {
		return float64(l.GetAmount()) / w.Seconds()
	}
	return float64(l.GetAmount())
}

// Status reports the configuration version, each domain's leader, the
// persisted shares and hot keys per limit, and every region's own status.
func (s *Server) Status(ctx context.Context, _ *allotv1.StatusRequest) (*allotv1.StatusResponse, error) {
	fl, cur, err := s.current(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &allotv1.StatusResponse{Config: versionProto(cur, false)}
	var wg sync.WaitGroup
	var regionsErr error
	wg.Go(func() {
		var mu sync.Mutex
		regionsErr = s.fanOut(ctx, func(ctx context.Context, r etcdstore.Region, c allotv1.AdminClient) {
			rs := &allotv1.RegionStatus{Region: r.Region, Addr: r.Addr}
			if out, err := c.Status(ctx, &allotv1.StatusRequest{}); err != nil {
				rs.Error = regionError(err)
			} else if len(out.GetRegions()) > 0 {
				rs = out.GetRegions()[0]
				rs.Addr = r.Addr
			}
			mu.Lock()
			resp.Regions = append(resp.Regions, rs)
			mu.Unlock()
		})
	})
	cfg, err := currentConfig(fl)
	switch {
	case err != nil:
		resp.ConfigError = fmt.Sprintf("the configuration in etcd does not parse (it was put without the Admin API; regions keep their last good one): %v", err)
	case fl.YAML != nil && fl.Version != cur.Version:
		resp.ConfigError = fmt.Sprintf("the configuration in etcd was put without the Admin API: it is not version %d", cur.Version)
	}
	if cfg != nil {
		for _, d := range cfg.Domains {
			ds, err := s.domainStatus(ctx, d)
			if err != nil {
				wg.Wait()
				return nil, grpcError(err)
			}
			resp.Domains = append(resp.Domains, ds)
		}
	}
	wg.Wait()
	if regionsErr != nil {
		return nil, grpcError(regionsErr)
	}
	slices.SortFunc(resp.Regions, func(a, b *allotv1.RegionStatus) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Addr, b.Addr))
	})
	return resp, nil
}

// domainStatus is a domain's limits with their leader and persisted
// shares; a limit never assigned shows the initial split.
func (s *Server) domainStatus(ctx context.Context, d *allot.Domain) (*allotv1.DomainStatus, error) {
	ds := &allotv1.DomainStatus{Name: d.Name}
	leader, err := s.store.Leader(ctx, d.Name)
	switch {
	case errors.Is(err, etcdstore.ErrNoLeader):
	case err != nil:
		return nil, err
	default:
		ds.Leader = leader
	}
	names := make([]string, len(d.Limits))
	for i, l := range d.Limits {
		names[i] = l.Name
	}
	term, version, shares, err := s.store.Shares(ctx, d.Name, names)
	if err != nil {
		return nil, err
	}
	ds.Term, ds.Version = term, version
	for _, l := range d.Limits {
		ls := shares[l.Name]
		li := &allotv1.LimitInfo{Name: l.Name, Burst: l.Burst, Mode: l.Mode.String(), Enforcement: l.Enforcement.String(),
			Shadow: l.Shadow, Shares: ls.Shares, HotKeys: ls.HotKeys}
		if l.Unlimited {
			li.Rate = "unlimited"
		} else {
			li.Rate = l.Rate.String()
		}
		if li.Shares == nil && len(d.Regions) > 0 {
			li.Shares = map[string]float64{}
			for i, v := range coordinator.InitialShares(l.Floors, d.Regions) {
				li.Shares[d.Regions[i]] = v
			}
		}
		ds.Limits = append(ds.Limits, li)
	}
	return ds, nil
}
