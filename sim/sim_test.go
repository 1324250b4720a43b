package sim

import (
	"bytes"
	"cmp"
	"math"
	"path/filepath"
	"testing"
	"time"
)

// TestScenarios runs every scenario file, in its short form when it has
// one, and fails on a failed assertion.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			sc, cfg, err := Load(file)
			if err != nil {
				t.Fatal(err)
			}
			sc.Shorten()
			res, err := Run(sc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := res.Markdown(&b); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + b.String())
			for _, c := range res.Failed() {
				if c.Known != "" {
					t.Errorf("%s %s %g passes (got %.3f): remove its known-failure marker", c.System, c.Assert.Check, c.Value, c.Got)
				} else {
					t.Errorf("%s %s %g: got %.3f", c.System, c.Assert.Check, c.Value, c.Got)
				}
			}
		})
	}
}

// TestDeterministic: the same scenario and seed give the same report,
// byte for byte; another seed gives another.
func TestDeterministic(t *testing.T) {
	report := func(file string, seed uint64) string {
		sc, cfg, err := Load(file)
		if err != nil {
			t.Fatal(err)
		}
		sc.Seed = seed
		if sc.Short == nil || sc.Short.Duration == 0 || sc.Short.Duration > 25*time.Second {
			sc.Short = cmp.Or(sc.Short, &Short{})
			sc.Short.Duration = 25 * time.Second // every fault of these scenarios starts within it
		}
		sc.Shorten()
		res, err := Run(sc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := res.Markdown(&b); err != nil {
			t.Fatal(err)
		}
		if err := res.JSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	for _, file := range []string{"coordinator-failover.yaml", "rebalance-many-keys.yaml", "partition-shared.yaml", "borrow.yaml",
		"store-outage.yaml", "clock-skew-shared.yaml", "token-budget-split.yaml", "scale.yaml"} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			file := "scenarios/" + file
			a, b := report(file, 7), report(file, 7)
			if a != b {
				t.Fatalf("%s: two runs with seed 7 differ", file)
			}
			if report(file, 8) == a {
				t.Fatalf("%s: seeds 7 and 8 give the same report", file)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const cfg = `config: |
  domain: api
  regions: [us, eu]
  limits:
    - {name: l, match: {user: "*"}, rate: 10/1s}
regions: [{name: us}, {name: eu}]
`
	for _, c := range []struct{ name, yaml string }{
		{"no duration", cfg},
		{"unknown field", cfg + "duration: 1s\nbogus: 1\n"},
		{"unknown region", cfg + "duration: 1s\ntraffic: [{region: ap, rate: 1}]\n"},
		{"bad fault", cfg + "duration: 1s\nfaults: [{kind: meteor, for: 1s}]\n"},
		{"bad check", cfg + "duration: 1s\nassert: [{check: be_fast}]\n"},
		{"bad shape", cfg + "duration: 1s\ntraffic: [{region: us, rate: 1, shape: square, period: 1s}]\n"},
		{"diurnal without period", cfg + "duration: 1s\ntraffic: [{region: us, rate: 1, shape: diurnal}]\n"},
		{"burst longer than its period", cfg + "duration: 1s\ntraffic: [{region: us, rate: 1, shape: burst, period: 1s, on: 2s}]\n"},
		{"llm on a limit of requests", cfg + "duration: 1s\ntraffic: [{region: us, rate: 1, llm: {output_median: 10}}]\n"},
		{"entry the limit does not match", cfg + "duration: 1s\ntraffic: [{region: us, rate: 1, entry: tenant}]\n"},
		{"store outage without a store", cfg + "duration: 1s\nfaults: [{kind: store_outage, region: us, for: 1s}]\n"},
		{"clock skew of 0", cfg + "duration: 1s\nfaults: [{kind: clock_skew, region: us}]\n"},
		{"assert on an unknown region", cfg + "duration: 1s\nassert: [{check: never_above_limit, region: ap}]\n"},
		{"negative arrival tick", cfg + "duration: 1s\narrival_tick: -1ms\n"},
	} {
		if _, _, err := Parse(c.name, []byte(c.yaml)); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if _, _, err := Parse("ok", []byte(cfg+"duration: 1s\n")); err != nil {
		t.Errorf("valid scenario: %v", err)
	}
	ok := cfg + `duration: 10s
traffic: [{region: us, rate: 10, shape: diurnal, period: 5s, amplitude: 0.5}, {region: eu, rate: 10, shape: burst, period: 2s, on: 1s}]
faults: [{kind: clock_skew, region: eu, skew: -300ms}]
`
	sc, _, err := Parse("shapes and skew", []byte(ok))
	if err != nil {
		t.Fatalf("valid scenario: %v", err)
	}
	if f := sc.Faults[0]; f.For != 10*time.Second {
		t.Errorf("clock skew without for: got %v, want to the end (10s)", f.For)
	}
}

// A diurnal stream offers its mean rate over whole periods and follows
// its sine; a burst stream offers its rate only while on.
func TestShapes(t *testing.T) {
	sc, cfg, err := Parse("shapes", []byte(`config: |
  domain: api
  regions: [us]
  limits:
    - {name: l, match: {user: "*"}, rate: 1000000/1s}
regions: [{name: us}]
duration: 40s
traffic:
  - {region: us, rate: 1000, shape: diurnal, period: 20s, amplitude: 0.8}
  - {region: us, rate: 1000, shape: burst, period: 10s, on: 2s, entry: user, keys: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	keys := newKeySpace(sc, cfg.Domains[0].Limit(sc.Limit))
	w := &world{sc: sc, keys: keys, region: []*region{{name: "us", inst: []*instance{{}}}}}
	for i, want := range []struct {
		total             float64
		quarter, tquarter float64 // arrivals in [0, 5s) and [10s, 15s)
	}{
		{40000, 5000 * (1 + 0.8*2/math.Pi), 5000 * (1 - 0.8*2/math.Pi)}, // ∫ sin over a quarter period = 2/π of it
		{8000, 2000, 2000},
	} {
		s := w.newStream(i)
		var total, q, tq float64
		for s.next.Before(s.end) {
			if _, ok := s.draw(); ok {
				total++
				switch at := s.next.Sub(T0); {
				case at < 5*time.Second:
					q++
				case at >= 10*time.Second && at < 15*time.Second:
					tq++
				}
			}
			s.advance()
		}
		for _, c := range []struct{ got, want float64 }{{total, want.total}, {q, want.quarter}, {tq, want.tquarter}} {
			if math.Abs(c.got-c.want) > 4*math.Sqrt(c.want) {
				t.Errorf("stream %d: %v arrivals, want %v ± 4σ", i, c.got, c.want)
			}
		}
	}
}
