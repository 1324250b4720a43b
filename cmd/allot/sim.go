package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/allot-dev/allot/sim"
	"github.com/allot-dev/allot/sim/report"
)

// runSim: allot sim [run] FILE --out DIR [--seed N] [--short]. It writes
// DIR/report.md, DIR/summary.json and the plots, and fails when an
// assertion fails. allot sim table FILE... is simTable.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "table" {
		return simTable(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	fs := newFlagSet("allot sim", "usage: allot sim [run] SCENARIO.yaml [--out DIR] [--seed N] [--short]\n"+
		"       allot sim table DIR/summary.json ...   (the figures of several runs as one markdown table)", stderr)
	out := fs.String("out", "", "directory for report.md and summary.json (default: print the report)")
	seed := fs.Uint64("seed", 0, "seed instead of the scenario's")
	short := fs.Bool("short", false, "run the scenario's short form (what go test runs)")
	pos, err := parseArgs(fs, args, stdout, 1, 1)
	if err != nil {
		return err
	}
	file := pos[0]
	sc, cfg, err := sim.Load(file)
	if err != nil {
		return err
	}
	if *seed != 0 {
		sc.Seed = *seed
	}
	if *short {
		sc.Shorten()
	}
	res, err := sim.Run(sc, cfg)
	if err != nil {
		return err
	}
	var md, js bytes.Buffer
	if err := res.Markdown(&md); err != nil {
		return err
	}
	if err := res.JSON(&js); err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(md.Bytes())
	} else {
		files, perr := report.Plots(res)
		if perr != nil {
			return fmt.Errorf("sim: plots: %w", perr)
		}
		files["report.md"], files["summary.json"] = md.Bytes(), js.Bytes()
		err = writeFiles(*out, files)
		fmt.Fprintf(stdout, "wrote %s\n", *out)
	}
	if err != nil {
		return err
	}
	if failed := res.Failed(); len(failed) > 0 {
		var msgs []string
		for _, c := range failed {
			who := c.System
			if c.Region != "" {
				who += " (" + c.Region + ")"
			}
			msg := fmt.Sprintf("%s %s %g: got %.3f", who, c.Assert.Check, c.Value, c.Got)
			if c.Known != "" {
				msg += " (a known failure that now passes: remove its marker)"
			}
			msgs = append(msgs, msg)
		}
		return fmt.Errorf("sim %s: assertions failed: %s", sc.Name, strings.Join(msgs, "; "))
	}
	return nil
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// simTable prints the figures of several summary.json files as one
// markdown table: a row per scenario and system.
func simTable(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot sim table", "usage: allot sim table DIR/summary.json ...\n\nPrints the figures of several runs (allot sim run --out DIR) as one markdown table.", stderr)
	files, err := parseArgs(fs, args, stdout, 1, -1)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("| scenario | system | overshoot max % | windows above L | false rejects % | utilisation % | convergence (s) | messages/s | store calls/request |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var res sim.Result
		if err := json.Unmarshal(data, &res); err != nil {
			return fmt.Errorf("sim table: %s: %w", file, err)
		}
		for _, f := range res.Systems {
			fmt.Fprintf(&b, "| %s | %s | %.2f | %d | %.2f | %.2f | %s | %.1f | %.4f |\n", res.Scenario, f.System, f.OvershootMaxPct,
				f.OvershootWindows, f.FalseRejectPct, f.UtilizationPct, sim.Seconds(f.ConvergenceS), f.MessagesPerS, f.StoreCallsPerRequest)
		}
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}
