package regional

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// t0 is on a whole second, so sliding windows start there.
var t0 = time.Unix(1_700_000_000, 0)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func mustConfig(t interface {
	Helper()
	Fatalf(string, ...any)
}, yaml string) *allot.Config {
	t.Helper()
	cfg, err := allot.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

func user(id string) allot.Descriptor { return allot.Descriptor{{Key: "user", Value: id}} }

type row struct {
	at         time.Duration
	n          int64
	allowed    bool
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
}

func runRows(t *testing.T, e *Engine, rows []row) {
	t.Helper()
	var dec allot.Decision
	for i, r := range rows {
		if err := e.Check(t0.Add(r.at), "api", user("1"), r.n, &dec); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		st := dec.Statuses[0]
		if dec.Allowed != r.allowed || st.Remaining != r.remaining || st.RetryAfter != r.retryAfter || st.ResetAfter != r.resetAfter {
			t.Errorf("row %d at %v n=%d: got allowed=%v remaining=%d retry=%v reset=%v, want %v %d %v %v",
				i, r.at, r.n, dec.Allowed, st.Remaining, st.RetryAfter, st.ResetAfter, r.allowed, r.remaining, r.retryAfter, r.resetAfter)
		}
	}
}

const never = time.Duration(maxWait)

// bucketRows hold for a token bucket and for GCRA of 10/s, burst 5: the
// two admit the same requests (GCRA is a token bucket kept as one
// timestamp).
var bucketRows = []row{
	{0, 1, true, 4, 0, ms(100)},
	{0, 4, true, 0, 0, ms(500)},
	{0, 1, false, 0, ms(100), ms(500)},
	{ms(50), 1, false, 0, ms(50), ms(450)},
	{ms(100), 1, true, 0, 0, ms(500)},
	{ms(1000), 5, true, 0, 0, ms(500)},
	{ms(1000), 0, true, 0, 0, ms(500)},        // hits 0 reports without charging
	{ms(1250), 2, true, 0, 0, ms(450)},        // 2.5 − 2
	{ms(1300), 3, false, 1, ms(200), ms(400)}, // 0.5 + 0.5
}

func TestTokenBucketRows(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5}
`), Options{})
	runRows(t, e, bucketRows)
}

func TestGCRARows(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5, algorithm: gcra}
`), Options{})
	runRows(t, e, bucketRows)
}

func TestSlidingWindowRows(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, algorithm: sliding_window}
`), Options{})
	runRows(t, e, []row{
		{0, 10, true, 0, 0, ms(2000)},
		// est 10; wait for the next window, where 10·(1−x) + 1 ≤ 10 at x = 0.1
		{ms(500), 1, false, 0, ms(600), ms(1500)},
		{ms(1100), 1, true, 0, 0, ms(1900)}, // est 10·0.9 = 9
		// est 9 + 1; 10·(1−x) ≤ 8 at x = 0.2
		{ms(1100), 1, false, 0, ms(100), ms(1900)},
		{ms(1200), 1, true, 0, 0, ms(1800)},  // est 10·0.8 + 1
		{ms(3000), 10, true, 0, 0, ms(2000)}, // two windows later: empty
		{ms(3000), 0, true, 0, 0, ms(2000)},
	})
}

func TestMultiLimitChargesOnlyIfAdmitted(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s}
  - {name: per-tenant, match: {tenant: "*"}, rate: 3/s}
  - {name: per-user-in-tenant, match: {tenant: "*", user: "*"}, rate: 100/s}
`), Options{})
	desc := allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "1"}}
	var dec allot.Decision
	for i := range 3 {
		if err := e.Check(t0, "api", desc, 1, &dec); err != nil || !dec.Allowed {
			t.Fatalf("request %d: allowed=%v err=%v", i, dec.Allowed, err)
		}
	}
	if err := e.Check(t0, "api", desc, 1, &dec); err != nil || dec.Allowed {
		t.Fatalf("4th request: allowed=%v err=%v, want tenant limit to reject", dec.Allowed, err)
	}
	if len(dec.Statuses) != 3 {
		t.Fatalf("statuses: got %d, want 3", len(dec.Statuses))
	}
	want := []struct {
		name      string
		allowed   bool
		remaining int64
	}{{"per-user", true, 7}, {"per-tenant", false, 0}, {"per-user-in-tenant", true, 97}}
	for i, w := range want {
		st := dec.Statuses[i]
		if st.Name != w.name || st.Allowed != w.allowed || st.Remaining != w.remaining {
			t.Errorf("status %d: got %s allowed=%v remaining=%d, want %s %v %d", i, st.Name, st.Allowed, st.Remaining, w.name, w.allowed, w.remaining)
		}
	}
	if dec.RetryAfter != time.Second/3+1 {
		t.Errorf("retry after: got %v, want %v", dec.RetryAfter, time.Second/3+1)
	}
	// The rejected request charged nothing: a user-only request still has 7.
	if err := e.Check(t0, "api", user("1"), 7, &dec); err != nil || !dec.Allowed {
		t.Fatalf("per-user alone: allowed=%v err=%v", dec.Allowed, err)
	}
	// Another user of the same tenant is held by the tenant limit.
	other := allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "2"}}
	if err := e.Check(t0, "api", other, 1, &dec); err != nil || dec.Allowed {
		t.Fatalf("other user of acme: allowed=%v err=%v, want rejected", dec.Allowed, err)
	}
}

