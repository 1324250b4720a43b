package allot

import (
	"strings"
	"testing"
)

// plansYAML is a domain whose plan pro promises a floor on per-tenant;
// its lines 5 and 6 are the plan and the limit's rate.
const plansYAML = `domain: api
regions: [us-east, eu-west]
plans:
  free: {multiplier: 1}
  pro: {multiplier: MULT, floors: {per-tenant: FLOOR}}
limits:
  - name: per-tenant
    match: {tenant: "*"}
    rate: RATE
  - name: everyone
    rate: 10/1s
`

func plansConfig(mult, floor, rate string) string {
	return strings.NewReplacer("MULT", mult, "FLOOR", floor, "RATE", rate).Replace(plansYAML)
}

func TestPlanFloors(t *testing.T) {
	for _, tc := range []struct {
		name, mult, floor, rate string
		want                    string // "" for valid
	}{
		{"met", "10", "5000/1m", "1000/1m", ""},
		{"met exactly, other period", "10", "10000/1m", "1000/1m", ""},
		{"met per second", "10", "100/1s", "600/1m", ""},
		{"multiplier lowered", "2", "5000/1m", "1000/1m",
			"plans.yaml:5: plans.pro.floors.per-tenant: plan pro sets per-tenant to 2000/m (1000/m × 2), below the plan's floor 5000/m"},
		{"rate lowered", "10", "5000/1m", "400/1m",
			"plans.yaml:5: plans.pro.floors.per-tenant: plan pro sets per-tenant to 4000/m (400/m × 10), below the plan's floor 5000/m"},
		{"unknown limit", "10", "5000/1m", "1000/1m", ""},
		{"bad floor", "10", "lots", "1000/1m", `plans.yaml:5: plans.pro.floors.per-tenant: bad rate "lots": want AMOUNT/PERIOD such as 1000/1m`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := plansConfig(tc.mult, tc.floor, tc.rate)
			if tc.name == "unknown limit" {
				src = strings.Replace(src, "floors: {per-tenant:", "floors: {per-team:", 1)
				tc.want = `plans.yaml:5: plans.pro.floors.per-team: unknown limit "per-team"`
			}
			_, err := ParseConfig("plans.yaml", []byte(src))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("error\n got: %v\nwant: %s", err, tc.want)
			}
		})
	}
}

func TestPlanFloorsValidate(t *testing.T) {
	cfg, err := ParseConfig("plans.yaml", []byte(plansConfig("10", "5000/1m", "1000/1m")))
	if err != nil {
		t.Fatal(err)
	}
	d := *cfg.Domains[0]
	d.Plans = map[string]Plan{"pro": {Name: "pro", Multiplier: 4, Floors: d.Plans["pro"].Floors}}
	want := "plans.pro.floors.per-tenant: plan pro sets per-tenant to 4000/m (1000/m × 4), below the plan's floor 5000/m"
	if err := d.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate = %v, want %s", err, want)
	}
}
