package admin

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Authorization (docs/security.md, "Roles"): over TLS, every Admin
// method needs a role of its caller (methodRoles), from the identity of
// its verified certificate (Options.Authorization): reads need viewer,
// writes operator. A refusal is PERMISSION_DENIED, counted in
// allot_coordinator_authorization_refusals_total{role, caller}. In plain
// text (loopback only, --insecure) there is no certificate to take roles
// from: every caller may do everything, as before.

// methodRoles is the role each Admin method needs over TLS. A method
// missing here is refused to every caller over TLS: a new method must be
// given its role (TestEveryAdminMethodHasARole).
var methodRoles = map[string]tlsx.Roles{
	allotv1.Admin_GetConfig_FullMethodName:     tlsx.RoleViewer,
	allotv1.Admin_History_FullMethodName:       tlsx.RoleViewer,
	allotv1.Admin_ListOverrides_FullMethodName: tlsx.RoleViewer,
	allotv1.Admin_ListPlans_FullMethodName:     tlsx.RoleViewer,
	allotv1.Admin_Usage_FullMethodName:         tlsx.RoleViewer,
	allotv1.Admin_Status_FullMethodName:        tlsx.RoleViewer,

	allotv1.Admin_ApplyConfig_FullMethodName:    tlsx.RoleOperator,
	allotv1.Admin_Rollback_FullMethodName:       tlsx.RoleOperator,
	allotv1.Admin_UpdateLimit_FullMethodName:    tlsx.RoleOperator,
	allotv1.Admin_SetOverride_FullMethodName:    tlsx.RoleOperator,
	allotv1.Admin_DeleteOverride_FullMethodName: tlsx.RoleOperator,
	allotv1.Admin_AssignPlan_FullMethodName:     tlsx.RoleOperator,
	allotv1.Admin_UnassignPlan_FullMethodName:   tlsx.RoleOperator,
}

func newRefusals(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_coordinator_authorization_refusals_total",
		Help: "Admin calls over TLS refused for want of a role, by the role needed and the caller's kind (anonymous, gateway, client, operator, coordinator, instance, region).",
	}, []string{"role", "caller"})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

// callerRoles is who a call's caller is and what it may do; secured is
// false for a call that did not come over TLS (plain text, loopback
// only), whose caller may do everything.
func (s *Server) callerRoles(ctx context.Context) (c tlsx.CallerRoles, secured bool) {
	id, secured, err := tlsx.Caller(ctx)
	if !secured {
		return tlsx.CallerRoles{Roles: tlsx.AllRoles}, false
	}
	if err != nil {
		id = tlsx.Identity{} // no identity: the anonymous roles
	}
	return s.policy.Of(id), true
}

// authorize checks that ctx's caller has the role method needs.
func (s *Server) authorize(ctx context.Context, method string) error {
	c, secured := s.callerRoles(ctx)
	if !secured {
		return nil
	}
	need, ok := methodRoles[method]
	if !ok {
		need = tlsx.AllRoles
	}
	if c.Roles.Has(need) {
		return nil
	}
	s.refusals.WithLabelValues(need.String(), c.Kind()).Inc()
	who := "a certificate that names no allot identity"
	if !c.Anonymous() {
		who = c.Identity.URI
	}
	return status.Errorf(codes.PermissionDenied, "%s needs the %s role; %s has %s", method, need, who, c.Roles)
}

// Register registers the Admin service on gs, every method authorized
// (methodRoles) after gs's own interceptors.
func (s *Server) Register(gs grpc.ServiceRegistrar) {
	d := allotv1.Admin_ServiceDesc
	d.Methods = make([]grpc.MethodDesc, len(allotv1.Admin_ServiceDesc.Methods))
	for i, m := range allotv1.Admin_ServiceDesc.Methods {
		full, h := "/"+d.ServiceName+"/"+m.MethodName, m.Handler
		d.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, dec, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
				checked := func(ctx context.Context, req any) (any, error) {
					if err := s.authorize(ctx, full); err != nil {
						return nil, err
					}
					return next(ctx, req)
				}
				if ic == nil {
					return checked(ctx, req)
				}
				return ic(ctx, req, info, checked)
			})
		}}
	}
	if len(d.Streams) > 0 {
		panic(fmt.Sprintf("admin: %d streams of allot.v1.Admin without authorization", len(d.Streams)))
	}
	gs.RegisterService(&d, s)
}

// MethodRole is the role an Admin method (its full name) needs over TLS;
// none for a method that is not in the table (refused to all).
func MethodRole(fullMethod string) tlsx.Roles { return methodRoles[fullMethod] }
