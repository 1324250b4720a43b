package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimWritesReport(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"sim", "run", "../../sim/scenarios/coordinator-failover.yaml", "--out", dir, "--seed", "3"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, name := range []string{"report.md", "summary.json", "shares.png", "admitted.png"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "seed 3,") {
		t.Errorf("report.md does not use --seed 3:\n%.300s", md)
	}
}

func TestSimFailsOnAssertion(t *testing.T) {
	data, err := os.ReadFile("../../sim/scenarios/coordinator-failover.yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "strict.yaml")
	strict := string(data) + "  - {check: utilization_min_pct, value: 100.5}\n"
	if err := os.WriteFile(file, []byte(strict), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err = run(context.Background(), []string{"sim", file}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "utilization_min_pct 100.5") {
		t.Fatalf("want the failed assertion named, got %v", err)
	}
}

// A store outage drives real Enforcers over a failing store: the summary
// has the figures the issue asks for, globally and per region.
func TestSimStoreOutageSummary(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"sim", "run", "../../sim/scenarios/store-outage-closed.yaml", "--out", dir, "--short"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Systems []map[string]any `json:"systems"`
	}
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatal(err)
	}
	fields := []string{"overshoot_max_pct", "overshoot_windows", "false_reject_pct", "utilization_pct", "convergence_s", "messages_per_s", "store_calls_per_request"}
	for _, s := range sum.Systems {
		for _, f := range fields {
			if _, ok := s[f]; !ok {
				t.Errorf("%s: no %s", s["system"], f)
			}
		}
		us, _ := s["by_region"].(map[string]any)["us"].(map[string]any)
		for _, f := range fields {
			if _, ok := us[f]; !ok {
				t.Errorf("%s us: no %s", s["system"], f)
			}
		}
		if s["system"] == "allot" && !(us["store_calls_per_request"].(float64) > 0) {
			t.Errorf("allot us: no store calls: %v", us["store_calls_per_request"])
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"sim", "table", filepath.Join(dir, "summary.json")}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| store-outage-closed | allot |") || !strings.Contains(out.String(), "| store-outage-closed | naive |") {
		t.Errorf("sim table:\n%s", out.String())
	}
}