func TestNoMatchingLimitAllows(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 1/s}\n"), Options{})
	var dec allot.Decision
	if err := e.Check(t0, "api", allot.Descriptor{{Key: "ip", Value: "1.2.3.4"}}, 1, &dec); err != nil || !dec.Allowed || len(dec.Statuses) != 0 {
		t.Fatalf("got allowed=%v statuses=%d err=%v, want allowed with no statuses", dec.Allowed, len(dec.Statuses), err)
	}
}

func TestShadowCountsButNeverRejects(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 2/s, shadow: true}
  - {name: global, match: {}, rate: 100/s}
`), Options{})
	var dec allot.Decision
	got := []bool{}
	for range 3 {
		if err := e.Check(t0, "api", user("1"), 1, &dec); err != nil {
			t.Fatal(err)
		}
		if !dec.Allowed {
			t.Fatal("a shadow limit rejected a request")
		}
		got = append(got, dec.Statuses[0].Allowed)
	}
	if got[0] != true || got[1] != true || got[2] != false || !dec.Statuses[0].Shadow {
		t.Fatalf("shadow verdicts: got %v shadow=%v, want [true true false] shadow=true", got, dec.Statuses[0].Shadow)
	}
	if dec.Statuses[1].Remaining != 97 {
		t.Fatalf("global remaining: got %d, want 97", dec.Statuses[1].Remaining)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 5/s}\n"), Options{})
	var dec allot.Decision
	cases := []struct {
		domain string
		desc   allot.Descriptor
		hits   int64
		want   error
	}{
		{"nope", user("1"), 1, ErrUnknownDomain},
		{"api", user("1"), -1, ErrBadCost},
		{"api", user("1"), allot.MaxAmount + 1, ErrBadCost},
		{"api", allot.Descriptor{{Key: "", Value: "x"}}, 1, ErrBadDescriptor},
		{"api", make(allot.Descriptor, MaxEntries+1), 1, ErrBadDescriptor},
		{"api", user("1"), 6, ErrCostAboveBurst},
	}
	for _, c := range cases {
		if err := e.Check(t0, c.domain, c.desc, c.hits, &dec); !errors.Is(err, c.want) {
			t.Errorf("Check(%q, %v, %d): got %v, want %v", c.domain, c.desc, c.hits, err, c.want)
		}
	}
	if err := e.Charge(t0, "api", user("1"), -5); !errors.Is(err, ErrBadCost) {
		t.Errorf("Charge(-5): got %v, want ErrBadCost", err)
	}
	if err := e.SetShare(t0, "api", "per-user", 1.5); !errors.Is(err, ErrBadShare) {
		t.Errorf("SetShare(1.5): got %v, want ErrBadShare", err)
	}
	if err := e.SetShare(t0, "api", "nope", 0.5); !errors.Is(err, ErrUnknownLimit) {
		t.Errorf("SetShare(nope): got %v, want ErrUnknownLimit", err)
	}
	if n := e.Stats().Keys; n != 0 {
		t.Fatalf("bad input created %d keys", n)
	}
	if err := e.Check(t0, "api", user("1"), 5, &dec); err != nil || !dec.Allowed {
		t.Fatalf("full budget after bad input: allowed=%v err=%v", dec.Allowed, err)
	}
}

func TestChargeBelowZeroAndRefund(t *testing.T) {
	e := New(mustConfig(t, "domain: llm\nlimits:\n  - {name: tokens, match: {tenant: \"*\"}, unit: tokens, rate: 100/s}\n"), Options{})
	acme := allot.Descriptor{{Key: "tenant", Value: "acme"}}
	var dec allot.Decision
	if err := e.Check(t0, "llm", acme, 80, &dec); err != nil || !dec.Allowed {
		t.Fatal("reserve 80:", dec.Allowed, err)
	}
	// The real usage was 150: charge 70 more, to -50.
	if err := e.Charge(t0, "llm", acme, 70); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(t0.Add(ms(400)), "llm", acme, 1, &dec); err != nil || dec.Allowed {
		t.Fatalf("at -50+40: allowed=%v err=%v, want rejected", dec.Allowed, err)
	}
	if got := dec.Statuses[0].RetryAfter; got != ms(110) {
		t.Fatalf("retry after: got %v, want 110ms", got)
	}
	if err := e.Refund(t0.Add(ms(400)), "llm", acme, 30); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(t0.Add(ms(400)), "llm", acme, 20, &dec); err != nil || !dec.Allowed || dec.Statuses[0].Remaining != 0 {
		t.Fatalf("after refund of 30: allowed=%v remaining=%d err=%v", dec.Allowed, dec.Statuses[0].Remaining, err)
	}
	// A refund never fills above the burst.
	if err := e.Refund(t0.Add(10*time.Second), "llm", acme, 1000); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(t0.Add(10*time.Second), "llm", acme, 0, &dec); err != nil || dec.Statuses[0].Remaining != 100 {
		t.Fatalf("after a large refund: remaining=%d err=%v, want 100", dec.Statuses[0].Remaining, err)
	}
}

func TestShareScalesAndLoweringClamps(t *testing.T) {
	for _, alg := range []string{"token_bucket", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/s, algorithm: "+alg+"}\n"), Options{})
			var dec allot.Decision
			check := func(at time.Duration, n int64) bool {
				t.Helper()
				if err := e.Check(t0.Add(at), "api", user("1"), n, &dec); err != nil {
					t.Fatal(err)
				}
				return dec.Allowed
			}
			if !check(0, 10) { // 90 left at share 1
				t.Fatal("first request rejected")
			}
			if err := e.SetShare(t0.Add(ms(100)), "api", "per-user", 0.25); err != nil {
				t.Fatal(err)
			}
			// At the change: 90+10 = 100, clamped to 25. At 200ms: 25 (full).
			if check(ms(200), 26) {
				t.Fatal("26 admitted above the lowered burst of 25")
			}
			if !check(ms(200), 25) {
				t.Fatal("25 rejected: the bucket should be full at the lowered burst")
			}
			// Refill at 25/s: 10 tokens take 400ms.
			if check(ms(500), 11) || !check(ms(600), 10) {
				t.Fatal("refill does not follow the lowered rate")
			}
			if got := e.Share("api", "per-user", "per-user:user=1"); got != 0.25 {
				t.Fatalf("share: got %v, want 0.25", got)
			}
			// A hot key's own share takes precedence over the default.
			if err := e.SetKeyShare(t0.Add(ms(600)), "api", "per-user", "per-user:user=1", 0.5); err != nil {
				t.Fatal(err)
			}
			if !check(ms(1600), 50) || check(ms(1600), 1) {
				t.Fatal("hot-key share of 0.5 does not give a burst of 50")
			}
			if !check(ms(1600), 0) || dec.Statuses[0].Limit != 100 {
				t.Fatalf("limit reported: got %d, want the effective 100", dec.Statuses[0].Limit)
			}
		})
	}
}

func TestShareZeroRejectsEverything(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/s}\n"), Options{})
	if err := e.SetShare(t0, "api", "per-user", 0); err != nil {
		t.Fatal(err)
	}
	var dec allot.Decision
	if err := e.Check(t0.Add(time.Hour), "api", user("1"), 1, &dec); err != nil || dec.Allowed {
		t.Fatalf("share 0: allowed=%v err=%v", dec.Allowed, err)
	}
	if dec.RetryAfter != never {
		t.Fatalf("retry after at share 0: got %v, want %v", dec.RetryAfter, never)
	}
}

func TestSweepDropsOnlyFullKeys(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	for i := range 100 {
		n := int64(1)
		if i%2 == 0 {
			n = 10
		}
		if err := e.Check(t0, "api", user(string(rune('a'+i%26))+string(rune('0'+i/26))), n, &dec); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.Sweep(t0.Add(ms(100))); n != 50 {
		t.Fatalf("sweep at +100ms dropped %d keys, want the 50 that spent 1", n)
	}
	if n := e.Sweep(t0.Add(ms(999))); n != 0 {
		t.Fatalf("sweep at +999ms dropped %d keys, want 0", n)
	}
	if n := e.Sweep(t0.Add(time.Second)); n != 50 {
		t.Fatalf("sweep at +1s dropped %d keys, want 50", n)
	}
	if s := e.Stats(); s.Keys != 0 || s.EvictedIdle != 100 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestMaxKeysBound(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{MaxKeys: numShards * 4})
	var dec allot.Decision
	for i := range 10_000 {
		if err := e.Check(t0, "api", user(string(rune(i))), 1, &dec); err != nil {
			t.Fatal(err)
		}
	}
	s := e.Stats()
	if s.Keys > numShards*4+maxInline*numShards {
		t.Fatalf("keys: got %d, bound %d", s.Keys, numShards*4)
	}
	if s.EvictedActive == 0 {
		t.Fatal("no active key was evicted past the bound")
	}
}

func TestReloadKeepsState(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	if err := e.Check(t0, "api", user("1"), 10, &dec); err != nil || !dec.Allowed {
		t.Fatal(err)
	}
	// The burst goes from 10 to 20: the raise is there at once, and the
	// 10 spent stay spent (TestRaisedBurst): 10 left, not 20.
	e.Reconfigure(t0, mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 20/s}\n"))
	if err := e.Check(t0, "api", user("1"), 11, &dec); err != nil || dec.Allowed || dec.Statuses[0].Remaining != 10 {
		t.Fatalf("after reload: allowed=%v statuses=%+v err=%v, want the spent bucket kept (10 left)", dec.Allowed, dec.Statuses, err)
	}
	if err := e.Check(t0, "api", user("1"), 10, &dec); err != nil || !dec.Allowed {
		t.Fatalf("after reload: allowed=%v err=%v, want the 10 of the raise", dec.Allowed, err)
	}
	if err := e.Check(t0.Add(ms(50)), "api", user("1"), 1, &dec); err != nil || !dec.Allowed {
		t.Fatalf("after reload at +50ms: allowed=%v err=%v, want the new rate of 20/s", dec.Allowed, err)
	}
}

func TestCheckDoesNotAllocate(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000/s}
  - {name: per-tenant, match: {tenant: "*"}, rate: 1000/s}
`), Options{})
	desc := allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "1"}}
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		_ = e.Check(now, "api", desc, 1, &dec)
	}); n != 0 {
		t.Fatalf("Check allocates %v times per call", n)
	}
}

