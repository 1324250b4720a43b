package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/allot-dev/allot/internal/cli"
)

// The command line follows internal/cli's conventions; allot has no
// global flags yet.

// command is one command of allot: it gets the arguments after its name.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// newFlagSet returns the flag set of the command name (such as "allot
// dev"), whose usage is usage and then the flags' defaults.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), strings.TrimRight(usage, "\n"))
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses a command's args with fs, flags and positional
// arguments in any order, and checks the count of positional arguments
// (maxArgs < 0: no bound). See parseFlags for -h and bad flags.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer, minArgs, maxArgs int) ([]string, error) {
	pos, err := cli.ParseFlags(fs, args, true, stdout)
	if err != nil {
		return nil, err
	}
	if err := cli.CheckArgs(cli.CommandName(fs), pos, minArgs, maxArgs); err != nil {
		fs.Usage()
		return nil, err
	}
	return pos, nil
}

// dispatch parses the flags in front of a command's name with fs (the
// flag set of the program or of a group of commands, such as "allot
// cluster") and runs the command. "help [COMMAND...]" is COMMAND... -h.
func dispatch(ctx context.Context, fs *flag.FlagSet, cmds map[string]command, args []string, stdout, stderr io.Writer) error {
	rest, err := cli.ParseFlags(fs, args, false, stdout)
	if err != nil {
		return err
	}
	prefix := cli.CommandName(fs)
	if prefix != "" {
		prefix += ": "
	}
	switch {
	case len(rest) == 0:
		fs.Usage()
		return errors.New(prefix + "no command")
	case rest[0] == "help" && len(rest) == 1:
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return flag.ErrHelp
	case rest[0] == "help":
		return dispatch(ctx, fs, cmds, slices.Concat(rest[1:], []string{"--help"}), stdout, stderr)
	}
	cmd, ok := cmds[rest[0]]
	if !ok {
		fs.Usage()
		return fmt.Errorf("%sunknown command %q", prefix, rest[0])
	}
	return cmd(ctx, rest[1:], stdout, stderr)
}

// helpWanted reports whether args ask for help before any "--": -h,
// --help (or -h=..., as the flag package reads them).
func helpWanted(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name == "h" || name == "help" {
			return true
		}
	}
	return false
}
