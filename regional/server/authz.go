package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional"
)

// Authorization: every gRPC method a Service registers needs one role
// (methodRoles), checked after the server's interceptors and before the
// method runs; the HTTP API's routes the same (httpRoles). A caller's
// roles come from Options.Authorization (tlsx.Policy): its certificate's
// identity, else the anonymous roles. Inside a method, what depends on
// the request is checked there: Envoy's negative hits and limit overrides
// need the refund role and a domain that allows them (envoy.go), and a
// Lease returns at most what the caller was granted (lease.go).
//
// A refusal is PERMISSION_DENIED (gRPC) or 403 (HTTP), counted in
// allot_regional_authorization_refusals_total{role, caller, reason}.

// methodRoles is the role each method of the services a Service registers
// needs. A method missing here is refused to every caller: a new method
// must be given its role.
var methodRoles = map[string]tlsx.Roles{
	"/allot.v1.RateLimiter/Check":   tlsx.RoleCheck,
	"/allot.v1.RateLimiter/Reserve": tlsx.RoleCheck,
	"/allot.v1.RateLimiter/Settle":  tlsx.RoleCheck,
	"/allot.v1.RateLimiter/Release": tlsx.RoleCheck,
	"/allot.v1.RateLimiter/Lease":   tlsx.RoleGateway,

	"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit": tlsx.RoleCheck,
	// RLQS: Envoy decides in its own process on buckets allot sizes, a
	// lease in all but name.
	"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas": tlsx.RoleGateway,

	// A region's Admin answers Usage and Status; the others are
	// UNIMPLEMENTED here (the coordinator serves them) and keep the role
	// they would need.
	"/allot.v1.Admin/Usage":          tlsx.RoleViewer,
	"/allot.v1.Admin/Status":         tlsx.RoleViewer,
	"/allot.v1.Admin/GetConfig":      tlsx.RoleViewer,
	"/allot.v1.Admin/History":        tlsx.RoleViewer,
	"/allot.v1.Admin/ListOverrides":  tlsx.RoleViewer,
	"/allot.v1.Admin/ListPlans":      tlsx.RoleViewer,
	"/allot.v1.Admin/ApplyConfig":    tlsx.RoleOperator,
	"/allot.v1.Admin/Rollback":       tlsx.RoleOperator,
	"/allot.v1.Admin/UpdateLimit":    tlsx.RoleOperator,
	"/allot.v1.Admin/SetOverride":    tlsx.RoleOperator,
	"/allot.v1.Admin/DeleteOverride": tlsx.RoleOperator,
	"/allot.v1.Admin/AssignPlan":     tlsx.RoleOperator,
	"/allot.v1.Admin/UnassignPlan":   tlsx.RoleOperator,
}

// httpRoles is the role of each HTTP route that needs one; /healthz,
// /readyz, /metrics and the status page (which shows no keys) need none.
var httpRoles = map[string]tlsx.Roles{
	"POST /v1/check":   tlsx.RoleCheck,
	"POST /v1/reserve": tlsx.RoleCheck,
	"POST /v1/settle":  tlsx.RoleCheck,
	"POST /v1/release": tlsx.RoleCheck,
}

// authz holds a Service's policy and its refusal counter.
type authz struct {
	policy   *tlsx.Policy // nil: every caller has every role
	refusals *prometheus.CounterVec
}

func newAuthz(p *tlsx.Policy, reg prometheus.Registerer) *authz {
	a := &authz{policy: p, refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_regional_authorization_refusals_total",
		Help: "Calls refused for want of a role (reason role) or because the domain does not allow what the call asks (reason domain), by the role needed and the caller's kind (anonymous, gateway, client, operator, coordinator, instance, region).",
	}, []string{"role", "caller", "reason"})}
	if reg != nil {
		reg.MustRegister(a.refusals)
	}
	return a
}

type callerKey struct{}

// of returns c's caller as the policy sees it, from a certificate's
// identity when there is one.
func (a *authz) of(id tlsx.Identity) tlsx.CallerRoles {
	if a.policy == nil {
		return tlsx.CallerRoles{Identity: id, Roles: tlsx.AllRoles}
	}
	return a.policy.Of(id)
}

// caller is the caller of a call that passed authorize (its context
// carries it); for any other context, the one its peer's certificate
// names.
func (s *Service) caller(ctx context.Context) tlsx.CallerRoles {
	if c, ok := ctx.Value(callerKey{}).(tlsx.CallerRoles); ok {
		return c
	}
	id, err := tlsx.PeerIdentity(ctx)
	if err != nil {
		id = tlsx.Identity{}
	}
	return s.authz.of(id)
}

