// Package admin serves allot.v1.Admin for the coordinator: the operators'
// API that allotctl is built on. Everything it changes lives in etcd
// (coordinator/etcdstore), where the regions follow it
// (regional/configwatch):
//
//   - The limits configuration is versioned: ApplyConfig, Rollback and
//     UpdateLimit (shadow on/off, split/shared) each store a new version
//     and keep the earlier ones; a rollback is a new version with an
//     earlier one's YAML, so history only grows.
//   - Overrides are etcd keys bound to leases: they expire by themselves.
//   - Plan assignments are etcd keys too, merged after the file's.
//
// A bad configuration never gets stored: every write parses and validates
// the result (allot.ParseConfig, plan floors included) and checks that
// the fleet's overrides and plan assignments still fit it
// (allot.Config.WithDynamic). Errors come back as INVALID_ARGUMENT, one
// problem a line, FILE:LINE: FIELD: MSG.
//
// Over TLS every method needs a role of its caller (authz.go): reads
// (GetConfig, History, ListOverrides, ListPlans, Usage, Status) viewer,
// writes operator; PERMISSION_DENIED otherwise, counted in
// allot_coordinator_authorization_refusals_total{role, caller}. The roles
// are those of the certificate's identity (an operator's certificate,
// spiffe://DOMAIN/operator/NAME, reads and writes; a coordinator's reads)
// plus Options.Authorization's grants, operator implying viewer. The
// author recorded in the history, the override or the plan assignment is
// the certificate's NAME (else its identity's URI), whatever the request
// says. In plain text (loopback only) every caller may do everything and
// the request's author is recorded, as before.
//
// Usage and Status fan out to every regional enforcer registered in etcd
// (etcdstore.Store.Register), each of which serves the read-only part of
// the same service (regional/server), and add what etcd knows: the
// leader of each domain and the persisted shares.
//
// A Server is safe for concurrent use; it holds no state besides its
// connections to the regions.
//
//	srv := admin.New(admin.Options{Store: store, Logger: log})
//	defer srv.Close()
//	srv.Register(grpcServer)
package admin
