package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

const reserveTestConfig = `
domain: llm
limits:
  - {name: tenant-tokens, match: {tenant: "*"}, unit: tokens, rate: 10000/1m, concurrency: 2}
  - {name: tenant-requests, match: {tenant: "*"}, rate: 100/1m}
`

// clock is a settable clock for a Service.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newReserveService(t *testing.T, reg *prometheus.Registry) (*Service, *clock) {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(reserveTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: t0}
	opts := Options{Region: "test", Now: c.now, Reservations: regional.ReservationOptions{TTL: time.Minute}}
	if reg != nil {
		opts.Registry = reg
	}
	return New(regional.New(cfg, regional.Options{}), opts), c
}

func postTo(t *testing.T, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHTTPReserveSettle(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := newReserveService(t, reg)
	h := s.HTTPHandler(HTTPOptions{})
	w := postTo(t, h, "/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"acme"}],"prompt_tokens":100,"max_tokens":1000,"model":"gpt-x"}`)
	if w.Code != http.StatusOK {
		t.Fatalf("reserve: %d %s", w.Code, w.Body)
	}
	var res struct {
		Allowed        bool   `json:"allowed"`
		ReservationID  string `json:"reservation_id"`
		ReservedTokens int64  `json:"reserved_tokens"` // a number, not protojson's string
		TTL            string `json:"ttl"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Allowed || res.ReservationID == "" || res.ReservedTokens != 600 || res.TTL != "60s" {
		t.Fatalf("reserve body: %s", w.Body)
	}
	want := map[string]string{
		"X-Ratelimit-Limit-Tokens":       "10000",
		"X-Ratelimit-Remaining-Tokens":   "9400",
		"X-Ratelimit-Reset-Tokens":       "3.6s", // 600 tokens at 10000 a minute
		"X-Ratelimit-Limit-Requests":     "100",
		"X-Ratelimit-Remaining-Requests": "99",
		"X-Ratelimit-Reset-Requests":     "600ms",
		"RateLimit-Policy":               `"tenant-requests";q=100;w=60;pk=:dGVzdA==:, "tenant-tokens";q=10000;w=60;pk=:dGVzdA==:`,
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v && !(k == "RateLimit-Policy" && got == `"tenant-tokens";q=10000;w=60;pk=:dGVzdA==:, "tenant-requests";q=100;w=60;pk=:dGVzdA==:`) {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}

	w = postTo(t, h, "/v1/settle", `{"reservation_id":"`+res.ReservationID+`","input_tokens":100,"output_tokens":200}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"refunded_tokens":300`) || !strings.Contains(w.Body.String(), `"state":"settled"`) {
		t.Fatalf("settle: %d %s", w.Code, w.Body)
	}
	if got := w.Header().Get("X-Ratelimit-Remaining-Tokens"); got != "9700" {
		t.Fatalf("remaining after settle: %q", got)
	}
	// A settlement does not name its key: no quota to tell.
	if got := w.Header().Get("X-Ratelimit-Limit-Tokens"); got != "" {
		t.Errorf("limit after settle: %q, want none", got)
	}
	w = postTo(t, h, "/v1/settle", `{"reservation_id":"`+res.ReservationID+`","input_tokens":100,"output_tokens":200}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"repeat":true`) {
		t.Fatalf("repeated settle: %d %s", w.Code, w.Body)
	}
	w = postTo(t, h, "/v1/release", `{"reservation_id":"rsv_nope","used_tokens":1}`)
	if w.Code != http.StatusNotFound {
		t.Fatalf("unknown id: %d %s", w.Code, w.Body)
	}
	for _, name := range []string{"reserved", "settled", "refunded"} {
		if v := seriesValue(t, reg, "allot_regional_reservation_tokens_total", "kind", name); v == 0 {
			t.Errorf("tokens_total{kind=%s} is 0", name)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "allot_regional_reservation_estimate_error_tokens" {
			if h := mf.GetMetric()[0].GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != -300 {
				t.Fatalf("estimate error: %d samples, sum %v; want one of -300", h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
}

// seriesValue reads the series of a counter with one label's value.
func seriesValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

func TestHTTPReserveRejections(t *testing.T) {
	s, c := newReserveService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	body := `{"domain":"llm","descriptors":[{"tenant":"acme"}],"prompt_tokens":10,"max_tokens":100}`
	for range 2 {
		if w := postTo(t, h, "/v1/reserve", body); w.Code != http.StatusOK {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	// Concurrency 2: the third waits.
	w := postTo(t, h, "/v1/reserve", body)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" ||
		!strings.Contains(w.Body.String(), `"concurrency_limit":"tenant-tokens"`) {
		t.Fatalf("concurrency rejection: %d %v %s", w.Code, w.Header(), w.Body)
	}
	// At the TTL the two expire (Reserve ticks first) and free their slots.
	c.add(time.Minute)
	if w := postTo(t, h, "/v1/reserve", body); w.Code != http.StatusOK {
		t.Fatalf("after expiry: %d %s", w.Code, w.Body)
	}
	if st := s.Reservations().Stats(); st.Expired != 2 {
		t.Fatalf("stats: %+v", st)
	}
	// A budget rejection: 429 with the tokens headers and Retry-After.
	big := `{"domain":"llm","descriptors":[{"tenant":"big"}],"prompt_tokens":9000,"max_tokens":100,"estimate":100}`
	if w := postTo(t, h, "/v1/reserve", big); w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	w = postTo(t, h, "/v1/reserve", big)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("X-Ratelimit-Remaining-Tokens") != "900" || w.Header().Get("Retry-After") != "50" {
		t.Fatalf("budget rejection: %d %v %s", w.Code, w.Header(), w.Body)
	}
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"a"}],"prompt_tokens":-1,"max_tokens":10}`, 400},
		{"/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"a"}],"max_tokens":0}`, 400},
		{"/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"a"}],"max_tokens":99999999999}`, 400},
		{"/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"a"}],"max_tokens":10,"estimate":0}`, 400},
		{"/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"a"}],"max_tokens":10,"ttl_ms":-5}`, 400},
		{"/v1/reserve", `{"domain":"nope","descriptors":[{"tenant":"a"}],"max_tokens":10}`, 404},
		{"/v1/reserve", `{"domain":"llm","descriptors":[],"max_tokens":10}`, 400},
		{"/v1/reserve", `{"domain":"llm","descriptors":[{}],"max_tokens":10}`, 400},
		{"/v1/reserve", `{"domain":"llm","model":"\u0001","descriptors":[{"tenant":"a"}],"max_tokens":10}`, 400},
		{"/v1/reserve", `garbage`, 400},
		{"/v1/reserve", `{"domain":"llm","bogus":1}`, 400},
		{"/v1/settle", `{"reservation_id":"","input_tokens":1}`, 400},
		{"/v1/settle", `{"reservation_id":"rsv_x","input_tokens":-1}`, 400},
		{"/v1/settle", `{"reservation_id":"rsv_x","input_tokens":1}`, 404},
		{"/v1/release", `{"reservation_id":"rsv_x","used_tokens":-1}`, 400},
		{"/v1/settle", `[1,2]`, 400},
	} {
		if w := postTo(t, h, tc.path, tc.body); w.Code != tc.code {
			t.Errorf("%s %s: %d %s, want %d", tc.path, tc.body, w.Code, w.Body, tc.code)
		}
	}
	if st := s.Reservations().Stats(); st.Active != 2 {
		t.Fatalf("bad input reserved: %+v", st)
	}
}

func TestGRPCReserve(t *testing.T) {
	s, c := newReserveService(t, nil)
	cl := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	ctx := context.Background()
	req := &allotv1.ReserveRequest{Domain: "llm", Descriptors: []*allotv1.Descriptor{desc("tenant", "acme")},
		PromptTokens: 100, MaxTokens: 1000, Model: "m", Ttl: durationpb.New(10 * time.Second)}
	r, err := cl.Reserve(ctx, req)
	if err != nil || !r.Allowed || r.ReservedTokens != 600 || r.EstimatedOutputTokens != 500 || r.Ttl.AsDuration() != 10*time.Second || len(r.Limits) != 2 {
		t.Fatalf("reserve: %v %v", r, err)
	}
	st, err := cl.Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 100, OutputTokens: 1400})
	if err != nil || st.Settlement.OverchargedTokens != 900 || st.Settlement.State != "settled" || st.Settlement.Limits[0].Remaining != 8500 {
		t.Fatalf("settle: %v %v", st, err)
	}
	// Release of a cancelled stream; then the grace period forgets both.
	r2, _ := cl.Reserve(ctx, req)
	rel, err := cl.Release(ctx, &allotv1.ReleaseRequest{ReservationId: r2.ReservationId, UsedTokens: 150})
	if err != nil || rel.Settlement.State != "released" || rel.Settlement.RefundedTokens != 450 {
		t.Fatalf("release: %v %v", rel, err)
	}
	c.add(regional.DefaultGrace + time.Second)
	s.Reservations().Tick(ctx, c.now())
	if _, err := cl.Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("settle after the grace period: %v, want NotFound", err)
	}
	for _, bad := range []*allotv1.ReserveRequest{
		{Domain: "llm", Descriptors: req.Descriptors, MaxTokens: -1},
		{Domain: "llm", Descriptors: req.Descriptors, MaxTokens: 10, Estimate: hits(11)},
		{Domain: "llm", Descriptors: req.Descriptors, MaxTokens: 10, Ttl: durationpb.New(-time.Second)},
		{Domain: "llm", MaxTokens: 10},
	} {
		if _, err := cl.Reserve(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := cl.Reserve(ctx, &allotv1.ReserveRequest{Domain: "nope", Descriptors: req.Descriptors, MaxTokens: 10}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown domain: %v", err)
	}
	if _, err := cl.Release(ctx, &allotv1.ReleaseRequest{ReservationId: "rsv_x"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown id: %v", err)
	}
}

// RunReservations expires reservations on the service's clock.
func TestRunReservations(t *testing.T) {
	s, c := newReserveService(t, nil)
	if r, err := s.Reservations().Reserve(context.Background(), c.now(), regional.ReserveRequest{Domain: "llm",
		Descriptors: []allot.Descriptor{{{Key: "tenant", Value: "a"}}}, MaxTokens: 10}); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	c.add(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.RunReservations(ctx, time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Reservations().Stats().Expired != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not expired")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

// ttl_ms is compared before it is multiplied: a value that overflowed
// into a TTL of under a millisecond, or one above the maximum, gets the
// maximum TTL (an hour by default), which the answer says.
func TestHTTPReserveTTLMillis(t *testing.T) {
	s, _ := newReserveService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	for _, tc := range []struct {
		ms   string
		code int
		ttl  string
	}{
		{"18446744073710", 200, "3600s"}, // × 1e6 wraps to 448 µs
		{"9223372036854775807", 200, "3600s"},
		{"7200000", 200, "3600s"},
		{"5000", 200, "5s"},
		{"0", 400, ""},
		{"-9223372036854775808", 400, ""},
	} {
		w := postTo(t, h, "/v1/reserve", `{"domain":"llm","descriptors":[{"tenant":"t`+tc.ms+`"}],"max_tokens":10,"ttl_ms":`+tc.ms+`}`)
		var res struct {
			TTL string `json:"ttl"`
		}
		json.Unmarshal(w.Body.Bytes(), &res)
		if w.Code != tc.code || res.TTL != tc.ttl {
			t.Errorf("ttl_ms %s: %d, ttl %q; want %d, %q (%s)", tc.ms, w.Code, res.TTL, tc.code, tc.ttl, w.Body)
		}
	}
	// Over gRPC too, a TTL above the maximum is cut to it.
	cl := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	r, err := cl.Reserve(context.Background(), &allotv1.ReserveRequest{Domain: "llm", Descriptors: []*allotv1.Descriptor{desc("tenant", "g")},
		MaxTokens: 10, Ttl: durationpb.New(1000 * time.Hour)})
	if err != nil || r.Ttl.AsDuration() != regional.DefaultMaxTTL {
		t.Fatalf("gRPC ttl of 1000 h: %v %v, want %v", r, err, regional.DefaultMaxTTL)
	}
}

// Big descriptors are refused: 200 reservations of 1 MB descriptors that
// matched no limit held 300 MB.
func TestHTTPReserveDescriptorBounds(t *testing.T) {
	s, _ := newReserveService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	big := strings.Repeat("x", 512<<10)
	for _, body := range []string{
		`{"domain":"llm","descriptors":[{"junk":"` + big + `"}],"max_tokens":10,"ttl_ms":3600000}`,
		`{"domain":"llm","descriptors":[{"tenant":"a","junk":"` + big + `"}],"max_tokens":10}`,
	} {
		if w := postTo(t, h, "/v1/reserve", body); w.Code != http.StatusBadRequest {
			t.Errorf("a reservation of 512 KiB descriptors: %d, want 400", w.Code)
		}
	}
	if st := s.Reservations().Stats(); st.Active != 0 {
		t.Fatalf("big descriptors held: %+v", st)
	}
}

// A settle of output far above max_tokens over gRPC is InvalidArgument
// and changes nothing; the reservation settles afterwards.
func TestGRPCSettleBounds(t *testing.T) {
	s, _ := newReserveService(t, nil)
	cl := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	ctx := context.Background()
	r, err := cl.Reserve(ctx, &allotv1.ReserveRequest{Domain: "llm", Descriptors: []*allotv1.Descriptor{desc("tenant", "acme")},
		PromptTokens: 10, MaxTokens: 100})
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	for _, bad := range []*allotv1.SettleRequest{
		{ReservationId: r.ReservationId, InputTokens: 10, OutputTokens: 1 << 50},
		{ReservationId: r.ReservationId, InputTokens: 1 << 49, OutputTokens: 1 << 49},
		{ReservationId: r.ReservationId, InputTokens: 10, OutputTokens: 201},
	} {
		if _, err := cl.Settle(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("settle %v: %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := cl.Release(ctx, &allotv1.ReleaseRequest{ReservationId: r.ReservationId, UsedTokens: 1 << 50}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("release of 2^50: %v, want InvalidArgument", err)
	}
	if st := s.Reservations().Stats(); st.Active != 1 || st.SettledTokens != 0 || st.StoreFailures != 0 {
		t.Fatalf("refused settles counted: %+v", st)
	}
	st, err := cl.Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 10, OutputTokens: 200})
	if err != nil || st.Settlement.OverchargedTokens != 150 {
		t.Fatalf("settle at twice max_tokens: %v %v", st, err)
	}
}

// tlsReserve serves s over TLS on loopback (client certificates verified
// when given) and returns clients: one per gateway URI, and "" for one
// without a certificate.
func tlsReserve(t *testing.T, s *Service, uris ...string) map[string]allotv1.RateLimiterClient {
	t.Helper()
	pki := testpki.New(t)
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.VerifyClientCertIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	s.RegisterGRPC(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	out := map[string]allotv1.RateLimiterClient{}
	for i, uri := range append(uris, "") {
		files := tlsx.Files{CA: pki.CAFile}
		if uri != "" {
			files = tlsx.Files(pki.Issue(t, fmt.Sprintf("client%d", i), testpki.Leaf{URIs: []string{uri}}))
		}
		csrc, err := tlsx.NewSource(files, tlsx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(l.Addr().String(), csrc.DialOption(""))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		out[uri] = allotv1.NewRateLimiterClient(cc)
	}
	return out
}

// Over TLS, only the gateway that made a reservation may settle or
// release it; to another, and to a caller without a certificate, the id
// is unknown. Callers without a certificate are one anonymous caller.
func TestGRPCSettleOnlyByOwner(t *testing.T) {
	s, _ := newReserveService(t, nil)
	const gw1, gw2 = "spiffe://allot/gateway/gw1", "spiffe://allot/region/test/gateway/gw2"
	cls := tlsReserve(t, s, gw1, gw2)
	plain := allotv1.NewRateLimiterClient(serveGRPC(t, s))
	ctx := context.Background()
	req := &allotv1.ReserveRequest{Domain: "llm", Descriptors: []*allotv1.Descriptor{desc("tenant", "acme")}, PromptTokens: 100, MaxTokens: 1000}
	r, err := cls[gw1].Reserve(ctx, req)
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	for name, cl := range map[string]allotv1.RateLimiterClient{"gw2": cls[gw2], "no certificate": cls[""], "plain text": plain} {
		if _, err := cl.Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 0, OutputTokens: 0}); status.Code(err) != codes.NotFound {
			t.Errorf("settle by %s: %v, want NotFound", name, err)
		}
		if _, err := cl.Release(ctx, &allotv1.ReleaseRequest{ReservationId: r.ReservationId}); status.Code(err) != codes.NotFound {
			t.Errorf("release by %s: %v, want NotFound", name, err)
		}
	}
	if st := s.Reservations().Stats(); st.Active != 1 || st.SettledTokens != 0 {
		t.Fatalf("another caller's settle took effect: %+v", st)
	}
	st, err := cls[gw1].Settle(ctx, &allotv1.SettleRequest{ReservationId: r.ReservationId, InputTokens: 100, OutputTokens: 100})
	if err != nil || st.Settlement.RefundedTokens != 400 {
		t.Fatalf("owner's settle: %v %v", st, err)
	}
	// Without a certificate, over TLS or plain text: one anonymous caller.
	a, err := cls[""].Reserve(ctx, req)
	if err != nil || !a.Allowed {
		t.Fatal(a, err)
	}
	if _, err := cls[gw1].Release(ctx, &allotv1.ReleaseRequest{ReservationId: a.ReservationId}); status.Code(err) != codes.NotFound {
		t.Errorf("gw1 released an anonymous reservation: %v", err)
	}
	if rel, err := plain.Release(ctx, &allotv1.ReleaseRequest{ReservationId: a.ReservationId, UsedTokens: 100}); err != nil || rel.Settlement.State != "released" {
		t.Fatalf("anonymous release: %v %v", rel, err)
	}
}
