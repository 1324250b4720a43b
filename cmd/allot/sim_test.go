package main

import (
	"bytes"
	"context"
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
