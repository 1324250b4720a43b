package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// sixthConfig's limits are split over six regions; us-east holds a sixth
// of each: a quota of ⌊40 ÷ 6⌋ = 6 of the burst of 40, refilled in 40s.
const sixthConfig = `
domain: api
regions: [us-east, eu-west, ap-south, us-west, eu-north, sa-east]
limits:
  - {name: per-user, match: {user: "*"}, rate: 60/1m, burst: 40}
  - {name: login, match: {login: "*"}, rate: 60/1m, burst: 40, enforcement: exact}
`

// startSixth serves sixthConfig as us-east with a sixth of every limit,
// on a clock that stands still (nothing refills during the test).
func startSixth(t *testing.T) string {
	t.Helper()
	cfg, err := allot.ParseConfig("sixth.yaml", []byte(sixthConfig))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0)
	eng := regional.New(cfg, regional.Options{})
	for _, l := range cfg.Domains[0].Limits {
		if err := eng.SetShare(at, "api", l.Name, 1.0/6); err != nil {
			t.Fatal(err)
		}
	}
	svc := server.New(eng, server.Options{Region: "us-east", Now: func() time.Time { return at }})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

// keyDescriptors reads a request's descriptor from its X-Key header,
// key=value.
func keyDescriptors(r *http.Request) ([]allot.Descriptor, int64, error) {
	k, v, _ := strings.Cut(r.Header.Get("X-Key"), "=")
	return []allot.Descriptor{{{Key: k, Value: v}}}, 1, nil
}

// TestMiddlewareHeadersTellTheRegionsQuota: behind the SDK's middleware,
// the headers say what us-east admits of the key (its quota of 6), not
// the global limit (60 a minute), for a key the enforcer decides each
// time (exact) and for one the gateway decides from its lease; remaining
// is never above the quota, and a remaining above 0 promises the next
// request. For the exact key, whose remaining is the enforcer's, the
// request after a remaining of 0 is rejected; a leased key's remaining
// adds what the gateway holds to what the enforcer had left at its last
// answer (TestLeasedRemainingIsAdmitted crosses them with grants).
func TestMiddlewareHeadersTellTheRegionsQuota(t *testing.T) {
	c := newClient(t, startSixth(t))
	srv := httptest.NewServer(client.Middleware(c, client.MiddlewareOptions{Domain: "api", Descriptors: keyDescriptors})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	const pk = ";pk=:dXMtZWFzdA==:" // base64("us-east")

	for _, tc := range []struct {
		name, limit, key, value string
		sequential              bool // a remaining of 0 is a rejection next
	}{
		{"exact", "login", "login", "alice", true},
		{"leased", "per-user", "user", "42", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "leased" {
				// Decide from a lease: a check of no hits charges nothing
				// and has the gateway take one.
				ds := one(tc.key, tc.value)
				eventually(t, "a lease", func() bool {
					return c.Allow(context.Background(), "api", ds, 0).Source == client.SourceLease
				})
			}
			prev, admitted := int64(-1), 0
			for i := range 12 {
				req, err := http.NewRequest("GET", srv.URL, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-Key", tc.key+"="+tc.value)
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				h := resp.Header
				policy := strconv.Quote(tc.limit) + ";q=6;w=40" + pk
				if h.Get("X-RateLimit-Limit") != "6" || h.Get("RateLimit-Policy") != policy {
					t.Fatalf("request %d: X-RateLimit-Limit %q, RateLimit-Policy %q; want 6 (us-east's quota, not the global 60) and %s",
						i, h.Get("X-RateLimit-Limit"), h.Get("RateLimit-Policy"), policy)
				}
				rem, err := strconv.ParseInt(h.Get("X-RateLimit-Remaining"), 10, 64)
				if err != nil || rem < 0 || rem > 6 || !strings.HasPrefix(h.Get("RateLimit"), strconv.Quote(tc.limit)+";r="+strconv.FormatInt(rem, 10)+";") {
					t.Fatalf("request %d: headers %v", i, h)
				}
				allowed := resp.StatusCode == http.StatusOK
				switch {
				case prev > 0 && !allowed:
					t.Fatalf("request %d: %d, but the previous answer's remaining was %d", i, resp.StatusCode, prev)
				case !tc.sequential:
				case prev == 0 && allowed:
					t.Fatalf("request %d admitted after a remaining of 0", i)
				}
				if allowed {
					admitted++
				}
				prev = rem
			}
			// A grant may still be in flight after the last request.
			if admitted > 6 || tc.sequential && admitted != 6 {
				t.Errorf("%d requests admitted on a quota of 6 that does not refill", admitted)
			}
		})
	}
}
