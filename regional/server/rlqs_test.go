package server

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// rlqsConfig has a request limit per route (90/s, burst 90) and per
// tenant (600/1m = 10/s, burst 600), a shadow limit, a token limit (not
// for RLQS), and an Envoy-format domain with an unlimited value.
const rlqsConfig = `
domain: edge
limits:
  - {name: per-route, match: {route: "*"}, rate: 90/s}
  - {name: per-tenant, match: {tenant: "*"}, rate: 600/1m}
  - {name: trial, match: {trial: "*"}, rate: 1/s, shadow: true}
  - {name: llm-tokens, match: {model: "*"}, unit: tokens, rate: 1000/1m}
---
domain: envoy
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: user
    value: vip
    rate_limit: {unlimited: true}
`

// rlqsClock is a settable clock.
type rlqsClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *rlqsClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *rlqsClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func parseRLQSConfig(t testing.TB, data string) *allot.Config {
	t.Helper()
	cfg, err := allot.ParseConfig("rlqs.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// rlqsEnv is a Service serving RLQS on loopback.
type rlqsEnv struct {
	s     *Service
	q     *RLQS // nil when served through RegisterGRPC
	clock *rlqsClock
	reg   *prometheus.Registry
	gs    *grpc.Server
	cc    *grpc.ClientConn
}

// newRLQSEnv serves rlqsConfig with opts; through RegisterGRPC, with the
// default options, when viaRegisterGRPC.
func newRLQSEnv(t testing.TB, opts RLQSOptions, viaRegisterGRPC bool) *rlqsEnv {
	t.Helper()
	env := &rlqsEnv{clock: &rlqsClock{t: t0}, reg: prometheus.NewRegistry()}
	env.s = New(regional.New(parseRLQSConfig(t, rlqsConfig), regional.Options{}), Options{
		Region: "test", Now: env.clock.now, Registry: prometheus.NewRegistry(),
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	env.gs = gs
	if viaRegisterGRPC {
		env.s.RegisterGRPC(gs)
	} else {
		opts.Registry = env.reg
		env.q = NewRLQS(env.s, opts)
		env.q.Register(gs)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	env.cc, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.cc.Close() })
	return env
}

// remaining is what the engine would still admit on desc's limit name.
func (env *rlqsEnv) remaining(t *testing.T, domain, limit string, kv ...string) int64 {
	t.Helper()
	var dec allot.Decision
	if err := env.s.engine.Check(env.clock.now(), domain, descOf(kv...), 0, &dec); err != nil {
		t.Fatal(err)
	}
	for _, st := range dec.Statuses {
		if st.Name == limit {
			return st.Remaining
		}
	}
	t.Fatalf("no status of %s in %+v", limit, dec.Statuses)
	return 0
}

func descOf(kv ...string) allot.Descriptor {
	var d allot.Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d = append(d, allot.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// envoy is a simulated Envoy: one RLQS stream, and every action it was
// sent. Its methods are called from the test's goroutine.
type envoy struct {
	t       testing.TB
	name    string
	stream  grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel  context.CancelFunc
	resps   chan *rlqsv3.RateLimitQuotaResponse // filled by the reader
	done    chan error                          // Recv's last error, put back by whoever reads it
	history []*rlqsv3.RateLimitQuotaResponse_BucketAction
	cursor  map[string]int // per bucket: history before it is consumed by until
}

func (env *rlqsEnv) envoy(t testing.TB, name string) *envoy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(env.cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &envoy{t: t, name: name, stream: stream, cancel: cancel, cursor: map[string]int{},
		resps: make(chan *rlqsv3.RateLimitQuotaResponse, 1000), done: make(chan error, 1)}
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				e.done <- err
				return
			}
			e.resps <- r
		}
	}()
	t.Cleanup(e.leave)
	return e
}

// leave ends the stream and waits for its reader.
func (e *envoy) leave() {
	e.cancel()
	select {
	case err := <-e.done:
		e.done <- err
	case <-time.After(5 * time.Second):
		e.t.Errorf("%s: the stream did not end", e.name)
	}
}

// usage is one bucket's usage.
func usage(bucket map[string]string, elapsed time.Duration, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqsv3.BucketId{Bucket: bucket},
		TimeElapsed:        durationpb.New(elapsed),
		NumRequestsAllowed: allowed,
		NumRequestsDenied:  denied,
	}
}

func (e *envoy) send(domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	e.t.Helper()
	if err := e.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil {
		e.t.Fatalf("%s: send: %v", e.name, err)
	}
}

// pull waits for the next response and adds its actions to the history.
func (e *envoy) pull(deadline <-chan time.Time, waitingFor string) *rlqsv3.RateLimitQuotaResponse {
	e.t.Helper()
	select {
	case r := <-e.resps:
		e.history = append(e.history, r.GetBucketAction()...)
		return r
	case err := <-e.done:
		e.done <- err
		e.t.Fatalf("%s: stream ended waiting for %s: %v", e.name, waitingFor, err)
	case <-deadline:
		e.t.Fatalf("%s: no %s", e.name, waitingFor)
	}
	return nil
}

// report sends one report and returns its answer: the first response
// with an action for each bucket of the report, in order (a response the
// server pushes has only the buckets that changed).
func (e *envoy) report(domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaResponse {
	e.t.Helper()
	e.send(domain, us...)
	deadline := time.After(5 * time.Second)
	for {
		r := e.pull(deadline, "answer")
		if len(r.GetBucketAction()) == len(us) && !slices.ContainsFunc(us, func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) bool {
			i := slices.Index(us, u)
			return !maps.Equal(r.GetBucketAction()[i].GetBucketId().GetBucket(), u.GetBucketId().GetBucket())
		}) {
			return r
		}
	}
}

// until returns the next action for bucket, since the one the last until
// returned, that ok accepts, waiting for more responses if need be.
func (e *envoy) until(bucket map[string]string, ok func(*rlqsv3.RateLimitQuotaResponse_BucketAction) bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	e.t.Helper()
	k := fmt.Sprint(bucket)
	deadline := time.After(5 * time.Second)
	var last *rlqsv3.RateLimitQuotaResponse_BucketAction
	for {
		for i := e.cursor[k]; i < len(e.history); i++ {
			if a := e.history[i]; maps.Equal(a.GetBucketId().GetBucket(), bucket) {
				last = a
				if ok(a) {
					e.cursor[k] = i + 1
					return a
				}
			}
		}
		e.cursor[k] = len(e.history)
		e.pull(deadline, fmt.Sprintf("such action for %v (last: %s)", bucket, bucketOfOrNil(last)))
	}
}

func bucketOfOrNil(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	if a == nil {
		return "none"
	}
	return bucketOf(a)
}

// closed waits for the stream to end and returns its status.
func (e *envoy) closed() *status.Status {
	e.t.Helper()
	select {
	case err := <-e.done:
		e.done <- err
		if err == io.EOF { // the server returned nil
			return status.New(codes.OK, "")
		}
		return status.Convert(err)
	case <-time.After(5 * time.Second):
		e.t.Fatalf("%s: the stream did not end", e.name)
	}
	return nil
}

// bucketOf is a token bucket's numbers, or the blanket rule's name.
func bucketOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	switch {
	case a.GetAbandonAction() != nil:
		return "abandon"
	case a.GetQuotaAssignmentAction() == nil:
		return "none"
	}
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if tb := s.GetTokenBucket(); tb != nil {
		return fmt.Sprintf("%d tokens, %d per %v", tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration())
	}
	return s.GetBlanketRule().String()
}

