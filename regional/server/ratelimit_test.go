package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/regional"
)

// exampleConfig is deploy/examples/limits.yaml's api domain, in short.
const exampleConfig = `
domain: api
regions: [us-east, eu-west, ap-south]
plans:
  free: {multiplier: 1}
  pro: {multiplier: 10}
assign:
  - {match: {tenant: acme}, plan: pro}
limits:
  - {name: per-user, match: {user: "*"}, rate: 30/1s, burst: 15, floors: {us-east: 0.1, eu-west: 0.1, ap-south: 0.05}}
  - {name: per-tenant, match: {tenant: "*"}, rate: 1000/1m}
  - {name: login-attempts, match: {route: /login, ip: "*"}, rate: 5/1m, algorithm: sliding_window}
`

// newRegionService serves cfg as region with each limit at the
// coordinator's initial split, on clock c.
func newRegionService(t *testing.T, cfg, region string, c *clock) *Service {
	t.Helper()
	conf, err := allot.ParseConfig("test.yaml", []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(conf, regional.Options{})
	for _, d := range conf.Domains {
		for _, l := range d.Limits {
			if len(d.Regions) == 0 {
				continue
			}
			sh := coordinator.InitialShares(l.Floors, d.Regions)
			for i, r := range d.Regions {
				if r == region {
					if err := e.SetShare(c.now(), d.Name, l.Name, sh[i]); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	return New(e, Options{Region: region, Now: c.now})
}

func TestRateLimitHeadersTellTheRegionsShare(t *testing.T) {
	c := &clock{t: t0}
	s := newRegionService(t, exampleConfig, "us-east", c)
	h := s.HTTPHandler(HTTPOptions{})
	const pk = ";pk=:dXMtZWFzdA==:" // base64("us-east")

	// us-east holds 35% of per-user (30/s, burst 15): 5.25 tokens, of
	// which 5 whole requests pass at once.
	body := `{"domain":"api","descriptors":[{"user":"42"}]}`
	w := post(t, h, "application/json", body)
	for k, v := range map[string]string{
		"RateLimit-Policy":      `"per-user";q=5;w=1` + pk,
		"RateLimit":             `"per-user";r=4;t=1` + pk,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "4",
		"X-RateLimit-Reset":     "1",
	} {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	for range 4 {
		if w := post(t, h, "application/json", body); w.Code != 200 {
			t.Fatalf("a request the headers promised: %d %v", w.Code, w.Header())
		}
	}
	if w := post(t, h, "application/json", body); w.Code != http.StatusTooManyRequests || w.Header().Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("6th request: %d %v, want 429 with X-RateLimit-Limit 5", w.Code, w.Header())
	}

	// A tenant on the pro plan: 10 × 1000/1m, a third of it here; the
	// token bucket refills its whole burst in the minute.
	w = post(t, h, "application/json", `{"domain":"api","descriptors":[{"tenant":"acme"}]}`)
	if got, want := w.Header().Get("RateLimit-Policy"), `"per-tenant";q=3333;w=60`+pk; got != want {
		t.Errorf("pro tenant: RateLimit-Policy %q, want %q", got, want)
	}
	// A hot key with a share of its own.
	if err := s.Engine().SetKeyShare(c.now(), "api", "per-tenant", "per-tenant:tenant=hot", 0.5); err != nil {
		t.Fatal(err)
	}
	w = post(t, h, "application/json", `{"domain":"api","descriptors":[{"tenant":"hot"}]}`)
	if got, want := w.Header().Get("RateLimit-Policy"), `"per-tenant";q=500;w=60`+pk; got != want {
		t.Errorf("hot key: RateLimit-Policy %q, want %q", got, want)
	}
	// A sliding window: a third of 5 a minute is one request.
	w = post(t, h, "application/json", `{"domain":"api","descriptors":[{"route":"/login","ip":"10.0.0.1"}]}`)
	if got, want := w.Header().Get("RateLimit-Policy"), `"login-attempts";q=1;w=60`+pk; got != want {
		t.Errorf("sliding window: RateLimit-Policy %q, want %q", got, want)
	}
	if got := w.Header().Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("sliding window: X-RateLimit-Remaining %q, want 0", got)
	}
}

func TestRateLimitHeadersOfASharedLimit(t *testing.T) {
	c := &clock{t: t0}
	conf, err := allot.ParseConfig("t.yaml", []byte("domain: api\nregions: [us-east, eu-west]\nlimits:\n  - {name: g, match: {user: \"*\"}, rate: 100/1m, mode: shared}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(conf, regional.Options{})
	if err := e.SetPeers("us-east", []string{"eu-west"}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetShare(c.now(), "api", "g", 0.5); err != nil {
		t.Fatal(err)
	}
	s := New(e, Options{Region: "us-east", Now: c.now})
	h := s.HTTPHandler(HTTPOptions{})
	body := `{"domain":"api","descriptors":[{"user":"1"}]}`

	// In sync with its peer, the region decides on the whole limit (less
	// the peer's counts): a global policy, with no partition.
	e.Heard(c.now(), "eu-west")
	w := post(t, h, "application/json", body)
	if got, want := w.Header().Get("RateLimit-Policy"), `"g";q=100;w=60`; got != want {
		t.Errorf("in sync: RateLimit-Policy %q, want %q", got, want)
	}
	if got := w.Header().Get("X-RateLimit-Remaining"); got != "99" {
		t.Errorf("in sync: X-RateLimit-Remaining %q, want 99", got)
	}
	// The peer silent past stale_after: the region's split share.
	c.add(time.Minute)
	w = post(t, h, "application/json", body)
	if got, want := w.Header().Get("RateLimit-Policy"), `"g";q=50;w=60;pk=:dXMtZWFzdA==:`; got != want {
		t.Errorf("stale peer: RateLimit-Policy %q, want %q", got, want)
	}
}

var remainingRe = regexp.MustCompile(`;r=(\d+);`)

// TestRemainingIsAdmitted: a response's remaining N promises that the
// next N sequential requests to the same instance pass, whatever the
// algorithm, the share (float32 shares included, as the coordinator
// sends them) and the pace; and a full budget admits exactly q at once.
func TestRemainingIsAdmitted(t *testing.T) {
	third := coordinator.InitialShares(nil, []string{"a", "b", "c"})[0] // 1/3 as a float32, rounded down
	share35 := coordinator.InitialShares(map[string]float64{"a": 0.1, "b": 0.1, "c": 0.05}, []string{"a", "b", "c"})[0]
	cases := []struct {
		limit string
		share float64
	}{
		{"rate: 10/1s, burst: 5", 1},
		{"rate: 30/1s, burst: 15", share35},
		{"rate: 30/1s, burst: 15", third},
		{"rate: 100/1m", third},
		{"rate: 3/1s, burst: 5, algorithm: gcra", 1}, // an interval of 333333333.3 ns
		{"rate: 60/1m, algorithm: gcra", third},
		{"rate: 7/1s, burst: 7, algorithm: gcra", share35},
		{"rate: 30/1s, burst: 15, algorithm: gcra", share35},
		{"rate: 5/1m, algorithm: sliding_window", 1},
		{"rate: 7/1m, algorithm: sliding_window", share35},
		{"rate: 100/1s, algorithm: sliding_window", third},
		{"rate: 500/1h, algorithm: sliding_window", share35},
	}
	for _, tc := range cases {
		for _, step := range []time.Duration{0, time.Microsecond, 7 * time.Millisecond, 37 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s share %.4f every %v", tc.limit, tc.share, step), func(t *testing.T) {
				c := &clock{t: t0.Add(123456789)}
				conf, err := allot.ParseConfig("t.yaml", []byte("domain: api\nlimits:\n  - {name: l, match: {user: \"*\"}, "+tc.limit+"}\n"))
				if err != nil {
					t.Fatal(err)
				}
				e := regional.New(conf, regional.Options{})
				if err := e.SetShare(c.now(), "api", "l", tc.share); err != nil {
					t.Fatal(err)
				}
				h := New(e, Options{Region: "r", Now: c.now}).HTTPHandler(HTTPOptions{})
				body := `{"domain":"api","descriptors":[{"user":"1"}]}`
				promised, rejected, burst := -1, 0, 0 // promised: the last call that must pass
				var quota int64
				for i := range 300 {
					w := post(t, h, "application/json", body)
					if i <= promised && w.Code != 200 {
						t.Fatalf("call %d: %d, but an earlier answer promised calls up to %d (headers %v)", i, w.Code, promised, w.Header())
					}
					if w.Code != 200 {
						rejected++
					} else if rejected == 0 {
						burst++
					}
					rem, err1 := strconv.ParseInt(w.Header().Get("X-RateLimit-Remaining"), 10, 64)
					q, err2 := strconv.ParseInt(w.Header().Get("X-RateLimit-Limit"), 10, 64)
					m := remainingRe.FindStringSubmatch(w.Header().Get("RateLimit"))
					if err1 != nil || err2 != nil || m == nil || m[1] != strconv.FormatInt(rem, 10) || rem > q || rem < 0 {
						t.Fatalf("call %d: headers %v", i, w.Header())
					}
					quota = q
					promised = max(promised, i+int(rem))
					c.add(step)
				}
				if rejected == 0 && step <= time.Microsecond {
					t.Fatalf("no call was rejected: the test proves nothing")
				}
				// At (almost) one instant, a full budget admits q: one more
				// when a float32 share leaves the budget a hair below a whole
				// number (15 × 0.33333331 = 4.9999997: q=4, and the 5th
				// request passes once 30 ns have refilled the hair).
				if step == time.Microsecond && (int64(burst) < quota || int64(burst) > quota+1) {
					t.Errorf("a fresh key admitted %d in a row; its headers say q=%d", burst, quota)
				}
			})
		}
	}
}

func TestHTTPBodyNumbers(t *testing.T) {
	s := newTestService(t, nil)
	h := s.HTTPHandler(HTTPOptions{})
	w := post(t, h, "application/json", `{"domain":"api","descriptors":[{"user":"42","tenant":"acme"}],"hits":2}`)
	var res map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
	limits, _ := res["limits"].([]any)
	if len(limits) != 3 {
		t.Fatalf("body: %s", w.Body)
	}
	l := limits[0].(map[string]any)
	if l["limit"] != 10.0 || l["remaining"] != 3.0 || l["descriptor_index"] != 0.0 || l["window"] != "1s" || l["reset_after"] != "0.200s" {
		t.Errorf("body: %s; want numbers for limit, remaining and descriptor_index, durations as proto3 JSON strings", w.Body)
	}
	if strings.Contains(w.Body.String(), `":"10"`) {
		t.Errorf("an integer is a string: %s", w.Body)
	}
}
