package main

import (
	"bytes"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// helpCommands are allot's commands and subcommands, each with the first
// line of its usage.
var helpCommands = []struct {
	args  []string
	usage string
}{
	{nil, "usage: allot COMMAND"},
	{[]string{"dev"}, "usage: allot dev [flags]"},
	{[]string{"demo"}, "usage: allot demo [flags]"},
	{[]string{"coordinator"}, "usage: allot coordinator --etcd ENDPOINTS [flags]"},
	{[]string{"regional"}, "usage: allot regional --config FILE --region NAME [flags]"},
	{[]string{"check"}, "usage: allot check [flags]"},
	{[]string{"validate"}, "usage: allot validate FILE..."},
	{[]string{"bench"}, "usage: allot bench --target ADDR [flags]"},
	{[]string{"sim"}, "usage: allot sim [run] SCENARIO.yaml"},
	{[]string{"sim", "run"}, "usage: allot sim [run] SCENARIO.yaml"},
	{[]string{"sim", "table"}, "usage: allot sim table DIR/summary.json"},
	{[]string{"cluster"}, "usage: allot cluster up|down|status [flags]"},
	{[]string{"cluster", "up"}, "usage: allot cluster up [flags]"},
	{[]string{"cluster", "down"}, "usage: allot cluster down [flags]"},
	{[]string{"cluster", "status"}, "usage: allot cluster status [flags]"},
	{[]string{"etcd"}, "usage: allot etcd [flags]"},
}

// TestHelp: -h, --help and help COMMAND print the command's usage to
// stdout and succeed, for every command, without doing anything else.
func TestHelp(t *testing.T) {
	for _, c := range helpCommands {
		for _, args := range [][]string{
			append(slices.Clone(c.args), "--help"),
			append(slices.Clone(c.args), "-h"),
			append([]string{"help"}, c.args...),
		} {
			var out, errb bytes.Buffer
			if err := run(t.Context(), args, &out, &errb); err != nil {
				t.Errorf("allot %s: %v, want success", strings.Join(args, " "), err)
			}
			if !strings.HasPrefix(out.String(), c.usage) {
				t.Errorf("allot %s: stdout\n%s\nwant the usage, %q...", strings.Join(args, " "), out.String(), c.usage)
			}
			if errb.Len() > 0 {
				t.Errorf("allot %s: stderr %q, want nothing", strings.Join(args, " "), errb.String())
			}
		}
	}
	// The table has every command.
	listed := map[string]bool{}
	for _, c := range helpCommands {
		if len(c.args) > 0 {
			listed[strings.Join(c.args, " ")] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(commands())) {
		if !listed[name] {
			t.Errorf("command %s: not in helpCommands", name)
		}
	}
	for name := range clusterCommands() {
		if !listed["cluster "+name] {
			t.Errorf("command cluster %s: not in helpCommands", name)
		}
	}
}

// TestHelpAmongFlags: --help wins wherever it is, after flags and
// arguments too, and the command does not run.
func TestHelpAmongFlags(t *testing.T) {
	for _, args := range [][]string{
		{"regional", "--region", "r", "--config", "/does/not/exist.yaml", "--help"},
		{"validate", "/does/not/exist.yaml", "-h"},
		{"check", "--count", "0", "--help"},
		{"sim", "run", "/does/not/exist.yaml", "--out", "/nowhere", "--help"},
		{"dev", "--help", "--log-level", "loud"},
		{"bench", "--target", "127.0.0.1:1", "--help"},
		{"bench", "--help=true"},
		{"demo", "-help=1"},
	} {
		var out, errb bytes.Buffer
		err := run(t.Context(), args, &out, &errb)
		if err != nil || !strings.HasPrefix(out.String(), "usage: allot "+args[0]) {
			t.Errorf("allot %s: %v, stdout %q: want the usage and success", strings.Join(args, " "), err, out.String())
		}
	}
}

// TestUsageErrors: unknown commands and flags and stray arguments fail
// with a message naming them; the usage goes to stderr, nothing to stdout.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"--nope", "dev"}, "flag provided but not defined: -nope"},
		{[]string{"help", "nope"}, `unknown command "nope"`},
		{[]string{"dev", "--nope"}, "dev: flag provided but not defined: -nope"},
		{[]string{"regional", "--nope=1"}, "regional: flag provided but not defined: -nope"},
		{[]string{"dev", "extra"}, `dev: unexpected argument "extra"`},
		{[]string{"coordinator", "--etcd", "127.0.0.1:1", "extra"}, `coordinator: unexpected argument "extra"`},
		{[]string{"validate"}, "validate: want at least 1 argument, got 0"},
		{[]string{"sim"}, "sim: want 1 argument, got 0"},
		{[]string{"sim", "a.yaml", "b.yaml"}, "sim: want 1 argument, got 2"},
		{[]string{"sim", "table"}, "sim table: want at least 1 argument, got 0"},
		{[]string{"cluster"}, "cluster: no command"},
		{[]string{"cluster", "sideways"}, `cluster: unknown command "sideways"`},
		{[]string{"cluster", "--dir", "x", "status"}, "cluster: flag provided but not defined: -dir"},
		{[]string{"cluster", "down", "extra"}, `cluster down: unexpected argument "extra"`},
		{[]string{"check", "--count"}, "check: flag needs an argument: -count"},
	} {
		var out, errb bytes.Buffer
		err := run(t.Context(), c.args, &out, &errb)
		if err == nil || err.Error() != c.want {
			t.Errorf("allot %s: %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
		if out.Len() > 0 || !strings.Contains(errb.String(), "usage: allot") {
			t.Errorf("allot %s: stdout %q, stderr %q: want the usage on stderr only", strings.Join(c.args, " "), out.String(), errb.String())
		}
	}
}

// TestFlagsAnywhere: a command's flags and arguments come in any order;
// "--" ends the flags.
func TestFlagsAnywhere(t *testing.T) {
	good := "../../deploy/examples/limits.yaml"
	for _, args := range [][]string{
		{"validate", good},
		{"validate", good, good},
		{"validate", "--", good},
		{"check", "--count", "2", "--descriptor=user=1"},
	} {
		var out, errb bytes.Buffer
		if err := run(t.Context(), args, &out, &errb); err != nil {
			t.Errorf("allot %s: %v\n%s", strings.Join(args, " "), err, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if err := run(t.Context(), []string{"validate", "--", "-not-a-flag.yaml"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "-not-a-flag.yaml") {
		t.Errorf("validate -- -not-a-flag.yaml: %v, want the file's error (read as a file, not a flag)", err)
	}
}

// TestBinaryExitCodes: help exits 0 and a usage error 1.
func TestBinaryExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildAllot(t)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"--help"}, 0},
		{[]string{"demo", "--help"}, 0},
		{[]string{"regional", "--help"}, 0},
		{[]string{"cluster", "up", "-h"}, 0},
		{[]string{"bench", "--help"}, 0},
		{[]string{"nope"}, 1},
		{[]string{"regional", "--nope"}, 1},
	} {
		cmd := exec.Command(bin, c.args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code {
			t.Errorf("allot %s: exit %d, want %d\n%s", strings.Join(c.args, " "), code, c.code, errb.String())
		}
		if c.code == 0 && (!strings.HasPrefix(out.String(), "usage: allot") || errb.Len() > 0) {
			t.Errorf("allot %s: stdout %q, stderr %q: want the usage on stdout", strings.Join(c.args, " "), out.String(), errb.String())
		}
		if c.code != 0 && !strings.Contains(errb.String(), "allot: ") {
			t.Errorf("allot %s: stderr %q: want the error", strings.Join(c.args, " "), errb.String())
		}
	}
}