// refuse counts a refusal and returns its error, which wraps
// ErrPermissionDenied.
func (s *Service) refuse(c tlsx.CallerRoles, need tlsx.Roles, reason, what string) error {
	s.authz.refusals.WithLabelValues(need.String(), c.Kind(), reason).Inc()
	who := "an anonymous caller (--anonymous-roles)"
	if !c.Anonymous() {
		who = c.Identity.URI
	}
	if reason == "domain" {
		return fmt.Errorf("%w: %s", ErrPermissionDenied, what)
	}
	return fmt.Errorf("%w: %s needs the %s role; %s has %s", ErrPermissionDenied, what, need, who, c.Roles)
}

// authorize checks that ctx's caller has the role method needs, and
// returns ctx carrying the caller.
func (s *Service) authorize(ctx context.Context, method string) (context.Context, error) {
	c := s.caller(ctx)
	need, ok := methodRoles[method]
	if !ok {
		return nil, s.refuse(c, tlsx.AllRoles, "role", method+" (a method without a role)")
	}
	if !c.Roles.Has(need) {
		return nil, s.refuse(c, need, "role", method)
	}
	return context.WithValue(ctx, callerKey{}, c), nil
}

// authorizing registers services with every method authorized.
type authorizing struct {
	gs grpc.ServiceRegistrar
	s  *Service
}

func (a authorizing) RegisterService(desc *grpc.ServiceDesc, impl any) {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		full, h := "/"+desc.ServiceName+"/"+m.MethodName, m.Handler
		d.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			// Never nil: a generated handler given no interceptor calls
			// the method directly.
			return h(srv, ctx, dec, a.s.unaryAuthorizer(full, ic))
		}}
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, st := range desc.Streams {
		full, h := "/"+desc.ServiceName+"/"+st.StreamName, st.Handler
		d.Streams[i] = st
		d.Streams[i].Handler = func(srv any, ss grpc.ServerStream) error {
			ctx, err := a.s.authorize(ss.Context(), full)
			if err != nil {
				return grpcError(err)
			}
			return h(srv, callerStream{ss, ctx})
		}
	}
	a.gs.RegisterService(&d, impl)
}

// unaryAuthorizer runs the server's interceptors (ic; nil: none), then
// the check, then the method.
func (s *Service) unaryAuthorizer(method string, ic grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		next := func(ctx context.Context, req any) (any, error) {
			ctx, err := s.authorize(ctx, method)
			if err != nil {
				return nil, grpcError(err)
			}
			return h(ctx, req)
		}
		if ic == nil {
			return next(ctx, req)
		}
		return ic(ctx, req, info, next)
	}
}

// callerStream is a stream whose context carries its caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c callerStream) Context() context.Context { return c.ctx }

// httpAuthorized serves h to callers with the role route needs.
func (s *Service) httpAuthorized(route string, h http.HandlerFunc) (string, http.HandlerFunc) {
	need, ok := httpRoles[route]
	if !ok {
		panic("server: HTTP route without a role: " + route)
	}
	return route, func(w http.ResponseWriter, r *http.Request) {
		id, err := tlsx.RequestIdentity(r)
		if err != nil {
			id = tlsx.Identity{}
		}
		c := s.authz.of(id)
		if !c.Roles.Has(need) {
			err := s.refuse(c, need, "role", route)
			writeError(w, httpStatus(err), err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	}
}

// allowRefunds refuses Envoy's negative hits and limit overrides unless
// the caller has the refund role and the domain allows them
// (allow_refunds). d is nil for an unknown domain, which the engine
// reports.
func (s *Service) allowRefunds(ctx context.Context, d *allot.Domain, items []regional.Item, negative []bool) error {
	what := ""
	for i := 0; i < len(items) && what == ""; i++ {
		switch {
		case negative[i]:
			what = fmt.Sprintf("descriptor %d: is_negative_hits", i)
		case items[i].Limit != nil:
			what = fmt.Sprintf("descriptor %d: a limit override", i)
		}
	}
	if what == "" || d == nil {
		return nil
	}
	c := s.caller(ctx)
	if !c.Roles.Has(tlsx.RoleRefund) {
		return s.refuse(c, tlsx.RoleRefund, "role", what)
	}
	if !d.AllowRefunds {
		return s.refuse(c, tlsx.RoleRefund, "domain", fmt.Sprintf("%s: domain %q does not allow refunds or limit overrides (allow_refunds: true)", what, d.Name))
	}
	return nil
}
