package allot

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// head is a valid start of a domain document; it ends at line 2.
const head = "domain: api\nregions: [us-east, eu-west]\n"

// limit is head plus a valid limit a whose fields end at line 5; add more
// of its fields with four spaces of indent from line 6 on.
const limit = head + "limits:\n  - name: a\n    rate: 10/1m\n"

var badConfigs = []struct {
	name, yaml, want string
}{
	{"empty file", "", "bad.yaml: empty file, want one YAML document per domain"},
	{"only comments", "# nothing\n", "bad.yaml: empty file, want one YAML document per domain"},
	{"empty document", "domain: api\n---\n", "bad.yaml:3: empty document, want a mapping with a domain"},
	{"not a mapping", "- api\n", "bad.yaml:1: want a mapping with a domain, got a list"},
	{"malformed", "domain: api\n  regions: [a]\n", "bad.yaml:2: malformed YAML: mapping values are not allowed in this context"},
	{"malformed flow", "domain: [api\n", "bad.yaml:1: malformed YAML: did not find expected ',' or ']'"},
	{"unknown top field", "domain: api\nregion: [a]\n",
		"bad.yaml:2: region: unknown field, want one of domain, regions, plans, assign, limits, overrides, allow_refunds"},
	{"missing domain", "regions: [a]\n", "bad.yaml:1: domain: missing, want a name such as api"},
	{"bad domain name", "domain: API\n", `bad.yaml:1: domain: invalid name "API", want [a-z0-9][a-z0-9_.-]* of at most 64 characters`},
	{"duplicate domain", "domain: api\n---\ndomain: api\n", `bad.yaml:3: domain: duplicate domain "api", first defined at line 1`},
	{"duplicate region", "domain: api\nregions: [a, a]\n", `bad.yaml:2: regions[1]: duplicate region "a"`},
	{"alias", "domain: &d api\nregions: [*d]\n", "bad.yaml:2: regions[0]: want a string, got an alias (YAML aliases are not supported)"},
	{"limits not a list", head + "limits: {name: a}\n", "bad.yaml:3: limits: want a list, got a mapping"},
	{"limit not a mapping", limit + "  - 5\n", `bad.yaml:6: limits[1]: want a mapping, got "5"`},
	{"unknown limit field", limit + "    brust: 5\n",
		"bad.yaml:6: limits[0].brust: unknown field, want one of name, match, unit, rate, burst, algorithm, mode, enforcement, floors, on_failure, shadow, concurrency, sync_interval, stale_after, limits"},
	{"duplicate field", limit + "    rate: 20/1m\n", "bad.yaml:6: limits[0].rate: duplicate key, first at line 5"},
	{"missing name", head + "limits:\n  - rate: 1/s\n", "bad.yaml:4: limits[0].name: missing, want a name such as per-user"},
	{"invalid name", head + "limits:\n  - name: Per_User\n    rate: 1/s\n",
		`bad.yaml:4: limits[0].name: invalid name "Per_User", want [a-z0-9][a-z0-9_.-]* of at most 64 characters`},
	{"long name", head + "limits:\n  - name: " + strings.Repeat("a", 65) + "\n    rate: 1/s\n",
		`bad.yaml:4: limits[0].name: invalid name "` + strings.Repeat("a", 65) + `", want [a-z0-9][a-z0-9_.-]* of at most 64 characters`},
	{"name not a string", head + "limits:\n  - name: [a]\n    rate: 1/s\n", "bad.yaml:4: limits[0].name: want a string, got a list"},
	{"duplicate name", limit + "  - name: a\n    rate: 1/s\n", `bad.yaml:6: limits[1].name: duplicate limit name "a", first used by limits[0]`},
	{"duplicate nested name", limit + "    limits:\n      - name: a\n        rate: 1/s\n",
		`bad.yaml:7: limits[0].limits[0].name: duplicate limit name "a", first used by limits[0]`},
	{"missing rate", head + "limits:\n  - name: a\n", "bad.yaml:4: limits[0].rate: missing, want AMOUNT/PERIOD such as 1000/1m"},
	{"bad rate", head + "limits:\n  - name: a\n    rate: abc\n",
		`bad.yaml:5: limits[0].rate: bad rate "abc": want AMOUNT/PERIOD such as 1000/1m`},
	{"zero rate", head + "limits:\n  - name: a\n    rate: 0/1m\n",
		`bad.yaml:5: limits[0].rate: bad rate "0/1m": amount: want a positive integer with optional k, M or G suffix, got "0"`},
	{"nested bad rate", limit + "    limits:\n      - name: b\n        rate: 10/1y\n",
		`bad.yaml:8: limits[0].limits[0].rate: bad rate "10/1y": period: want a unit ms, s, m, h or d, got "1y"`},
	{"zero burst", limit + "    burst: 0\n", "bad.yaml:6: limits[0].burst: want an integer in [1, 1125899906842624], got 0"},
	{"huge burst", limit + "    burst: 1125899906842625\n",
		"bad.yaml:6: limits[0].burst: want an integer in [1, 1125899906842624], got 1125899906842625"},
	{"fractional burst", limit + "    burst: 1.5\n", `bad.yaml:6: limits[0].burst: want an integer, got "1.5"`},
	{"burst for sliding window", limit + "    algorithm: sliding_window\n    burst: 10\n",
		"bad.yaml:7: limits[0].burst: does not apply to sliding_window, remove it"},
	{"unknown algorithm", limit + "    algorithm: leaky\n",
		`bad.yaml:6: limits[0].algorithm: unknown value "leaky", want one of token_bucket, gcra, sliding_window`},
	{"unknown mode", limit + "    mode: global\n", `bad.yaml:6: limits[0].mode: unknown value "global", want one of split, shared`},
	{"unknown enforcement", limit + "    enforcement: strict\n",
		`bad.yaml:6: limits[0].enforcement: unknown value "strict", want one of local, leased, exact`},
	{"unknown on_failure", limit + "    on_failure: retry\n",
		`bad.yaml:6: limits[0].on_failure: unknown value "retry", want one of local, open, closed`},
	{"unknown unit", limit + "    unit: bytes\n", `bad.yaml:6: limits[0].unit: unknown value "bytes", want one of requests, tokens`},
	{"bad shadow", limit + "    shadow: maybe\n", `bad.yaml:6: limits[0].shadow: want true or false, got "maybe"`},
	{"unknown floor region", limit + "    floors: {us-west: 0.1}\n",
		`bad.yaml:6: limits[0].floors.us-west: unknown region "us-west", want one of us-east, eu-west`},
	{"floor above 1", limit + "    floors: {us-east: 1.5}\n", "bad.yaml:6: limits[0].floors.us-east: want a number in [0, 1], got 1.5"},
	{"negative floor", limit + "    floors: {us-east: -0.1}\n", "bad.yaml:6: limits[0].floors.us-east: want a number in [0, 1], got -0.1"},
	{"floors sum", limit + "    floors:\n      us-east: 0.6\n      eu-west: 0.5\n", "bad.yaml:6: limits[0].floors: floors sum to 1.1, want at most 1"},
	{"floors without regions", "domain: api\nlimits:\n  - name: a\n    rate: 10/1m\n    floors: {us-east: 0.5}\n",
		"bad.yaml:5: limits[0].floors: floors need a regions list in the domain"},
	{"empty match key", limit + "    match: {\"\": x}\n", "bad.yaml:6: limits[0].match: empty key"},
	{"empty match value", limit + "    match: {user: \"\"}\n",
		`bad.yaml:6: limits[0].match.user: empty value, want a value, "*" or a prefix ending in "*"`},
	{"null match value", limit + "    match: {user: }\n",
		`bad.yaml:6: limits[0].match.user: empty value, want a value, "*" or a prefix ending in "*"`},
	{"duplicate match key", limit + "    match: {user: a, user: b}\n", "bad.yaml:6: limits[0].match.user: duplicate key, first at line 6"},
	{"child repeats parent key", limit + "    match: {user: \"*\"}\n    limits:\n      - name: b\n        match: {user: x}\n        rate: 1/s\n",
		`bad.yaml:9: limits[0].limits[0].match.user: repeats key "user" of its parent limit`},
	{"negative concurrency", limit + "    unit: tokens\n    concurrency: -1\n",
		"bad.yaml:7: limits[0].concurrency: want an integer in [0, 1000000], got -1"},
	{"huge concurrency", limit + "    unit: tokens\n    concurrency: 1000001\n",
		"bad.yaml:7: limits[0].concurrency: want an integer in [0, 1000000], got 1000001"},
	{"concurrency on requests", limit + "    concurrency: 5\n",
		"bad.yaml:6: limits[0].concurrency: applies only to unit: tokens (it caps in-flight reservations)"},
	{"shared period too short", head + "limits:\n  - name: a\n    rate: 10/500ms\n    mode: shared\n",
		"bad.yaml:5: limits[0].rate: period 500ms is too short for its sync interval 250ms in shared mode, want at least 4 × sync_interval = 1s"},
	{"sync interval too short", limit + "    sync_interval: 5ms\n",
		"bad.yaml:6: limits[0].sync_interval: want a duration in [10ms, 1m0s], got 5ms"},
	{"sync interval too long", limit + "    sync_interval: 2m\n",
		"bad.yaml:6: limits[0].sync_interval: want a duration in [10ms, 1m0s], got 2m0s"},
	{"bad duration", limit + "    sync_interval: 250\n", `bad.yaml:6: limits[0].sync_interval: want a duration such as 250ms, got "250"`},
	{"stale before sync", limit + "    sync_interval: 1s\n    stale_after: 500ms\n",
		"bad.yaml:7: limits[0].stale_after: want at least sync_interval (1s), got 500ms"},
	{"zero multiplier", head + "plans:\n  pro: {multiplier: 0}\n", "bad.yaml:4: plans.pro.multiplier: want a number in (0, 1000000], got 0"},
	{"huge multiplier", head + "plans:\n  pro: {multiplier: 2e6}\n", "bad.yaml:4: plans.pro.multiplier: want a number in (0, 1000000], got 2e+06"},
	{"missing multiplier", head + "plans:\n  pro: {}\n", "bad.yaml:4: plans.pro.multiplier: missing, want a number in (0, 1000000]"},
	{"multiplier not a number", head + "plans:\n  pro: {multiplier: ten}\n", `bad.yaml:4: plans.pro.multiplier: want a number, got "ten"`},
	{"unknown plan", head + "plans:\n  pro: {multiplier: 2}\nassign:\n  - {match: {tenant: a}, plan: gold}\n",
		`bad.yaml:6: assign[0].plan: unknown plan "gold", want one of pro`},
	{"override with neither", limit + "overrides:\n  - {match: {user: x}}\n",
		"bad.yaml:7: overrides[0]: want exactly one of rate and multiplier, got neither"},
	{"override with both", limit + "overrides:\n  - {match: {user: x}, rate: 1/s, multiplier: 2}\n",
		"bad.yaml:7: overrides[0]: want exactly one of rate and multiplier, got both"},
	{"override of unknown limit", limit + "overrides:\n  - {limit: b, match: {user: x}, multiplier: 2}\n",
		`bad.yaml:7: overrides[0].limit: unknown limit "b"`},
	{"override multiplier", limit + "overrides:\n  - {match: {user: x}, multiplier: -1}\n",
		"bad.yaml:7: overrides[0].multiplier: want a number in (0, 1000000], got -1"},
	{"override bad rate", limit + "overrides:\n  - {match: {user: x}, rate: 5}\n",
		`bad.yaml:7: overrides[0].rate: bad rate "5": want AMOUNT/PERIOD such as 1000/1m`},
	{"override bad expires", limit + "overrides:\n  - {match: {user: x}, multiplier: 2, expires: 2026-12-01}\n",
		`bad.yaml:7: overrides[0].expires: want an RFC 3339 time such as 2026-12-01T00:00:00Z, got "2026-12-01"`},
	{"several errors, sorted by line", "domain: api\nlimits:\n  - name: a\n    rate: 1/s\n    burst: 0\n---\nlimits:\n  - name: b\n    mode: both\n",
		"bad.yaml:5: limits[0].burst: want an integer in [1, 1125899906842624], got 0\n" +
			"bad.yaml:7: domain: missing, want a name such as api\n" +
			"bad.yaml:8: limits[0].rate: missing, want AMOUNT/PERIOD such as 1000/1m\n" +
			`bad.yaml:9: limits[0].mode: unknown value "both", want one of split, shared`},
	{"malformed second document", "domain: api\nlimits: [{name: Bad, rate: 1/s}]\n---\ndomain: [\n",
		`bad.yaml:2: limits[0].name: invalid name "Bad", want [a-z0-9][a-z0-9_.-]* of at most 64 characters` + "\n" +
			"bad.yaml:4: malformed YAML: did not find expected node content"},
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range badConfigs {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error, want %q (config %+v)", tc.want, cfg)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error\n got: %s\nwant: %s", got, tc.want)
			}
			if cfg != nil {
				t.Errorf("config %+v returned with an error", cfg)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("errors.Is(%v, ErrConfig) = false", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.File != "bad.yaml" {
				t.Errorf("errors.As(*ConfigError) = %v, %+v", ce != nil, ce)
			}
		})
	}
}

