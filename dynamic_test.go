package allot

import (
	"errors"
	"testing"
	"time"
)

func TestWithDynamic(t *testing.T) {
	cfg, err := ParseConfig("plans.yaml", []byte(plansConfig("10", "5000/1m", "1000/1m")))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	acme := Match{{Key: "tenant", Value: "acme"}}
	dyn := Dynamic{
		Overrides: map[string][]Override{
			"api": {
				{Limit: "per-tenant", Match: acme, Multiplier: 3},
				{Limit: "nope", Match: acme, Multiplier: 3},
			},
			"gone": {{Match: acme, Multiplier: 2}},
		},
		Assignments: map[string][]PlanAssignment{"api": {{Match: acme, Plan: "pro"}, {Match: acme, Plan: "gold"}}},
	}
	got, err := cfg.WithDynamic(dyn)
	want := `gone: override tenant=acme: unknown domain
api: plan assignment tenant=acme → gold: plan: unknown plan "gold", want one of free, pro
api: override tenant=acme on nope: limit: unknown limit "nope"`
	if err == nil || err.Error() != want {
		t.Fatalf("error\n got: %v\nwant: %s", err, want)
	}
	if !errors.Is(err, ErrConfig) {
		t.Errorf("errors.Is(err, ErrConfig) = false")
	}
	d := got.Domain("api")
	if len(d.Overrides) != 1 || len(d.Assignments) != 1 {
		t.Fatalf("kept %d overrides, %d assignments; want 1 and 1", len(d.Overrides), len(d.Assignments))
	}
	// pro ×10, then the override ×3.
	if e := d.Effective(d.Limit("per-tenant"), Descriptor(acme), now); e.Rate.Amount != 30000 {
		t.Errorf("effective rate %v, want 30000/1m", e.Rate)
	}
	if len(cfg.Domains[0].Overrides) != 0 || len(cfg.Domains[0].Assignments) != 0 {
		t.Errorf("the original config was changed")
	}

	same, err := cfg.WithDynamic(Dynamic{})
	if err != nil || same.Domains[0] != cfg.Domains[0] {
		t.Errorf("WithDynamic(empty) = %v, %v: want the same domains", same, err)
	}
}