func tokens(a *rlqsv3.RateLimitQuotaResponse_BucketAction) (uint32, float64, bool) {
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return 0, 0, false
	}
	return tb.GetMaxTokens(), float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds(), true
}

func ttlOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) time.Duration {
	return a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
}

var (
	routeA    = map[string]string{"route": "/a"}
	tenantX   = map[string]string{"tenant": "acme"}
	unmatched = map[string]string{"color": "blue"}
)

// The first report is answered for every bucket, in order, through the
// service's RegisterGRPC, with the default options.
func TestRLQSFirstReportAnswersEveryBucket(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{}, true)
	e := env.envoy(t, "envoy-1")
	both := map[string]string{"tenant": "acme", "route": "/b"}
	buckets := []map[string]string{
		routeA,          // per-route: 90/s, burst 90
		both,            // per-route and per-tenant: the least of each
		unmatched,       // no limit: allot lets it pass
		{"trial": "t1"}, // a shadow limit never restricts
		{"model": "m"},  // a token limit does not count requests
	}
	var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for _, b := range buckets {
		us = append(us, usage(b, 0, 1, 0)) // Envoy's first report of a bucket
	}
	r := e.report("edge", us...)
	want := []string{
		"90 tokens, 90 per 1s",
		"90 tokens, 600 per 1m0s",
		"ALLOW_ALL",
		"ALLOW_ALL",
		"ALLOW_ALL",
	}
	if len(r.GetBucketAction()) != len(want) {
		t.Fatalf("%d actions, want %d: %v", len(r.GetBucketAction()), len(want), r)
	}
	for i, a := range r.GetBucketAction() {
		if !maps.Equal(a.GetBucketId().GetBucket(), buckets[i]) {
			t.Errorf("action %d is for %v, want %v", i, a.GetBucketId().GetBucket(), buckets[i])
		}
		if got := bucketOf(a); got != want[i] {
			t.Errorf("action %d (%v): %s, want %s", i, buckets[i], got, want[i])
		}
		if got := ttlOf(a); got != DefaultRLQSMaxTTL {
			t.Errorf("action %d: TTL %v before an interval is known, want %v", i, got, DefaultRLQSMaxTTL)
		}
		if err := a.ValidateAll(); err != nil {
			t.Errorf("action %d: %v", i, err)
		}
	}
	// The TTL follows the report interval: 3 × 2s.
	r = e.report("edge", usage(routeA, 2*time.Second, 10, 0))
	if a := r.GetBucketAction()[0]; ttlOf(a) != 6*time.Second || bucketOf(a) != "90 tokens, 90 per 1s" {
		t.Errorf("second report: %s, TTL %v; want the same bucket, TTL 6s", bucketOf(a), ttlOf(a))
	}
	// Charged to the engine: 1 + 10 of 90 on route /a, 1 on tenant acme.
	if got := env.remaining(t, "edge", "per-route", "route", "/a"); got != 79 {
		t.Errorf("per-route /a has %d left, want 79", got)
	}
	if got := env.remaining(t, "edge", "per-tenant", "tenant", "acme"); got != 599 {
		t.Errorf("per-tenant acme has %d left, want 599", got)
	}

	// An Envoy-format domain: exact paths; unlimited values pass.
	e2 := env.envoy(t, "envoy-2")
	r = e2.report("envoy", usage(map[string]string{"user": "bob"}, 0, 1, 0), usage(map[string]string{"user": "vip"}, 0, 1, 0))
	if got := []string{bucketOf(r.GetBucketAction()[0]), bucketOf(r.GetBucketAction()[1])}; !slices.Equal(got, []string{"20 tokens, 20 per 1s", "ALLOW_ALL"}) {
		t.Errorf("envoy domain: %v", got)
	}
}