func TestLoadConfigFileExample(t *testing.T) {
	cfg, err := LoadConfigFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != "testdata/example.yaml" || len(cfg.Domains) != 1 {
		t.Fatalf("got source %q, %d domains", cfg.Source, len(cfg.Domains))
	}
	d := cfg.Domain("api")
	if d == nil || cfg.Domain("llm") != nil {
		t.Fatalf("Domain(api) = %v, Domain(llm) = %v", d, cfg.Domain("llm"))
	}
	user := Match{{Key: "user", Value: "*"}}
	want := Domain{
		Name:    "api",
		Regions: []string{"us-east", "eu-west", "ap-south"},
		Plans:   map[string]Plan{"free": {Name: "free", Multiplier: 1}, "pro": {Name: "pro", Multiplier: 10}},
		Assignments: []PlanAssignment{
			{Match: Match{{Key: "tenant", Value: "acme"}}, Plan: "pro"},
		},
		Limits: []*Limit{{
			Name:         "per-user",
			Match:        user,
			Rate:         Rate{Amount: 1000, Period: time.Minute},
			Burst:        200,
			Enforcement:  Leased,
			Floors:       map[string]float64{"us-east": 0.1, "eu-west": 0.1, "ap-south": 0.05},
			SyncInterval: 250 * time.Millisecond,
			StaleAfter:   750 * time.Millisecond,
		}, {
			Name:         "per-user-chat",
			Match:        append(user, Entry{Key: "route", Value: "/v1/chat"}),
			Rate:         Rate{Amount: 100, Period: time.Minute},
			Burst:        100,
			SyncInterval: 250 * time.Millisecond,
			StaleAfter:   750 * time.Millisecond,
		}, {
			Name:         "per-tenant-tokens",
			Match:        Match{{Key: "tenant", Value: "*"}},
			Unit:         Tokens,
			Rate:         Rate{Amount: 2_000_000, Period: time.Minute},
			Burst:        2_000_000,
			Concurrency:  200,
			SyncInterval: 250 * time.Millisecond,
			StaleAfter:   750 * time.Millisecond,
		}},
		Overrides: []Override{
			{Limit: "per-user", Match: Match{{Key: "user", Value: "42"}}, Multiplier: 5, Expires: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
			{Match: Match{{Key: "tenant", Value: "bigco"}}, Rate: Rate{Amount: 10_000_000, Period: time.Minute}},
		},
	}
	got := *d
	got.idx = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("domain\n got: %+v\nwant: %+v", got, want)
		for i := range min(len(got.Limits), len(want.Limits)) {
			if !reflect.DeepEqual(got.Limits[i], want.Limits[i]) {
				t.Errorf("limit %d\n got: %+v\nwant: %+v", i, got.Limits[i], want.Limits[i])
			}
		}
	}
	if l := d.Limit("per-user-chat"); l != d.Limits[1] || d.Limit("nope") != nil {
		t.Errorf("Limit(per-user-chat) = %p, want %p; Limit(nope) = %v", l, d.Limits[1], d.Limit("nope"))
	}
	if err := d.Validate(); err != nil {
		t.Errorf("Validate of a loaded domain: %v", err)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig("d.yaml", []byte(`
domain: api
limits:
  - {name: a, rate: 5/s}
  - {name: b, rate: 50/10s, algorithm: sliding_window, sync_interval: 1s, mode: shared, match: {user: 42}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Domains[0].Limits[0], cfg.Domains[0].Limits[1]
	want := Limit{Name: "a", Rate: Rate{Amount: 5, Period: time.Second}, Burst: 5, SyncInterval: 250 * time.Millisecond, StaleAfter: 750 * time.Millisecond}
	if !reflect.DeepEqual(*a, want) {
		t.Errorf("defaults\n got: %+v\nwant: %+v", *a, want)
	}
	if b.Burst != 50 || b.StaleAfter != 3*time.Second || b.Match.String() != "user=42" {
		t.Errorf("got burst %d, stale_after %v, match %v; want 50, 3s, user=42", b.Burst, b.StaleAfter, b.Match)
	}
}

func TestParseConfigDocuments(t *testing.T) {
	cfg, err := ParseConfig("two.yaml", []byte(`---
domain: api
limits: [{name: a, rate: 1/s}]
---
# the LLM gateway
domain: llm
limits: [{name: a, rate: 1M/1m, unit: tokens}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Domains) != 2 || cfg.Domains[0].Name != "api" || cfg.Domains[1].Name != "llm" {
		t.Fatalf("domains %+v", cfg.Domains)
	}
	if l := cfg.Domain("llm").Limit("a"); l == nil || l.Unit != Tokens {
		t.Errorf("llm limit a = %+v", l)
	}
}

func TestLoadConfigFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := LoadConfigFile(path)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrConfig) {
		t.Fatalf("got %v, want a not-exist error that is not ErrConfig", err)
	}
	if want := "allot: load config: open " + path + ": no such file or directory"; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
}

func TestLoadConfigFileBad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte("domain: api\nlimits: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfigFile(path)
	if want := path + `:2: limits: want a list, got "5"`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

func TestValidate(t *testing.T) {
	good := func() *Domain {
		return &Domain{
			Name:    "api",
			Regions: []string{"us", "eu"},
			Plans:   map[string]Plan{"pro": {Name: "pro", Multiplier: 2}},
			Limits: []*Limit{{
				Name: "a", Match: Match{{Key: "user", Value: "*"}}, Rate: Rate{Amount: 10, Period: time.Second}, Burst: 10,
				Floors: map[string]float64{"us": 0.5}, SyncInterval: time.Second, StaleAfter: time.Second,
			}},
			Assignments: []PlanAssignment{{Match: Match{{Key: "tenant", Value: "acme"}}, Plan: "pro"}},
			Overrides:   []Override{{Limit: "a", Match: Match{{Key: "user", Value: "42"}}, Multiplier: 3}},
		}
	}
	d := good()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := d.Effective(d.Limits[0], Descriptor{{"tenant", "acme"}, {"user", "42"}}, time.Time{}); got.Rate.Amount != 60 {
		t.Errorf("Effective after Validate = %+v, want amount 60", got)
	}

	bad := good()
	bad.Regions = append(bad.Regions, "us")
	bad.Limits = append(bad.Limits, &Limit{Name: "a", Match: Match{{Key: "k", Value: "v"}, {Key: "k", Value: ""}},
		Unit: Unit(7), Burst: 1, Floors: map[string]float64{"mars": 0}})
	bad.Overrides = append(bad.Overrides, Override{Match: Match{{Key: "", Value: "x"}}})
	want := strings.Join([]string{
		`regions[2]: duplicate region "us"`,
		`limits[1].match.k: empty value, want a value, "*" or a prefix ending in "*"`,
		"limits[1].unit: unknown value 7, want one of requests, tokens",
		"limits[1].sync_interval: want a duration in [10ms, 1m0s], got 0s",
		"limits[1].rate: missing, want AMOUNT/PERIOD such as 1000/1m",
		`limits[1].floors.mars: unknown region "mars", want one of us, eu, us`,
		`limits[1].name: duplicate limit name "a", first used by limits[0]`,
		"overrides[1].match: empty key",
		"overrides[1].multiplier: want a number in (0, 1000000], got 0",
	}, "\n")
	err := bad.Validate()
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	if !errors.Is(err, ErrConfig) {
		t.Errorf("errors.Is(%v, ErrConfig) = false", err)
	}
}

// FuzzParseConfig checks that any input gives a valid config or an error,
// never a panic.
func FuzzParseConfig(f *testing.F) {
	example, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(example))
	for _, tc := range badConfigs {
		f.Add(tc.yaml)
	}
	for _, src := range boundsSeeds() {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, data string) {
		cfg, err := ParseConfig("fuzz.yaml", []byte(data))
		if err != nil {
			if cfg != nil || !errors.Is(err, ErrConfig) {
				t.Fatalf("got config %v and error %v", cfg, err)
			}
			return
		}
		for _, d := range cfg.Domains {
			names := map[string]bool{}
			for _, l := range d.Limits {
				if names[l.Name] {
					t.Fatalf("duplicate limit name %q", l.Name)
				}
				names[l.Name] = true
				checkBounds(t, l.Match)
				if l.SyncInterval < minSyncInterval || l.SyncInterval > maxSyncInterval || l.StaleAfter < l.SyncInterval || l.StaleAfter > maxStaleAfter {
					t.Fatalf("limit %+v: sync_interval %v, stale_after %v", l, l.SyncInterval, l.StaleAfter)
				}
				if l.Unlimited {
					continue // no budget: an Envoy allow-list entry
				}
				if err := l.Rate.Validate(); err != nil || l.Burst < 1 || l.Burst > MaxAmount {
					t.Fatalf("limit %+v: rate error %v, burst %d", l, err, l.Burst)
				}
				if e := d.Effective(l, Descriptor{{"user", "42"}, {"tenant", "acme"}}, time.Time{}); e.Rate.Validate() != nil || e.Burst < 1 || e.Burst > MaxAmount {
					t.Fatalf("limit %+v: Effective %+v", l, e)
				}
			}
		}
	})
}