func TestKeyStringRoundTrip(t *testing.T) {
	cfg := mustConfig(t, "domain: api\nlimits:\n  - {name: per-route, match: {tenant: \"*\", route: \"/v1/*\"}, rate: 10/s}\n")
	l := cfg.Domains[0].Limits[0]
	desc := allot.Descriptor{{Key: "route", Value: "/v1/a,b=c%d"}, {Key: "tenant", Value: "acme"}}
	key := KeyString(l, desc)
	if key != "per-route:tenant=acme,route=/v1/a%2Cb%3Dc%25d" {
		t.Fatalf("KeyString: got %q", key)
	}
	name, d, err := ParseKeyString(key)
	if err != nil || name != "per-route" || d.String() != "tenant=acme,route=/v1/a,b=c%d" {
		t.Fatalf("ParseKeyString: got %q %v %v", name, d, err)
	}
	e := New(cfg, Options{})
	if err := e.SetKeyShare(t0, "api", "per-route", key, 0.5); err != nil {
		t.Fatal(err)
	}
	if got := e.Share("api", "per-route", key); got != 0.5 {
		t.Fatalf("hot key share: got %v", got)
	}
	var dec allot.Decision
	if err := e.Check(t0, "api", desc, 6, &dec); err != nil || dec.Allowed {
		t.Fatalf("6 of a half share of 10: allowed=%v err=%v", dec.Allowed, err)
	}
	other := allot.Descriptor{{Key: "route", Value: "/v1/x"}, {Key: "tenant", Value: "acme"}}
	if err := e.Check(t0, "api", other, 10, &dec); err != nil || !dec.Allowed {
		t.Fatalf("another key keeps the default share: allowed=%v err=%v", dec.Allowed, err)
	}
	for _, bad := range []string{"", "per-route", ":tenant=a", "per-route:tenant", "per-route:tenant=a", "other:tenant=a,route=/v1/x", "per-route:tenant=a,route=/v2/x", "per-route:tenant=a,route=%zz"} {
		if err := e.SetKeyShare(t0, "api", "per-route", bad, 0.5); !errors.Is(err, ErrBadDescriptor) {
			t.Errorf("SetKeyShare(%q): got %v, want ErrBadDescriptor", bad, err)
		}
	}
	if err := e.SetKeyShare(t0, "api", "per-route", key, -1); err != nil || e.Share("api", "per-route", key) != 1 {
		t.Fatalf("removing the hot key share: %v, share %v", err, e.Share("api", "per-route", key))
	}
}