// Three Envoys on one bucket share the region's allowance: never more in
// total, and evenly while none has reported demand.
func TestRLQSSplitsTheAllowance(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{}, false)
	key := "edge\x00per-route:route=/a"
	var envoys []*envoy
	for i := range 3 {
		e := env.envoy(t, fmt.Sprintf("envoy-%d", i))
		envoys = append(envoys, e)
		a := e.report("edge", usage(routeA, 0, 1, 0)).GetBucketAction()[0]
		if sum, n := env.q.book.grantSum(key, env.clock.now()); sum > 1+1e-9 || n != i+1 {
			t.Fatalf("after envoy %d joined: grants %v over %d pairs, want ≤ 1 over %d", i, sum, n, i+1)
		}
		if i == 0 && bucketOf(a) != "90 tokens, 90 per 1s" {
			t.Fatalf("alone: %s, want the whole allowance", bucketOf(a))
		}
	}
	// The first ones are told to shrink, the last to grow: 30 each.
	start := time.Now()
	for _, e := range envoys {
		e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
			return bucketOf(a) == "30 tokens, 30 per 1s"
		})
	}
	t.Logf("the third Envoy's part converged in %v", time.Since(start))
	if sum, _ := env.q.book.grantSum(key, env.clock.now()); math.Abs(sum-1) > 1e-9 {
		t.Errorf("grants add up to %v, want 1", sum)
	}
}

