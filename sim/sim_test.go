package sim

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestScenarios runs every scenario file and fails on a failed assertion.
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
	for _, file := range []string{"coordinator-failover.yaml", "rebalance-many-keys.yaml", "partition-shared.yaml", "borrow.yaml"} {
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
	} {
		if _, _, err := Parse(c.name, []byte(c.yaml)); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if _, _, err := Parse("ok", []byte(cfg+"duration: 1s\n")); err != nil {
		t.Errorf("valid scenario: %v", err)
	}
}