func TestDemandDrainsCounts(t *testing.T) {
	e := New(mustConfig(t, `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s}
  - {name: per-tenant, match: {tenant: "*"}, rate: 1000/s}
`), Options{})
	var dec allot.Decision
	acme := func(u string) allot.Descriptor {
		return allot.Descriptor{{Key: "tenant", Value: "acme"}, {Key: "user", Value: u}}
	}
	for range 12 { // user 1: 10 admitted, 2 rejected: hot
		if err := e.Check(t0, "api", acme("1"), 1, &dec); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Check(t0, "api", acme("2"), 3, &dec); err != nil { // user 2: 3 of 10, not hot
		t.Fatal(err)
	}
	if err := e.SetKeyShare(t0, "api", "per-user", "per-user:user=3", 0.5); err != nil {
		t.Fatal(err)
	}
	got := e.Demand()
	want := []allot.Demand{
		{Domain: "api", Limit: "per-tenant", Admitted: 13, Rejected: 2},
		{Domain: "api", Limit: "per-user", Admitted: 13, Rejected: 2},
		{Domain: "api", Limit: "per-user", Key: "per-user:user=1", Admitted: 2, Rejected: 2, NearLimit: true}, // from the 9th, which left 1,
		{Domain: "api", Limit: "per-user", Key: "per-user:user=3"},
	}
	if len(got) != len(want) {
		t.Fatalf("demand: got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("demand[%d]: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if again := e.Demand(); len(again) != 1 || again[0].Key != "per-user:user=3" {
		t.Fatalf("a second drain: %+v, want only the key with its own share", again)
	}
}

// A sliding-window key uses share moved to this region only from the next
// window: the region that gave it up may have spent it in this one.
func TestWindowShareRaisedAtNextWindow(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 30/s, algorithm: sliding_window}\n"), Options{})
	var dec allot.Decision
	admit := func(at time.Duration, n int64) bool {
		t.Helper()
		if err := e.Check(t0.Add(at), "api", user("1"), n, &dec); err != nil {
			t.Fatal(err)
		}
		return dec.Allowed
	}
	if err := e.SetShare(t0.Add(-time.Second), "api", "per-user", 1.0/3); err != nil {
		t.Fatal(err)
	}
	if !admit(0, 10) || admit(0, 1) {
		t.Fatal("a third of 30 should admit 10")
	}
	if err := e.SetShare(t0.Add(ms(500)), "api", "per-user", 2.0/3); err != nil {
		t.Fatal(err)
	}
	if admit(ms(600), 1) {
		t.Fatal("the raise took effect within the window in which it came")
	}
	// Next window: the raised share of 20, less the previous window's 10
	// weighted by what is left of it (90% at +1.1s): 20 − 9 = 11.
	if !admit(ms(1100), 11) || admit(ms(1100), 1) {
		t.Fatal("the raise did not take effect at the next window")
	}
	// A lowering takes effect at once.
	if err := e.SetShare(t0.Add(ms(1200)), "api", "per-user", 0.1); err != nil {
		t.Fatal(err)
	}
	if admit(ms(1900), 1) {
		t.Fatal("a lowered share still admitted within the window")
	}
}

// ResetShare replaces a share's history: a share in force since before a
// sliding window began may be used in full in it; one in force only since
// within the window, from the next window.
func TestResetShare(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: u, match: {user: \"*\"}, rate: 10/1s, algorithm: sliding_window}\n"), Options{})
	count := func(at time.Time, u string) int {
		n := 0
		var dec allot.Decision
		for range 20 {
			if err := e.Check(at, "api", user(u), 1, &dec); err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				n++
			}
		}
		return n
	}
	if err := e.SetShare(t0, "api", "u", 0); err != nil {
		t.Fatal(err)
	}
	if err := e.ResetShare("api", "u", 0.5, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if n := count(t0.Add(ms(100)), "a"); n != 5 {
		t.Fatalf("in force always: admitted %d, want 5", n)
	}
	if err := e.ResetShare("api", "u", 0.5, t0.Add(ms(200))); err != nil {
		t.Fatal(err)
	}
	if n := count(t0.Add(ms(300)), "b"); n != 0 {
		t.Fatalf("in force since within the window: admitted %d, want 0", n)
	}
	if n := count(t0.Add(ms(2300)), "c"); n != 5 {
		t.Fatalf("in force since before the window: admitted %d, want 5", n)
	}
	if err := e.ResetShare("api", "u", 2, time.Time{}); err == nil {
		t.Fatal("a share above 1 was taken")
	}
}

// TestWholeRequestDespiteRounding: an instance's part of a limit of 20 a
// window (a token bucket's burst is 20 too) that is one request (a region's share of 0.3, as a float32, ÷ 6
// instances) comes out a few 1e-7 short of 1; it admits that request, and
// no second one. A part of 0.999 admits nothing.
func TestWholeRequestDespiteRounding(t *testing.T) {
	for _, alg := range []string{"sliding_window", "token_bucket", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 20/s, algorithm: "+alg+"}\n"), Options{})
			// The coordinator rounds shares down to a float32.
			share := float64(math.Nextafter32(float32(0.3), 0)) / 6
			if 20*share >= 1 {
				t.Fatalf("20 × %v = %v: the test wants a part just short of one request", share, 20*share)
			}
			if err := e.SetShare(t0, "api", "per-user", share); err != nil {
				t.Fatal(err)
			}
			var dec allot.Decision
			check := func(key string) bool {
				t.Helper()
				if err := e.Check(t0.Add(ms(10)), "api", user(key), 1, &dec); err != nil {
					t.Fatal(err)
				}
				return dec.Allowed
			}
			if !check("1") {
				t.Fatalf("%v of a request a window rejects the request", 20*share)
			}
			if check("1") {
				t.Fatal("a second request admitted in the same window")
			}
			if err := e.SetShare(t0, "api", "per-user", 0.999/20); err != nil {
				t.Fatal(err)
			}
			if check("2") {
				t.Fatal("0.999 of a request a window admits a request")
			}
		})
	}
}