// Parts follow demand: Floor of the allowance is split evenly, the rest
// by demand; a new Envoy counts as the mean.
func TestRLQSDemandWeightedSizing(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{Hysteresis: -1}, false)
	demands := []uint64{10, 10, 80} // requests in 1s
	var envoys []*envoy
	for i := range demands {
		e := env.envoy(t, fmt.Sprintf("envoy-%d", i))
		envoys = append(envoys, e)
		e.report("edge", usage(routeA, 0, 1, 0))
	}
	for i, e := range envoys {
		e.send("edge", usage(routeA, time.Second, demands[i]/2, demands[i]-demands[i]/2))
	}
	// targets: 0.9·d/100 + 0.1/3 → 0.1233, 0.1233, 0.7533 of 90
	want := []uint32{11, 11, 67}
	var total uint32
	var rate float64
	for i, e := range envoys {
		a := e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
			n, _, ok := tokens(a)
			return ok && n == want[i]
		})
		n, r, _ := tokens(a)
		total += n
		rate += r
	}
	if total > 90 || rate > 90 {
		t.Errorf("Envoys hold %d tokens and %v/s, the region's allowance is 90 and 90/s", total, rate)
	}

	// A fourth Envoy, demand unknown, counts as the mean demand (33.3):
	// 0.9 × 33.3/133.3 + 0.1/4 = 1/4.
	e := env.envoy(t, "envoy-new")
	e.report("edge", usage(routeA, 0, 1, 0))
	a := e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
		n, _, _ := tokens(a)
		return n >= 20
	})
	if n, _, _ := tokens(a); n != 22 { // 90 × (0.9·33.3/133.3 + 0.1/4) = 22.5
		t.Errorf("new Envoy: %s, want 22 tokens", bucketOf(a))
	}
	if sum, _ := env.q.book.grantSum("edge\x00per-route:route=/a", env.clock.now()); sum > 1+1e-9 {
		t.Errorf("grants add up to %v", sum)
	}
}

// An Envoy that leaves gives its part back to the others, who are told
// without waiting for their next report.
func TestRLQSLeavingEnvoyFreesItsPart(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{}, false)
	var envoys []*envoy
	for i := range 3 {
		e := env.envoy(t, fmt.Sprintf("envoy-%d", i))
		envoys = append(envoys, e)
		e.report("edge", usage(routeA, 0, 1, 0))
	}
	for _, e := range envoys {
		e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "30 tokens, 30 per 1s" })
	}
	envoys[2].leave()
	for _, e := range envoys[:2] {
		e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "45 tokens, 45 per 1s" })
	}
	if _, n := env.q.book.grantSum("edge\x00per-route:route=/a", env.clock.now()); n != 2 {
		t.Errorf("%d pairs left on the key, want 2", n)
	}
}

