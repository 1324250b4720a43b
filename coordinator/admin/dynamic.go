package admin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// maxTTL bounds an override's life: longer ones belong in the file.
const maxTTL = 366 * 24 * time.Hour

// fits checks that dyn fits the configuration in force.
func (s *Server) fits(ctx context.Context, dyn allot.Dynamic) error {
	fl, err := s.store.Fleet(ctx)
	if err != nil {
		return err
	}
	cfg, err := currentConfig(fl)
	switch {
	case err != nil:
		return fmt.Errorf("the configuration in force does not parse: %w", err)
	case cfg == nil:
		return etcdstore.ErrNoConfig
	}
	_, err = cfg.WithDynamic(dyn)
	return err
}

// SetOverride stores an override for a while; it replaces the override of
// the same domain, limit and match.
func (s *Server) SetOverride(ctx context.Context, req *allotv1.SetOverrideRequest) (*allotv1.Override, error) {
	p := req.GetOverride()
	author, err := s.writer(ctx, p.GetAuthor())
	if err != nil {
		return nil, grpcError(err)
	}
	ttl := req.GetTtl().AsDuration()
	o := etcdstore.Override{Domain: p.GetDomain(), Override: allot.Override{Limit: p.GetLimit(), Match: match(p.GetMatch()), Multiplier: p.GetMultiplier()},
		Reason: p.GetReason(), Author: author, Created: s.opts.Now().UTC()}
	switch {
	case o.Domain == "":
		err = fmt.Errorf("%w: no domain", ErrBadRequest)
	case len(o.Match) == 0:
		err = fmt.Errorf("%w: no key: name the key the override is for, such as user=42", ErrBadRequest)
	case (p.GetRate() == "") == (p.GetMultiplier() == 0):
		err = fmt.Errorf("%w: want exactly one of a rate and a multiplier", ErrBadRequest)
	case req.GetTtl() == nil || ttl < time.Second || ttl > maxTTL:
		err = fmt.Errorf("%w: ttl %v, want between 1s and %v (longer ones belong in the limits file)", ErrBadRequest, ttl, maxTTL)
	case p.GetRate() != "":
		o.Rate, err = allot.ParseRate(p.GetRate())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	o.Expires = o.Created.Add(ttl)
	if err := s.fits(ctx, allot.Dynamic{Overrides: map[string][]allot.Override{o.Domain: {o.Override}}}); err != nil {
		return nil, grpcError(err)
	}
	if err := s.store.PutOverride(ctx, o, ttl); err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("override set", "domain", o.Domain, "limit", o.Limit, "match", o.Match.String(), "rate", p.GetRate(),
		"multiplier", o.Multiplier, "expires", o.Expires, "author", o.Author, "reason", o.Reason)
	return overrideProto(o), nil
}

// ListOverrides lists the overrides in force: the file's and etcd's.
func (s *Server) ListOverrides(ctx context.Context, req *allotv1.ListOverridesRequest) (*allotv1.ListOverridesResponse, error) {
	fl, err := s.store.Fleet(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &allotv1.ListOverridesResponse{}
	if cfg, _ := currentConfig(fl); cfg != nil {
		for _, d := range cfg.Domains {
			if req.GetDomain() == "" || d.Name == req.GetDomain() {
				for _, o := range d.Overrides {
					p := overrideProto(etcdstore.Override{Domain: d.Name, Override: o})
					p.FromFile = true
					resp.Overrides = append(resp.Overrides, p)
				}
			}
		}
	}
	now := s.opts.Now()
	for _, o := range fl.Overrides {
		if (req.GetDomain() == "" || o.Domain == req.GetDomain()) && o.Active(now) {
			resp.Overrides = append(resp.Overrides, overrideProto(o))
		}
	}
	return resp, nil
}

// DeleteOverride deletes an override kept in etcd.
func (s *Server) DeleteOverride(ctx context.Context, req *allotv1.DeleteOverrideRequest) (*allotv1.DeleteOverrideResponse, error) {
	author, err := s.writer(ctx, "")
	if err != nil {
		return nil, grpcError(err)
	}
	m := match(req.GetMatch())
	ok, err := s.store.DeleteOverride(ctx, req.GetDomain(), req.GetLimit(), m)
	if err == nil && !ok {
		err = fmt.Errorf("%w: no override of %s%s in domain %q (those of the limits file change with the file)",
			ErrNotFound, m, onLimit(req.GetLimit()), req.GetDomain())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("override deleted", "domain", req.GetDomain(), "limit", req.GetLimit(), "match", m.String(), "author", author)
	return &allotv1.DeleteOverrideResponse{}, nil
}

func onLimit(limit string) string {
	if limit == "" {
		return ""
	}
	return " on " + limit
}

// AssignPlan puts the requests a match selects on a plan.
func (s *Server) AssignPlan(ctx context.Context, req *allotv1.AssignPlanRequest) (*allotv1.PlanAssignment, error) {
	p := req.GetAssignment()
	author, err := s.writer(ctx, p.GetAuthor())
	if err != nil {
		return nil, grpcError(err)
	}
	a := etcdstore.PlanAssignment{Domain: p.GetDomain(), PlanAssignment: allot.PlanAssignment{Match: match(p.GetMatch()), Plan: p.GetPlan()},
		Author: author, Created: s.opts.Now().UTC()}
	switch {
	case a.Domain == "":
		err = fmt.Errorf("%w: no domain", ErrBadRequest)
	case len(a.Match) == 0:
		err = fmt.Errorf("%w: no key: name the requests to put on the plan, such as tenant=acme", ErrBadRequest)
	case a.Plan == "":
		err = fmt.Errorf("%w: no plan", ErrBadRequest)
	default:
		err = s.fits(ctx, allot.Dynamic{Assignments: map[string][]allot.PlanAssignment{a.Domain: {a.PlanAssignment}}})
	}
	if err == nil {
		err = s.store.PutPlanAssignment(ctx, a)
	}
	if err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("plan assigned", "domain", a.Domain, "match", a.Match.String(), "plan", a.Plan, "author", a.Author)
	return assignmentProto(a), nil
}

// UnassignPlan deletes a plan assignment kept in etcd.
func (s *Server) UnassignPlan(ctx context.Context, req *allotv1.UnassignPlanRequest) (*allotv1.UnassignPlanResponse, error) {
	author, err := s.writer(ctx, "")
	if err != nil {
		return nil, grpcError(err)
	}
	m := match(req.GetMatch())
	ok, err := s.store.DeletePlanAssignment(ctx, req.GetDomain(), m)
	if err == nil && !ok {
		err = fmt.Errorf("%w: no plan assignment of %s in domain %q (those of the limits file change with the file)", ErrNotFound, m, req.GetDomain())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("plan unassigned", "domain", req.GetDomain(), "match", m.String(), "author", author)
	return &allotv1.UnassignPlanResponse{}, nil
}

// ListPlans lists the plans of the configuration in force and the plan
// assignments: the file's and etcd's.
func (s *Server) ListPlans(ctx context.Context, req *allotv1.ListPlansRequest) (*allotv1.ListPlansResponse, error) {
	fl, err := s.store.Fleet(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &allotv1.ListPlansResponse{}
	want := func(d string) bool { return req.GetDomain() == "" || d == req.GetDomain() }
	if cfg, _ := currentConfig(fl); cfg != nil {
		for _, d := range cfg.Domains {
			if !want(d.Name) {
				continue
			}
			for _, name := range slices.Sorted(maps.Keys(d.Plans)) {
				p := d.Plans[name]
				pp := &allotv1.Plan{Domain: d.Name, Name: name, Multiplier: p.Multiplier, Floors: map[string]string{}}
				for l, r := range p.Floors {
					pp.Floors[l] = r.String()
				}
				resp.Plans = append(resp.Plans, pp)
			}
			for _, a := range d.Assignments {
				p := assignmentProto(etcdstore.PlanAssignment{Domain: d.Name, PlanAssignment: a})
				p.FromFile = true
				resp.Assignments = append(resp.Assignments, p)
			}
		}
	}
	for _, a := range fl.Assignments {
		if want(a.Domain) {
			resp.Assignments = append(resp.Assignments, assignmentProto(a))
		}
	}
	return resp, nil
}

func match(es []*allotv1.Entry) allot.Match {
	m := make(allot.Match, len(es))
	for i, e := range es {
		m[i] = allot.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	return m
}

func entries(m allot.Match) []*allotv1.Entry {
	out := make([]*allotv1.Entry, len(m))
	for i, e := range m {
		out[i] = &allotv1.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}

// timestamp converts t, leaving the zero time out.
func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func overrideProto(o etcdstore.Override) *allotv1.Override {
	p := &allotv1.Override{Domain: o.Domain, Limit: o.Limit, Match: entries(o.Match), Multiplier: o.Multiplier,
		Expires: timestamp(o.Expires), Reason: o.Reason, Author: o.Author, Created: timestamp(o.Created)}
	if o.Rate != (allot.Rate{}) {
		p.Rate = o.Rate.String()
	}
	return p
}

func assignmentProto(a etcdstore.PlanAssignment) *allotv1.PlanAssignment {
	return &allotv1.PlanAssignment{Domain: a.Domain, Match: entries(a.Match), Plan: a.Plan, Author: a.Author, Created: timestamp(a.Created)}
}
