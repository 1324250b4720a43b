package allot

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

const effectiveYAML = `
domain: api
plans:
  free: {multiplier: 1}
  pro:  {multiplier: 10}
  half: {multiplier: 0.5}
assign:
  - {match: {tenant: "*"}, plan: free}
  - {match: {tenant: acme}, plan: pro}
  - {match: {tenant: "ac*"}, plan: half}  # as specific as "*", and later
  - {match: {tenant: tie}, plan: pro}
  - {match: {tenant: tie}, plan: half}    # same match: the later wins
limits:
  - {name: per-user, match: {user: "*"}, rate: 1000/1m, burst: 200}
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/1s}
  - {name: big, rate: 1G/1s}
overrides:
  - {limit: per-user, match: {user: "42"}, multiplier: 5, expires: 2026-12-01T00:00:00Z}
  - {match: {tenant: bigco}, rate: 10M/1m}
  - {match: {tenant: bigco, user: "9"}, multiplier: 2}
  - {limit: per-tenant, match: {user: "7"}, multiplier: 100}
  - {match: {user: "5"}, multiplier: 3}
  - {match: {user: "5"}, multiplier: 4}
  - {match: {user: "r"}, rate: 333/1m}
  - {match: {user: "tiny"}, rate: 1/1m}
  - {match: {user: "up"}, multiplier: 1000000}
  - {match: {user: "down"}, multiplier: 0.000001}
`