// A configuration that no longer limits a bucket abandons it; one
// without the domain abandons them all, and a later report is NotFound.
func TestRLQSConfigChangeAbandons(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{Tick: 5 * time.Millisecond}, false)
	e := env.envoy(t, "envoy")
	r := e.report("edge", usage(routeA, 0, 1, 0), usage(tenantX, 0, 1, 0), usage(unmatched, 0, 1, 0))
	if got := bucketOf(r.GetBucketAction()[2]); got != "ALLOW_ALL" {
		t.Fatalf("unmatched: %s", got)
	}
	env.s.SetConfig(parseRLQSConfig(t, `
domain: edge
limits:
  - {name: per-tenant, match: {tenant: "*"}, rate: 1200/1m}
`))
	e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
	// The changed limit is pushed as well.
	e.until(tenantX, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool {
		return bucketOf(a) == "1200 tokens, 1200 per 1m0s"
	})
	// The bucket that matched nothing before still passes, not abandoned.
	r = e.report("edge", usage(tenantX, time.Second, 5, 0), usage(unmatched, time.Second, 5, 0))
	if got := []string{bucketOf(r.GetBucketAction()[0]), bucketOf(r.GetBucketAction()[1])}; !slices.Equal(got, []string{"1200 tokens, 1200 per 1m0s", "ALLOW_ALL"}) {
		t.Errorf("after the change: %v", got)
	}

	env.s.SetConfig(parseRLQSConfig(t, "domain: other\nlimits:\n  - {name: x, match: {k: \"*\"}, rate: 1/s}\n"))
	e.until(tenantX, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
	e.until(unmatched, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
	e.send("edge", usage(tenantX, 0, 1, 0))
	if st := e.closed(); st.Code() != codes.NotFound {
		t.Errorf("report in a removed domain: %v, want NotFound", st)
	}
	if got := seriesValue(t, env.reg, "allot_regional_rlqs_actions_total", "action", "abandon"); got != 3 {
		t.Errorf("%v abandons counted, want 3", got)
	}
}

// Buckets an Envoy stops reporting are forgotten after their TTL, and
// their part goes back; buckets reported without requests for IdleAfter
// are abandoned too.
func TestRLQSForgetsBucketsEnvoyStoppedUsing(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{Tick: 5 * time.Millisecond, IdleAfter: time.Minute}, false)
	e := env.envoy(t, "envoy")
	other := env.envoy(t, "other")
	e.report("edge", usage(routeA, 0, 1, 0), usage(tenantX, 0, 1, 0))
	other.report("edge", usage(routeA, 0, 1, 0))
	e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "45 tokens, 45 per 1s" })
	other.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "45 tokens, 45 per 1s" })
	r := e.report("edge", usage(routeA, time.Second, 3, 0), usage(tenantX, 20*time.Second, 0, 0))
	if a := r.GetBucketAction(); ttlOf(a[0]) != 3*time.Second || ttlOf(a[1]) != time.Minute {
		t.Fatalf("TTLs %v and %v, want 3s (3 × 1s) and 1m (3 × 20s, at most 1m)", ttlOf(a[0]), ttlOf(a[1]))
	}

	// Past its TTL without a report: route /a is abandoned, and the
	// other Envoy gets the whole allowance back.
	env.clock.add(3*time.Second + time.Millisecond)
	e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
	other.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "90 tokens, 90 per 1s" })

	// The tenant's bucket is reported, without requests since the first
	// report: idle after a minute.
	for range 3 { // at 21s, 39s, 57s
		env.clock.add(18 * time.Second)
		if a := e.report("edge", usage(tenantX, 20*time.Second, 0, 0)).GetBucketAction()[0]; a.GetAbandonAction() != nil {
			t.Fatalf("abandoned %v after its first report", env.clock.now().Sub(t0))
		}
	}
	env.clock.add(4 * time.Second)
	e.until(tenantX, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return a.GetAbandonAction() != nil })
	if _, n := env.q.book.grantSum("edge\x00per-tenant:tenant=acme", env.clock.now()); n != 0 {
		t.Errorf("%d pairs left on the tenant's key", n)
	}
}

