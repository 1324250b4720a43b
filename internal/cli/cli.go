// Package cli holds the command-line conventions that allot and allotctl
// share:
//
//   - global flags come before or after the command's name, or between a
//     command and its subcommand: a later one wins;
//   - a command's own flags and its positional arguments come in any
//     order after its name ("--" ends the flags);
//   - -h or --help, on any command or group of commands, prints its usage
//     to stdout and succeeds, as does "PROGRAM help [COMMAND...]";
//   - an unknown command or flag, or a wrong count of arguments, prints
//     the usage to stderr and fails with a message naming the problem.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ParseFlags parses args with fs. When interleaved, flags and positional
// arguments come in any order ("--" ends the flags); else parsing stops
// at the first positional argument (a command's name) and the rest is
// returned. -h or --help prints fs's usage to stdout and returns
// flag.ErrHelp, which the program's run turns into success; a bad flag prints the usage
// to fs's output (stderr) and returns the error, named after the command.
func ParseFlags(fs *flag.FlagSet, args []string, interleaved bool, stdout io.Writer) ([]string, error) {
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
			if name := CommandName(fs); name != "" {
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

// CheckArgs checks that a command got between minArgs and maxArgs
// positional arguments (maxArgs < 0: no bound).
func CheckArgs(name string, pos []string, minArgs, maxArgs int) error {
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

// CommandName is fs's command without the program's name: "limits apply"
// for "allotctl limits apply", "" for "allotctl".
func CommandName(fs *flag.FlagSet) string {
	_, name, _ := strings.Cut(fs.Name(), " ")
	return name
}
