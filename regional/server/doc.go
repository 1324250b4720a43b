// Package server is the regional enforcer's edge: it serves the engine
// (package regional) to gateways over gRPC (allot.v1.RateLimiter and
// Envoy's envoy.service.ratelimit.v3.RateLimitService) and HTTP
// (POST /v1/check with the standard rate limit headers), and exports
// Prometheus metrics. The headers tell what this instance enforces for
// the key, the region's share of its burst (ratelimit.go); the HTTP
// bodies are the gRPC messages in the proto3 JSON mapping with integers
// as JSON numbers (internal/wirejson).
//
// A Service owns no listener: the caller registers it on a *grpc.Server
// and mounts its HTTP handler, so that one process may serve several
// regions (allot dev) or one (allot regional).
//
//	svc := server.New(engine, server.Options{Region: "us-east", Registry: reg})
//	gs := grpc.NewServer()
//	svc.RegisterGRPC(gs)
//	go gs.Serve(grpcListener)
//	go http.Serve(httpListener, svc.HTTPHandler())
//
// With Options.Enforcer, domains that have leased or exact limits are
// decided with the regional store (regional.Enforcer); the others, and
// every domain without it, in the engine alone.
//
// LLM token budgets (reserve.go): Reserve, Settle and Release on gRPC and
// POST /v1/reserve, /v1/settle, /v1/release on HTTP, with OpenAI's
// x-ratelimit-{limit,remaining,reset}-{tokens,requests} headers beside
// the standard ones. RunReservations expires unsettled reservations.
//
// Every method of a Service is safe for concurrent use. The wall clock is
// read here, at the edge, and passed to the engine.
//
// Errors map to gRPC codes and HTTP statuses in one table (errors.go):
// bad input is INVALID_ARGUMENT / 400, an unknown domain NOT_FOUND / 404,
// and nothing is charged when an error is returned.
package server
