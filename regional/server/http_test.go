package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/testdep"
)

func post(t *testing.T, h http.Handler, contentType, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHTTPCheckHeaders(t *testing.T) {
	s := newTestService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	body := `{"domain":"api","descriptors":[{"user":"42","tenant":"acme"}]}`
	for i := range 5 {
		if w := post(t, h, "application/json", body); w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	w := post(t, h, "application/json; charset=utf-8", body)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: %d %s", w.Code, w.Body)
	}
	want := map[string]string{
		"Retry-After":           "1", // 100ms rounds up to 1s
		"X-RateLimit-Limit":     "5", // the burst: 5 pass at once
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "1",
		// w: a spent burst of 5 refills in 0.5s, rounded up; pk: region "test"
		"RateLimit-Policy": `"per-user";q=5;w=1;pk=:dGVzdA==:, "per-tenant";q=100;w=60;pk=:dGVzdA==:`,
		"RateLimit":        `"per-user";r=0;t=1;pk=:dGVzdA==:, "per-tenant";r=95;t=3;pk=:dGVzdA==:`,
		"Content-Type":     "application/json",
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: got %q, want %q", k, got, v)
		}
	}
	var res struct {
		Allowed bool `json:"allowed"`
		Limits  []struct {
			Name      string `json:"name"`
			Remaining int64  `json:"remaining"`
			Allowed   bool   `json:"allowed"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || res.Allowed || len(res.Limits) != 3 || res.Limits[0].Name != "per-user" {
		t.Fatalf("body: %s (%v)", w.Body, err)
	}
}

func TestHTTPBadInputChargesNothing(t *testing.T) {
	s := newTestService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	cases := []struct {
		name, contentType, body string
		code                    int
	}{
		{"garbage", "application/json", `{"domain":`, 400},
		{"not an object", "application/json", `[1,2]`, 400},
		{"unknown field", "application/json", `{"domain":"api","descriptors":[{"user":"1"}],"x":1}`, 400},
		{"two values", "application/json", `{"domain":"api","descriptors":[{"user":"1"}]} {}`, 400},
		{"wrong content type", "text/plain", `{"domain":"api","descriptors":[{"user":"1"}]}`, 415},
		{"unknown domain", "application/json", `{"domain":"nope","descriptors":[{"user":"1"}]}`, 404},
		{"no descriptors", "application/json", `{"domain":"api","descriptors":[]}`, 400},
		{"empty descriptor", "application/json", `{"domain":"api","descriptors":[{}]}`, 400},
		{"negative hits", "application/json", `{"domain":"api","descriptors":[{"user":"1"}],"hits":-3}`, 400},
		{"hits above burst", "application/json", `{"domain":"api","descriptors":[{"user":"1"}],"hits":6}`, 400},
		{"huge body", "application/json", `{"domain":"` + strings.Repeat("a", maxBody) + `"}`, 413},
	}
	for _, tc := range cases {
		w := post(t, h, tc.contentType, tc.body)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), `"error"`) {
			t.Errorf("%s: got %d %s, want %d with an error message", tc.name, w.Code, w.Body, tc.code)
		}
	}
	if n := s.Engine().Stats().Keys; n != 0 {
		t.Fatalf("refused requests created %d keys", n)
	}
	r := httptest.NewRequest("GET", "/v1/check", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/check: %d", w.Code)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestService(t, reg)
	h := s.HTTPHandler(HTTPOptions{Gatherer: reg})
	for range 3 {
		post(t, h, "application/json", `{"domain":"api","descriptors":[{"user":"1"}]}`)
	}
	post(t, h, "application/json", `{"domain":"nope","descriptors":[{"user":"1"}]}`)
	for _, path := range []string{"/healthz", "/readyz"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != 200 {
			t.Fatalf("%s: %d", path, w.Code)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	out := w.Body.String()
	for _, want := range []string{
		`allot_regional_decisions_total{domain="api",enforcement="local",limit="per-user",result="allowed"} 3`,
		`allot_regional_decisions_total{domain="api",enforcement="local",limit="shadowed",result="shadow_rejected"} 2`,
		`allot_regional_shadow_rejections_total{domain="api",limit="shadowed"} 2`,
		`allot_regional_check_errors_total{reason="unknown_domain"} 1`,
		`allot_regional_decision_duration_seconds_count 3`,
		`allot_regional_keys 2`,
		`allot_regional_evictions_total{kind="idle"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out, "nope") {
		t.Error("an unknown domain from a request became a label value")
	}
	promtoolCheckMetrics(t, out)
}

// promtoolCheckMetrics lints a /metrics output with promtool check metrics,
// in a subtest "promtool" that skips without promtool (fails under CI=true).
func promtoolCheckMetrics(t *testing.T, out string) {
	t.Helper()
	t.Run("promtool", func(t *testing.T) {
		promtool := testdep.LookPath(t, "promtool", "Debian's prometheus package: apt-get install prometheus; .ci/run installs it")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(out)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool check metrics: %v\n%s", err, msg)
		}
	})
}
