package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
)

// envoyT0 is the instant the Envoy tests decide at: the start of every
// window, so that windows are whole.
var envoyT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// envoyConfig is written for Envoy's rate limit service.
const envoyConfig = `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unlimited: true}
  - key: path
    value: /api/*
    rate_limit: {name: api, unit: second, requests_per_unit: 2}
  - key: path
    rate_limit: {name: paths, unit: hour, unit_multiplier: 2, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: ip
    value: 10.0.0.1 # listed: not limited
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit: {name: replacing, replaces: [{name: specific}], unit: second, requests_per_unit: 10}
`

// newEnvoyService serves the domains of a config file on loopback and
// returns the service and a client of Envoy's API.
func newEnvoyService(t *testing.T, name string, data []byte) (*Service, rlsv3.RateLimitServiceClient) {
	t.Helper()
	cfg, err := allot.ParseConfig(name, data)
	if err != nil {
		t.Fatal(err)
	}
	// These tests are of Envoy's semantics, negative hits and overrides
	// included; who may send those is authz_test.go's. Envoy's file
	// format has no allow_refunds.
	for _, d := range cfg.Domains {
		d.AllowRefunds = true
	}
	s := New(regional.New(cfg, regional.Options{}), Options{
		Region: "test", Now: func() time.Time { return envoyT0 }, Registry: prometheus.NewRegistry(),
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return s, rlsv3.NewRateLimitServiceClient(cc)
}

// rl builds a descriptor from key, value pairs.
func rl(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hitsOf sets a descriptor's own hits_addend.
func hitsOf(n uint64, d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// refund makes a descriptor's hits negative.
func refund(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

// override gives a descriptor its own limit; mult 0 leaves unit_multiplier unset.
func override(n uint32, unit typev3.RateLimitUnit, mult uint32, d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	if mult != 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

func req(domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

// render formats a response as "OVERALL | STATUS | …" with each status's
// limit, what is left and the time until reset, then the values of the
// RateLimit headers in brackets.
func render(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, st := range r.GetStatuses() {
		b.WriteString(" | " + st.GetCode().String())
		if l := st.GetCurrentLimit(); l != nil {
			fmt.Fprintf(&b, " %s %d/%s", l.GetName(), l.GetRequestsPerUnit(), l.GetUnit())
			if m := l.GetUnitMultiplier(); m != nil {
				fmt.Fprintf(&b, "×%d", m.GetValue())
			}
			fmt.Fprintf(&b, " left %d reset %v", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
		} else if st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
			fmt.Fprintf(&b, " left %d reset %v", st.GetLimitRemaining(), st.GetDurationUntilReset())
		}
	}
	if hs := r.GetResponseHeadersToAdd(); len(hs) > 0 {
		var vs []string
		for _, h := range hs {
			vs = append(vs, h.GetValue())
		}
		b.WriteString(" [" + strings.Join(vs, " ") + "]")
	}
	return b.String()
}

// TestEnvoyShouldRateLimit runs requests in order against one service
// and checks every answer.
func TestEnvoyShouldRateLimit(t *testing.T) {
	_, c := newEnvoyService(t, "envoy.yaml", []byte(envoyConfig))
	steps := []struct {
		what string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"a wildcard value", req("edge", 0, rl("user", "a")),
			"OK | OK user 3/MINUTE left 2 reset 2m0s [3 2 120]"},
		{"request hits_addend", req("edge", 2, rl("user", "a")),
			"OK | OK user 3/MINUTE left 0 reset 2m0s [3 0 120]"},
		{"over the limit", req("edge", 0, rl("user", "a")),
			"OVER_LIMIT | OVER_LIMIT user 3/MINUTE left 0 reset 1m20s [3 0 80]"},
		{"descriptor hits_addend 0 checks only", req("edge", 5, hitsOf(0, rl("user", "a"))),
			"OK | OK user 3/MINUTE left 0 reset 2m0s [3 0 120]"},
		{"negative hits give back", req("edge", 0, refund(rl("user", "a"))),
			"OK | OK user 3/MINUTE left 1 reset 2m0s [3 1 120]"},
		{"after the refund", req("edge", 0, rl("user", "a")),
			"OK | OK user 3/MINUTE left 0 reset 2m0s [3 0 120]"},
		{"descriptor hits_addend overrides the request's", req("edge", 3, hitsOf(1, rl("user", "b"))),
			"OK | OK user 3/MINUTE left 2 reset 2m0s [3 2 120]"},
		{"unlimited", req("edge", 0, rl("user", "vip"), rl("user", "vip")),
			"OK | OK left 4294967295 reset <nil> | OK left 4294967295 reset <nil>"},
		{"a prefix beats any value", req("edge", 0, rl("path", "/api/x"), rl("path", "/docs")),
			"OK | OK api 2/SECOND left 1 reset 2s | OK paths 5/HOUR×2 left 4 reset 4h0m0s [2 1 2]"},
		{"shadow mode: first", req("edge", 0, rl("trial", "t")),
			"OK | OK trial 1/MINUTE left 0 reset 2m0s [1 0 120]"},
		{"shadow mode: over but allowed", req("edge", 0, rl("trial", "t")),
			"OK | OK trial 1/MINUTE left 0 reset 2m0s [1 0 120]"},
		{"a listed value has no limit", req("edge", 0, rl("ip", "10.0.0.1"), rl("ip", "10.0.0.2")),
			"OK | OK left 4294967295 reset <nil> | OK ip 2/DAY left 1 reset 48h0m0s [2 1 172800]"},
		{"a descriptor that matches nothing", req("edge", 0, rl("nothing", "x"), rl("user", "a", "path", "/api/x")),
			"OK | OK | OK"},
		{"the limit to be replaced, alone", req("edge", 0, rl("key_1", "value_1", "user", "bk")),
			"OK | OK specific 5/SECOND left 4 reset 2s [5 4 2]"},
		{"replaces", req("edge", 0, rl("key_1", "value_1", "user", "bk"), rl("key_2", "value_2", "user", "bk")),
			"OK | OK | OK replacing 10/SECOND left 9 reset 2s [10 9 2]"},
		{"the replaced limit was not charged", req("edge", 0, rl("key_1", "value_1", "user", "bk")),
			"OK | OK specific 5/SECOND left 3 reset 2s [5 3 2]"},
		{"limit override", req("edge", 0, override(1, typev3.RateLimitUnit_SECOND, 0, rl("user", "c"))),
			"OK | OK user 1/SECOND left 0 reset 2s [1 0 2]"},
		{"limit override: over", req("edge", 0, override(1, typev3.RateLimitUnit_SECOND, 0, rl("user", "c"))),
			"OVER_LIMIT | OVER_LIMIT user 1/SECOND left 0 reset 2s [1 0 2]"},
		{"limit override with unit_multiplier", req("edge", 0, override(2, typev3.RateLimitUnit_MONTH, 3, rl("user", "d"))),
			"OK | OK user 2/MONTH×3 left 1 reset 3744h0m0s [2 1 13478400]"},
		{"limit override of a descriptor that matches nothing", req("edge", 0, override(1, typev3.RateLimitUnit_HOUR, 0, rl("nothing", "y"))),
			"OK | OK descriptor-limit 1/HOUR left 0 reset 2h0m0s [1 0 7200]"},
		{"exhaust /api/y", req("edge", 2, rl("path", "/api/y")),
			"OK | OK api 2/SECOND left 0 reset 2s [2 0 2]"},
		{"one rejection rejects the request and charges nothing", req("edge", 0, rl("user", "e"), rl("path", "/api/y")),
			"OVER_LIMIT | OK user 3/MINUTE left 3 reset 0s | OVER_LIMIT api 2/SECOND left 0 reset 1.5s [2 0 2]"},
		{"user=e was not charged", req("edge", 0, hitsOf(0, rl("user", "e"))),
			"OK | OK user 3/MINUTE left 3 reset 0s [3 3 0]"},
		{"hits above what the limit admits", req("edge", 0, rl("user", "f"), hitsOf(4, rl("path", "/api/z"))),
			"OVER_LIMIT | OK user 3/MINUTE left 3 reset 0s | OVER_LIMIT api 2/SECOND left 2 reset 0s [2 2 0]"},
		{"user=f and /api/z were not charged", req("edge", 0, rl("user", "f"), rl("path", "/api/z")),
			"OK | OK user 3/MINUTE left 2 reset 2m0s | OK api 2/SECOND left 1 reset 2s [2 1 2]"},
	}
	for _, s := range steps {
		resp, err := c.ShouldRateLimit(context.Background(), s.req)
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if got := render(resp); got != s.want {
			t.Errorf("%s:\n got: %s\nwant: %s", s.what, got, s.want)
		}
	}
}

func TestEnvoyResponseHeaders(t *testing.T) {
	_, c := newEnvoyService(t, "envoy.yaml", []byte(envoyConfig))
	resp, err := c.ShouldRateLimit(context.Background(), req("edge", 0, rl("user", "a"), rl("path", "/docs")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		got = append(got, h.GetKey()+": "+h.GetValue())
	}
	// user=a has 2 left, path=/docs 4: the headers answer for user=a.
	if want := "RateLimit-Limit: 3, RateLimit-Remaining: 2, RateLimit-Reset: 120"; strings.Join(got, ", ") != want {
		t.Errorf("headers %q, want %s", got, want)
	}
	if hs := resp.GetRequestHeadersToAdd(); len(hs) != 0 {
		t.Errorf("request headers %v, want none", hs)
	}
}

func TestEnvoyBadInputChargesNothing(t *testing.T) {
	s, c := newEnvoyService(t, "envoy.yaml", []byte(envoyConfig))
	ok := rl("user", "z")
	many := make([]*ratelimitv3.RateLimitDescriptor, regional.MaxItems+1)
	for i := range many {
		many[i] = rl("user", "z")
	}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{"unknown domain", req("nope", 0, ok), codes.NotFound, `regional: unknown domain "nope"`},
		{"empty domain", req("", 0, ok), codes.InvalidArgument, "server: bad request: empty domain"},
		{"no descriptors", req("edge", 0), codes.InvalidArgument, "server: bad request: no descriptors"},
		{"too many descriptors", req("edge", 0, many...), codes.InvalidArgument, "server: bad request: 65 descriptors, at most 64"},
		{"descriptor without entries", req("edge", 0, ok, rl()), codes.InvalidArgument, "server: bad request: descriptor 1 has no entries"},
		{"empty key", req("edge", 0, ok, rl("", "x")), codes.InvalidArgument,
			"regional: bad descriptor: descriptor 1: entry 0 has an empty key"},
		{"huge hits_addend", req("edge", 0, ok, hitsOf(1<<60, rl("user", "y"))), codes.InvalidArgument,
			"regional: bad cost: descriptor 1: hits_addend 1152921504606846976, at most 1125899906842624"},
		{"override without unit", req("edge", 0, ok, override(1, typev3.RateLimitUnit_UNKNOWN, 0, rl("user", "y"))), codes.InvalidArgument,
			"regional: bad descriptor: descriptor 1: limit: unit UNKNOWN, want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR"},
		{"override of 0", req("edge", 0, ok, override(0, typev3.RateLimitUnit_SECOND, 0, rl("user", "y"))), codes.InvalidArgument,
			"regional: bad descriptor: descriptor 1: limit: amount must be positive"},
		{"override over 366 days", req("edge", 0, ok, override(1, typev3.RateLimitUnit_YEAR, 2, rl("user", "y"))), codes.InvalidArgument,
			"regional: bad descriptor: descriptor 1: limit: unit_multiplier 2, want [1, 1] (a period of at most 366 days)"},
		{"a bad refund next to a check", req("edge", 0, ok, refund(rl("", "x"))), codes.InvalidArgument,
			"regional: bad descriptor: descriptor 1: entry 0 has an empty key"},
	}
	for _, tc := range tests {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		if st, _ := status.FromError(err); st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%s: got %v, want %v %q", tc.name, err, tc.code, tc.msg)
		}
	}
	resp, err := c.ShouldRateLimit(context.Background(), req("edge", 0, hitsOf(0, rl("user", "z"))))
	if err != nil || render(resp) != "OK | OK user 3/MINUTE left 3 reset 0s [3 3 0]" {
		t.Errorf("after the refused requests: %s, %v; want user=z untouched", render(resp), err)
	}
	m := s.metrics.errors
	if got := counterValue(m.WithLabelValues("invalid_argument")) + counterValue(m.WithLabelValues("unknown_domain")); got != float64(len(tests)) {
		t.Errorf("errors counted: %v, want %d", got, len(tests))
	}
}

func TestEnvoyMetrics(t *testing.T) {
	s, c := newEnvoyService(t, "envoy.yaml", []byte(envoyConfig))
	for range 3 {
		if _, err := c.ShouldRateLimit(context.Background(), req("edge", 0, rl("trial", "t"), rl("path", "/api/x"))); err != nil {
			t.Fatal(err)
		}
	}
	d := s.metrics.decisions
	for _, tc := range []struct {
		limit, result string
		want          float64
	}{
		{"trial", "allowed", 1}, {"trial", "shadow_rejected", 2}, {"api", "allowed", 2}, {"api", "rejected", 1},
	} {
		if got := counterValue(d.WithLabelValues("edge", tc.limit, tc.result, "local")); got != tc.want {
			t.Errorf("decisions %s %s = %v, want %v", tc.limit, tc.result, got, tc.want)
		}
	}
	if got := counterValue(s.metrics.shadow.WithLabelValues("edge", "trial")); got != 2 {
		t.Errorf("shadow rejections = %v, want 2", got)
	}
}

// TestEnvoyAllotDomain checks Envoy's API on a domain in allot's own
// format: every limit that matches a descriptor counts, and the status
// reports the one that decides.
func TestEnvoyAllotDomain(t *testing.T) {
	_, c := newEnvoyService(t, "limits.yaml", []byte(`
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5}
  - {name: per-tenant, match: {tenant: "*"}, rate: 1000/1m}
  - {name: per-user-chat, match: {user: "*", route: /v1/chat}, rate: 60/1m, algorithm: gcra}
`))
	// All three match; per-user has the least left.
	chat := rl("tenant", "acme", "user", "42", "route", "/v1/chat")
	want := []string{
		1: "OK | OK per-user 10/SECOND left 4 reset 100ms [10 4 1]",
		5: "OK | OK per-user 10/SECOND left 0 reset 500ms [10 0 1]",
		6: "OVER_LIMIT | OVER_LIMIT per-user 10/SECOND left 0 reset 100ms [10 0 1]",
	}
	for i := 1; i < len(want); i++ {
		resp, err := c.ShouldRateLimit(context.Background(), req("api", 0, chat))
		if err != nil {
			t.Fatal(err)
		}
		if got := render(resp); want[i] != "" && got != want[i] {
			t.Errorf("request %d:\n got: %s\nwant: %s", i, got, want[i])
		}
	}
}

// envoyBootstrap reads deploy/envoy/envoy.yaml as Envoy would and
// validates it against Envoy's API.
func envoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile("../../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// TestEnvoyDeployExample checks deploy/envoy: the bootstrap is valid, its
// rate limit filter calls allot, and the descriptors its actions make are
// limited both by deploy/examples/limits.yaml and by
// deploy/envoy/ratelimit-config.yaml.
func TestEnvoyDeployExample(t *testing.T) {
	b := envoyBootstrap(t)
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var filter ratelimitfilterv3.RateLimit
	var mutation headermutationv3.HeaderMutation
	for _, f := range hcm.GetHttpFilters() {
		switch f.GetName() {
		case "envoy.filters.http.ratelimit":
			if err := f.GetTypedConfig().UnmarshalTo(&filter); err != nil {
				t.Fatal(err)
			}
		case "envoy.filters.http.header_mutation":
			if err := f.GetTypedConfig().UnmarshalTo(&mutation); err != nil {
				t.Fatal(err)
			}
		}
	}
	cluster := filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if filter.GetDomain() != "api" || filter.GetFailureModeDeny() || cluster != "allot" ||
		filter.GetEnableXRatelimitHeaders() != ratelimitfilterv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("rate limit filter %v", &filter)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress(); c.GetName() == cluster &&
			(addr.GetAddress() != "127.0.0.1" || addr.GetPortValue() != 8081) {
			t.Errorf("cluster allot at %v, want 127.0.0.1:8081", addr)
		}
	}
	if m := mutation.GetMutations().GetRequestMutations(); len(m) != 1 || m[0].GetAppend().GetHeader().GetKey() != "x-client-ip" {
		t.Errorf("header mutation %v, want x-client-ip set", &mutation)
	}

	vh := hcm.GetRouteConfig().GetVirtualHosts()[0]
	headers := map[string]string{"x-tenant-id": "acme", "x-user-id": "42", "x-client-ip": "192.0.2.1"}
	for _, tc := range []struct {
		path    string
		headers []string // of headers, those the request has
		want    string   // the descriptor the actions make
	}{
		{"/", []string{"x-user-id"}, "user=42"},
		{"/v1/models", []string{"x-tenant-id", "x-user-id"}, "tenant=acme,user=42"},
		{"/v1/chat/completions", []string{"x-tenant-id", "x-user-id"}, "tenant=acme,user=42,route=/v1/chat"},
		{"/login", []string{"x-client-ip"}, "route=/login,ip=192.0.2.1"},
	} {
		has := map[string]string{}
		for _, h := range tc.headers {
			has[h] = headers[h]
		}
		d := envoyDescriptor(t, vh, tc.path, has)
		if got := allotDescriptor(d).String(); got != tc.want {
			t.Errorf("%s %v: descriptor %s, want %s", tc.path, tc.headers, got, tc.want)
			continue
		}
		for _, cfg := range []struct {
			name string
			data []byte
		}{
			{examples.LimitsName, examples.LimitsYAML},
			{"ratelimit-config.yaml", mustRead(t, "../../deploy/envoy/ratelimit-config.yaml")},
		} {
			_, c := newEnvoyService(t, cfg.name, cfg.data)
			resp, err := c.ShouldRateLimit(context.Background(), req(filter.GetDomain(), 0, d))
			if err != nil || resp.GetStatuses()[0].GetCurrentLimit() == nil {
				t.Errorf("%s: %s gives %s, %v; want a limit", cfg.name, tc.want, render(resp), err)
			}
		}
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func allotDescriptor(d *ratelimitv3.RateLimitDescriptor) allot.Descriptor {
	var out allot.Descriptor
	for _, e := range d.GetEntries() {
		out = append(out, allot.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return out
}

// envoyDescriptor makes the descriptor that Envoy makes for a request to
// path with headers: the first route that matches, its rate_limits or
// else the virtual host's, and the request_headers and generic_key
// actions, which are the ones the example uses.
func envoyDescriptor(t *testing.T, vh *routev3.VirtualHost, path string, headers map[string]string) *ratelimitv3.RateLimitDescriptor {
	t.Helper()
	limits := vh.GetRateLimits()
	for _, r := range vh.GetRoutes() {
		if m := r.GetMatch(); m.GetPath() == path || m.GetPrefix() != "" && strings.HasPrefix(path, m.GetPrefix()) {
			if rs := r.GetRoute().GetRateLimits(); len(rs) > 0 {
				limits = rs
			}
			break
		}
	}
	if len(limits) != 1 {
		t.Fatalf("%s: %d rate_limits, want 1", path, len(limits))
	}
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, a := range limits[0].GetActions() {
		var key, value string
		switch {
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			v, ok := headers[h.GetHeaderName()]
			if !ok && h.GetSkipIfAbsent() {
				continue
			}
			if !ok {
				t.Fatalf("%s: header %s missing: Envoy would send no descriptor", path, h.GetHeaderName())
			}
			key, value = h.GetDescriptorKey(), v
		case a.GetGenericKey() != nil:
			key, value = a.GetGenericKey().GetDescriptorKey(), a.GetGenericKey().GetDescriptorValue()
		default:
			t.Fatalf("%s: action %v is not emulated", path, a)
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
	}
	return d
}