func mustDomain(t testing.TB, src string) *Domain {
	t.Helper()
	cfg, err := ParseConfig(t.Name()+".yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Domains[0]
}

func desc(kv ...string) Descriptor {
	var d Descriptor
	for i := 0; i < len(kv); i += 2 {
		d = append(d, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestEffective(t *testing.T) {
	d := mustDomain(t, effectiveYAML)
	expires := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	before := expires.Add(-time.Nanosecond)
	m := func(n int64) Rate { return Rate{Amount: n, Period: time.Minute} }
	s := func(n int64) Rate { return Rate{Amount: n, Period: time.Second} }
	tests := []struct {
		limit string
		desc  Descriptor
		now   time.Time
		rate  Rate
		burst int64
	}{
		{"per-user", desc("user", "1"), before, m(1000), 200},                                // no plan, no override
		{"per-user", desc("tenant", "other", "user", "1"), before, m(1000), 200},             // free ×1
		{"per-user", desc("tenant", "acme", "user", "1"), before, m(10000), 2000},            // exact beats wildcard and prefix
		{"per-user", desc("tenant", "acorn", "user", "1"), before, m(500), 100},              // "ac*" ties "*" and is later
		{"per-user", desc("tenant", "tie", "user", "1"), before, m(500), 100},                // same match: later wins
		{"per-user", desc("user", "42"), before, m(5000), 1000},                              // multiplier override
		{"per-user", desc("user", "42"), expires, m(1000), 200},                              // expired at Expires
		{"per-user", desc("user", "42"), expires.Add(time.Hour), m(1000), 200},               // and after
		{"per-user", desc("user", "42", "tenant", "acme"), before, m(50000), 10000},          // plan, then override
		{"per-tenant", desc("user", "42", "tenant", "x"), before, s(100), 100},               // override of per-user only
		{"per-user", desc("tenant", "bigco", "user", "1"), before, m(10_000_000), 2_000_000}, // absolute, burst × 10M/1000
		{"per-tenant", desc("tenant", "bigco"), before, m(10_000_000), 10_000_000},
		{"per-user", desc("tenant", "bigco", "user", "9"), before, m(2000), 400}, // more specific override wins
		{"per-user", desc("user", "7"), before, m(1000), 200},                    // scoped to per-tenant
		{"per-tenant", desc("tenant", "x", "user", "7"), before, s(10000), 10000},
		{"per-user", desc("user", "5"), before, m(4000), 800},                          // same match: later wins
		{"per-user", desc("user", "r"), before, m(333), 67},                            // 200 × 333/1000 rounded
		{"per-user", desc("user", "tiny"), before, m(1), 1},                            // burst at least 1
		{"big", desc("user", "up", "tenant", "acme"), before, s(MaxAmount), MaxAmount}, // clamped high
		{"per-user", desc("user", "down"), before, m(1), 1},                            // clamped low
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v/%s", tc.limit, tc.desc, tc.now.Format(time.RFC3339Nano)), func(t *testing.T) {
			got := d.Effective(d.Limit(tc.limit), tc.desc, tc.now)
			if want := (Effective{Rate: tc.rate, Burst: tc.burst}); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestEffectiveNotValidated(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	d := &Domain{Name: "api"}
	d.Effective(&Limit{}, nil, time.Time{})
}

func TestEffectiveAllocs(t *testing.T) {
	d := mustDomain(t, effectiveYAML)
	l := d.Limit("per-user")
	descs := []Descriptor{desc("tenant", "acme", "user", "42"), desc("tenant", "bigco", "user", "9"), desc("user", "1")}
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if n := testing.AllocsPerRun(100, func() {
		for _, dd := range descs {
			d.Effective(l, dd, now)
		}
	}); n != 0 {
		t.Errorf("%v allocations per run, want 0", n)
	}
}

func TestEffectiveConcurrent(t *testing.T) {
	d := mustDomain(t, effectiveYAML)
	l := d.Limit("per-user")
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				if e := d.Effective(l, desc("tenant", "acme", "user", "42"), now); e.Rate.Amount != 50000 {
					t.Errorf("got %+v, want amount 50000", e)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestEffectiveIndex checks the indexed lookup against a scan of every
// assignment and override.
func TestEffectiveIndex(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	keys, values := []string{"a", "b", "c"}, []string{"x", "y", "*", "x*"}
	genMatch := rapid.Custom(func(t *rapid.T) Match {
		var m Match
		for _, k := range rapid.Permutation(keys).Draw(t, "keys")[:rapid.IntRange(0, 3).Draw(t, "n")] {
			m = append(m, Entry{Key: k, Value: rapid.SampledFrom(values).Draw(t, "value")})
		}
		return m
	})
	rapid.Check(t, func(t *rapid.T) {
		d := &Domain{
			Name:  "api",
			Plans: map[string]Plan{"p2": {Name: "p2", Multiplier: 2}, "p3": {Name: "p3", Multiplier: 3}},
			Limits: []*Limit{
				{Name: "l", Rate: Rate{Amount: 1000, Period: time.Second}, Burst: 100, SyncInterval: time.Second, StaleAfter: time.Second},
				{Name: "other", Rate: Rate{Amount: 1000, Period: time.Second}, Burst: 100, SyncInterval: time.Second, StaleAfter: time.Second},
			},
		}
		for range rapid.IntRange(0, 6).Draw(t, "assignments") {
			d.Assignments = append(d.Assignments, PlanAssignment{Match: genMatch.Draw(t, "match"), Plan: rapid.SampledFrom([]string{"p2", "p3"}).Draw(t, "plan")})
		}
		for range rapid.IntRange(0, 10).Draw(t, "overrides") {
			d.Overrides = append(d.Overrides, Override{
				Limit:      rapid.SampledFrom([]string{"", "l", "other"}).Draw(t, "limit"),
				Match:      genMatch.Draw(t, "match"),
				Multiplier: float64(rapid.IntRange(5, 9).Draw(t, "multiplier")),
				Expires:    t0.Add(time.Duration(rapid.IntRange(0, 2).Draw(t, "expires")) * time.Hour),
			})
		}
		if err := d.Validate(); err != nil {
			t.Fatal(err)
		}
		var dd Descriptor
		for range rapid.IntRange(0, 4).Draw(t, "entries") {
			dd = append(dd, Entry{Key: rapid.SampledFrom(keys).Draw(t, "key"), Value: rapid.SampledFrom([]string{"x", "y", "xz"}).Draw(t, "value")})
		}
		now := t0.Add(time.Duration(rapid.IntRange(0, 3).Draw(t, "now")) * 30 * time.Minute)
		l := d.Limits[0]
		want := Effective{Rate: l.Rate, Burst: l.Burst}
		if i := scanBest(len(d.Assignments), func(i int) (Match, bool) { return d.Assignments[i].Match, true }, dd); i >= 0 {
			m := d.Plans[d.Assignments[i].Plan].Multiplier
			want.Rate.Amount, want.Burst = scale(want.Rate.Amount, m), scale(want.Burst, m)
		}
		if i := scanBest(len(d.Overrides), func(i int) (Match, bool) {
			o := d.Overrides[i]
			return o.Match, (o.Limit == "" || o.Limit == "l") && o.Active(now)
		}, dd); i >= 0 {
			m := d.Overrides[i].Multiplier
			want.Rate.Amount, want.Burst = scale(want.Rate.Amount, m), scale(want.Burst, m)
		}
		if got := d.Effective(l, dd, now); got != want {
			t.Fatalf("desc %v at %v: got %+v, want %+v", dd, now, got, want)
		}
	})
}

// scanBest is the most specific of n matches that applies and accepts d,
// the last one on ties, or -1.
func scanBest(n int, get func(int) (Match, bool), d Descriptor) int {
	best, spec := -1, -1
	for i := range n {
		if m, ok := get(i); ok && m.Matches(d) && m.Specificity() >= spec {
			best, spec = i, m.Specificity()
		}
	}
	return best
}

func BenchmarkEffective(b *testing.B) {
	src := effectiveYAML
	for i := range 10_000 {
		src += "  - {limit: per-user, match: {tenant: t" + strconv.Itoa(i%100) + ", user: u" + strconv.Itoa(i) + "}, multiplier: 2}\n"
	}
	d := mustDomain(b, src)
	l := d.Limit("per-user")
	dd := desc("tenant", "t5", "user", "u5005", "route", "/v1/chat")
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if e := d.Effective(l, dd, now); e.Rate.Amount != 2000 {
		b.Fatalf("got %+v, want amount 2000", e)
	}
	b.Run("10k overrides", func(b *testing.B) {
		for b.Loop() {
			d.Effective(l, dd, now)
		}
	})
	b.Run("none", func(b *testing.B) {
		d := mustDomain(b, "domain: api\nlimits: [{name: a, rate: 1/s}]\n")
		l := d.Limits[0]
		for b.Loop() {
			d.Effective(l, dd, now)
		}
	})
}
