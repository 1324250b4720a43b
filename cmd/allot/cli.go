package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The command line's conventions, the same for every command of allot
// and allotctl:
//
//   - flags and positional arguments come in any order after a command's
//     name ("--" ends the flags); flags in front of a command's name are
//     the global ones (allot has none yet, allotctl has --addr, -o, ...);
//   - -h or --help, on any command or group of commands, prints its usage
//     to stdout and succeeds, as does "allot help [COMMAND...]";
//   - an unknown command or flag, or a wrong count of arguments, prints
//     the usage to stderr and fails with a message naming the problem.

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
	pos, err := parseFlags(fs, args, true, stdout)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(commandName(fs), pos, minArgs, maxArgs); err != nil {
		fs.Usage()
		return nil, err
	}
	return pos, nil
}

// parseFlags parses args with fs. When interleaved, flags and positional
// arguments come in any order ("--" ends the flags); else parsing stops
// at the first positional argument (a command's name) and the rest is
// returned. -h or --help prints fs's usage to stdout and returns
// flag.ErrHelp, which run turns into success; a bad flag prints the usage
// to fs's output (stderr) and returns the error, named after the command.
func parseFlags(fs *flag.FlagSet, args []string, interleaved bool, stdout io.Writer) ([]string, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard) // the flag package's messages: the error is returned instead
	defer fs.SetOutput(out)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fs.Usage()
				return nil, flag.ErrHelp
			}
			fs.SetOutput(out)
			fs.Usage()
			if name := commandName(fs); name != "" {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); !interleaved || len(rest) == 0 || n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// dispatch parses the flags in front of a command's name with fs (the
// flag set of the program or of a group of commands, such as "allot
// cluster") and runs the command. "help [COMMAND...]" is COMMAND... -h.
func dispatch(ctx context.Context, fs *flag.FlagSet, cmds map[string]command, args []string, stdout, stderr io.Writer) error {
	rest, err := parseFlags(fs, args, false, stdout)
	if err != nil {
		return err
	}
	prefix := commandName(fs)
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

// checkArgs checks that a command got between minArgs and maxArgs
// positional arguments (maxArgs < 0: no bound).
func checkArgs(name string, pos []string, minArgs, maxArgs int) error {
	switch {
	case maxArgs == 0 && len(pos) > 0:
		return fmt.Errorf("%s: unexpected argument %q", name, pos[0])
	case len(pos) < minArgs || maxArgs >= 0 && len(pos) > maxArgs:
		return fmt.Errorf("%s: want %s, got %d", name, argCount(minArgs, maxArgs), len(pos))
	}
	return nil
}

func argCount(lo, hi int) string {
	plural := func(n int) string {
		if n == 1 {
			return "1 argument"
		}
		return fmt.Sprintf("%d arguments", n)
	}
	switch {
	case hi < 0:
		return "at least " + plural(lo)
	case lo == hi:
		return plural(lo)
	}
	return fmt.Sprintf("%d to %d arguments", lo, hi)
}

// commandName is fs's command without the program's name: "cluster up"
// for "allot cluster up", "" for "allot".
func commandName(fs *flag.FlagSet) string {
	_, name, _ := strings.Cut(fs.Name(), " ")
	return name
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