// Bad reports close the stream with InvalidArgument or NotFound and
// charge nothing, not even their good usages.
func TestRLQSBadInputChargesNothing(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{MaxBuckets: 3}, false)
	good := usage(routeA, time.Second, 5, 0)
	bad := func(f func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage)) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		u := usage(map[string]string{"route": "/b"}, time.Second, 1, 0)
		f(u)
		return u
	}
	tooMany := map[string]string{}
	for i := range regional.MaxEntries + 1 {
		tooMany[fmt.Sprint("k", i)] = "v"
	}
	cases := []struct {
		name   string
		domain string
		usages []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		code   codes.Code
	}{
		{"no domain", "", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good}, codes.InvalidArgument},
		{"unknown domain", "nope", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good}, codes.NotFound},
		{"no usages", "edge", nil, codes.InvalidArgument},
		{"no bucket id", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.BucketId = nil })}, codes.InvalidArgument},
		{"empty bucket id", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.BucketId.Bucket = nil })}, codes.InvalidArgument},
		{"empty value", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.BucketId.Bucket["route"] = "" })}, codes.InvalidArgument},
		{"empty key", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.BucketId.Bucket[""] = "x" })}, codes.InvalidArgument},
		{"too many entries", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.BucketId.Bucket = tooMany })}, codes.InvalidArgument},
		{"negative time", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
			u.TimeElapsed = durationpb.New(-time.Second)
		})}, codes.InvalidArgument},
		{"absurd time", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
			u.TimeElapsed = durationpb.New(48 * time.Hour)
		})}, codes.InvalidArgument},
		{"invalid time", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
			u.TimeElapsed = &durationpb.Duration{Seconds: 1, Nanos: -5}
		})}, codes.InvalidArgument},
		{"absurd count", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.NumRequestsAllowed = math.MaxUint64 })}, codes.InvalidArgument},
		{"absurd denied", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, bad(func(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) { u.NumRequestsDenied = allot.MaxAmount + 1 })}, codes.InvalidArgument},
		{"bucket twice", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, usage(routeA, time.Second, 1, 0)}, codes.InvalidArgument},
		{"too many buckets", "edge", []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{good, usage(tenantX, 0, 1, 0), usage(unmatched, 0, 1, 0), usage(map[string]string{"route": "/c"}, 0, 1, 0)}, codes.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := env.envoy(t, c.name)
			e.send(c.domain, c.usages...)
			st := e.closed()
			if st.Code() != c.code {
				t.Errorf("status %v, want %v", st, c.code)
			}
			if !strings.Contains(st.Message(), ":") {
				t.Errorf("message %q says little", st.Message())
			}
		})
	}
	// Another domain after the first report.
	e := env.envoy(t, "domain switch")
	e.report("edge", usage(tenantX, 0, 0, 0))
	e.send("envoy", good)
	if st := e.closed(); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "domain") {
		t.Errorf("domain switch: %v", st)
	}
	// A later report may leave the domain out.
	e = env.envoy(t, "domain left out")
	e.report("edge", usage(tenantX, 0, 0, 0))
	if a := e.report("", usage(tenantX, time.Second, 0, 0)).GetBucketAction(); len(a) != 1 {
		t.Errorf("report without domain: %v", a)
	}

	if got := env.remaining(t, "edge", "per-route", "route", "/a"); got != 90 {
		t.Errorf("route /a has %d left, want 90: a bad report was charged", got)
	}
	if got := env.remaining(t, "edge", "per-route", "route", "/b"); got != 90 {
		t.Errorf("route /b has %d left, want 90: a bad report was charged", got)
	}
	if got := seriesValue(t, env.reg, "allot_regional_rlqs_stream_errors_total", "reason", "invalid_argument"); got != float64(len(cases)) {
		t.Errorf("%v invalid_argument errors counted, want %d", got, len(cases))
	}
	if got := seriesValue(t, env.reg, "allot_regional_rlqs_stream_errors_total", "reason", "unknown_domain"); got != 1 {
		t.Errorf("%v unknown_domain errors counted, want 1", got)
	}
}

// Reported traffic is charged to the engine and counted as demand for
// the coordinator; the region's share and a share change size the
// assignments.
func TestRLQSChargesAndFollowsShares(t *testing.T) {
	env := newRLQSEnv(t, RLQSOptions{Tick: 5 * time.Millisecond}, false)
	env.s.engine.Demand() // drain
	e := env.envoy(t, "envoy")
	e.report("edge", usage(routeA, 0, 1, 0))
	e.report("edge", usage(routeA, time.Second, 40, 7))
	var admitted, rejected float64
	for _, d := range env.s.engine.Demand() {
		if d.Domain == "edge" && d.Limit == "per-route" && d.Key == "" {
			admitted, rejected = d.Admitted, d.Rejected
		}
	}
	if admitted != 41 || rejected != 7 {
		t.Errorf("demand: %v admitted, %v rejected; want 41, 7", admitted, rejected)
	}
	if got := env.remaining(t, "edge", "per-route", "route", "/a"); got != 90-41 {
		t.Errorf("route /a has %d left, want %d", got, 90-41)
	}
	if got := seriesValue(t, env.reg, "allot_regional_rlqs_requests_total", "result", "denied"); got != 7 {
		t.Errorf("%v denied requests counted, want 7", got)
	}

	if err := env.s.engine.SetShare(env.clock.now(), "edge", "per-route", 0.5); err != nil {
		t.Fatal(err)
	}
	e.until(routeA, func(a *rlqsv3.RateLimitQuotaResponse_BucketAction) bool { return bucketOf(a) == "45 tokens, 45 per 1s" })
}

