package server

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

func TestEnforcerDecidesStoreBackedLimits(t *testing.T) {
	cfg, err := allot.ParseConfig("test.yaml", []byte(`
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5}
  - {name: otp, match: {user: "*", route: "/otp"}, rate: 2/1h, enforcement: exact, on_failure: closed}
  - {name: per-tenant, match: {tenant: "*"}, rate: 1000/1m, enforcement: leased}
`))
	if err != nil {
		t.Fatal(err)
	}
	store := &regional.MemoryStore{}
	engine := regional.New(cfg, regional.Options{})
	f := regional.NewEnforcer(engine, store, regional.EnforcerOptions{Region: "test", Instance: "a"})
	f.Tick(context.Background(), t0)
	reg := prometheus.NewRegistry()
	s := New(engine, Options{Region: "test", Registry: reg, Now: func() time.Time { return t0 }, Enforcer: f})
	h := s.HTTPHandler(HTTPOptions{Gatherer: reg})
	const otp = `{"domain":"api","descriptors":[{"user":"42","route":"/otp","tenant":"acme"}]}`
	for i, want := range []int{200, 200, 429} {
		if w := post(t, h, "application/json", otp); w.Code != want {
			t.Fatalf("request %d: %d %s, want %d", i, w.Code, w.Body, want)
		}
	}
	store.SetErr(errors.New("down"))
	if w := post(t, h, "application/json", `{"domain":"api","descriptors":[{"user":"7","route":"/otp"}]}`); w.Code != 429 {
		t.Fatalf("otp with the store down: %d, want 429 (on_failure: closed)", w.Code)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	out := w.Body.String()
	for _, want := range []string{
		`allot_regional_decisions_total{domain="api",enforcement="exact",limit="otp",result="rejected"} 2`,
		`allot_regional_fallback_active{domain="api",limit="otp",region="test"} 1`,
		`allot_regional_fallback_decisions_total{domain="api",limit="otp",region="test",result="rejected"} 1`,
		`allot_regional_leases_total{domain="api",event="grant",limit="per-tenant",region="test"} 1`,
		`allot_regional_instances{region="test"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	promtoolCheckMetrics(t, out)
}
