package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/allot-dev/allot/sim"
	"github.com/allot-dev/allot/sim/report"
)

// runSim: allot sim [run] FILE --out DIR [--seed N]. It writes
// DIR/report.md and DIR/summary.json and fails when an assertion fails.
func runSim(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allot sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory for report.md and summary.json (default: print the report)")
	seed := fs.Uint64("seed", 0, "seed instead of the scenario's")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot sim [run] SCENARIO.yaml [--out DIR] [--seed N]")
		fs.PrintDefaults()
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if file == "" || fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("sim: want one scenario file")
	}
	sc, cfg, err := sim.Load(file)
	if err != nil {
		return err
	}
	if *seed != 0 {
		sc.Seed = *seed
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
			msgs = append(msgs, fmt.Sprintf("%s %s %g: got %.3f", c.System, c.Assert.Check, c.Value, c.Got))
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