// Streams end with their clients, leaving no goroutine and no part.
func TestRLQSStreamsEnd(t *testing.T) {
	base := runtime.NumGoroutine()
	env := newRLQSEnv(t, RLQSOptions{Tick: time.Millisecond}, false)
	var envoys []*envoy
	for i := range 5 {
		e := env.envoy(t, fmt.Sprint("envoy-", i))
		envoys = append(envoys, e)
		e.report("edge", usage(routeA, 0, 1, 0), usage(tenantX, 0, 1, 0))
	}
	if err := envoys[0].stream.CloseSend(); err != nil { // Envoy's half-close ends it too
		t.Fatal(err)
	}
	if st := envoys[0].closed(); st.Code() != codes.OK {
		t.Errorf("half-closed stream: %v", st)
	}
	for _, e := range envoys {
		e.leave()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		env.q.book.mu.Lock()
		keys := len(env.q.book.keys)
		env.q.book.mu.Unlock()
		streams := gaugeValue(t, env.reg, "allot_regional_rlqs_streams")
		if keys == 0 && streams == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys and %v streams left", keys, streams)
		}
		runtime.Gosched()
	}
	env.cc.Close()
	env.gs.Stop()
	for n := runtime.NumGoroutine(); n > base; n = runtime.NumGoroutine() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

func TestRLQSFill(t *testing.T) {
	cases := []struct {
		perPeriod float64
		period    time.Duration
		n         uint32
		iv        time.Duration
	}{
		{90, time.Second, 90, time.Second},
		{29.9999999999, time.Second, 30, time.Second}, // rounding noise
		{29.5, time.Second, 29, time.Second},          // never faster
		{0.5, time.Minute, 1, 2 * time.Minute},
		{0.3, time.Second, 1, 3333333334 * time.Nanosecond},
		{1e10, time.Second, 3333333333, 333333334 * time.Nanosecond},
	}
	for _, c := range cases {
		n, iv := fill(c.perPeriod, c.period)
		if n != c.n || iv != c.iv {
			t.Errorf("fill(%v, %v) = %d per %v, want %d per %v", c.perPeriod, c.period, n, iv, c.n, c.iv)
		}
		if rate, want := float64(n)/iv.Seconds(), c.perPeriod/c.period.Seconds(); rate > want*(1+1e-9) {
			t.Errorf("fill(%v, %v): %v/s is faster than %v/s", c.perPeriod, c.period, rate, want)
		}
	}
	deny := sizeAssign([]quotaReq{{key: "k", amount: 90, period: time.Second, burst: 90}}, []float64{0.001})
	if !deny.deny {
		t.Errorf("less than a token: %+v, want DENY_ALL", deny)
	}
	if s := deny.strategy(); s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("strategy %v", s)
	}
}

// The grants on one key never add up to more than 1, whatever the order
// of reports, departures and demands (a book without streams' I/O).
func TestQuotaBookNeverOvercommits(t *testing.T) {
	q := &RLQS{opts: RLQSOptions{}.withDefaults()}
	qb := newQuotaBook(q.opts.Floor, q.opts.Hysteresis)
	req := []quotaReq{{key: "k", amount: 100, period: time.Second, burst: 100}}
	var cs []*consumer
	now := t0
	for step := range 2000 {
		now = now.Add(time.Millisecond)
		switch i := step * 7919 % 13; {
		case i < 2 && len(cs) > 0: // one leaves
			j := step % len(cs)
			qb.remove(cs[j], now)
			cs = slices.Delete(cs, j, j+1)
		case i < 5 || len(cs) == 0: // one joins
			st := &rlqsStream{q: q, wake: make(chan struct{}, 1)}
			cs = append(cs, &consumer{s: st})
		default:
			c := cs[step%len(cs)]
			qb.observe(c, time.Duration(1+step%5)*time.Second, float64(step*31%97), time.Second*10)
			qb.assign(c, req, now, time.Minute)
			// woken pairs re-evaluate, as their streams would
			for _, o := range cs {
				if len(qb.drain(o.s)) > 0 {
					qb.assign(o, req, now, time.Minute)
				}
			}
		}
		if sum, _ := qb.grantSum("k", now); sum > 1+1e-9 {
			t.Fatalf("step %d: grants add up to %v", step, sum)
		}
	}
}

// BenchmarkRLQSReport is one report of 10 buckets and its answer, over
// loopback.
func BenchmarkRLQSReport(b *testing.B) {
	env := newRLQSEnv(b, RLQSOptions{}, false)
	e := env.envoy(b, "envoy")
	var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 10 {
		us = append(us, usage(map[string]string{"route": fmt.Sprint("/r", i), "tenant": "acme"}, time.Second, 5, 0))
	}
	e.report("edge", us...)
	b.ResetTimer()
	for range b.N {
		e.report("edge", us...)
		e.history = e.history[:0]
	}
}
