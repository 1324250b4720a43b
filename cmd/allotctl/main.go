// Command allotctl is the operators' tool for an allot fleet. It talks to
// the coordinator's Admin API (allot.v1.Admin) over gRPC for everything
// but `limits validate`, which checks files offline. Point --addr (or
// ALLOT_ADDR) at a coordinator's gRPC address; a region's gRPC address
// answers usage and status for that region only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cmdline "github.com/allot-dev/allot/internal/cli"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "allotctl:", err)
		os.Exit(1)
	}
}

const usage = `usage: allotctl [global flags] COMMAND [flags] [arguments]

limits:
  limits validate FILE...              check limits files offline; every error names file, line and field
  limits diff FILE                     what applying FILE would change
  limits apply FILE                    validate FILE and store it as a new version; prints the changes
  limits history                       the stored versions, newest first
  limits show [VERSION]                a version's YAML (default: the current one)
  limits rollback [VERSION]            apply an earlier version again (default: the previous one)
  limits shadow LIMIT on|off           shadow mode: count and log would-be rejections, allow them
  limits mode LIMIT split|shared       how regions share the limit
overrides (they expire by themselves):
  override set --domain D --key user=42 (--limit 5000/1m | --multiplier 5) --ttl 2h [--on LIMIT]
  override list [--domain D]
  override delete --domain D --key user=42 [--on LIMIT]
plans:
  plan assign --domain D tenant=acme PLAN
  plan unassign --domain D tenant=acme
  plan list [--domain D]
fleet:
  usage --domain D --key tenant=acme   usage of a key per region and over all regions
  status                               leaders, shares, configuration and fallback state per region

Global flags, before or after the command (allotctl --addr X status = allotctl status --addr=X):
  --addr ADDR         the Admin API's gRPC address (default $ALLOT_ADDR, else 127.0.0.1:8070: allot dev's coordinator)
  -o table|json       output
  --timeout DURATION  deadline of the call (default 10s)
  --author NAME       who makes the change, for the history (default: user@host)
  --tls-ca FILE       TLS: the CA bundle that verifies the server (default $ALLOT_TLS_CA)
  --tls-cert FILE, --tls-key FILE
                      TLS: the operator's client certificate, which the Admin API requires
                      (default $ALLOT_TLS_CERT, $ALLOT_TLS_KEY)
  --tls-server-name NAME  the name the server's certificate holds, when not --addr's host
  --insecure          plain text, to a loopback address only (default $ALLOT_INSECURE)
A command's own flags and its arguments come in any order. Run "allotctl COMMAND --help"
(or "allotctl help COMMAND") for a command's flags.
`

// cli is one invocation: its common flags, output and connection.
type cli struct {
	addr    string
	output  string
	timeout time.Duration
	author  string
	tls     tlsx.Flags
	// global are the global flags given in front of the command's name,
	// name → value: every flag set of the command starts from them.
	global map[string]string
	stdout io.Writer
	stderr io.Writer
	client allotv1.AdminClient
	conn   *grpc.ClientConn
}

// run runs the command line args (without the program's name). It
// returns nil when help was asked for (-h or --help): the usage went to
// stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr, global: map[string]string{}}
	defer c.close()
	err := c.dispatch(ctx, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// command is one command of allotctl: it gets the arguments after its name.
type command func(ctx context.Context, args []string) error

// commands are allotctl's commands: the groups (limits, override, plan)
// with their subcommands, and the commands without subcommands.
func (c *cli) commands() (groups map[string]map[string]command, leaves map[string]command) {
	groups = map[string]map[string]command{
		"limits": {"validate": c.limitsValidate, "diff": c.limitsDiff, "apply": c.limitsApply, "history": c.limitsHistory,
			"show": c.limitsShow, "rollback": c.limitsRollback, "shadow": c.limitsShadow, "mode": c.limitsMode},
		"override": {"set": c.overrideSet, "list": c.overrideList, "delete": c.overrideDelete},
		"plan":     {"assign": c.planAssign, "unassign": c.planUnassign, "list": c.planList},
	}
	leaves = map[string]command{"usage": c.usage, "status": c.status}
	return groups, leaves
}

// dispatch runs the command of args: global flags, then a command's name
// (and a subcommand's, with global flags allowed between them), then the
// command's flags and arguments.
func (c *cli) dispatch(ctx context.Context, args []string) error {
	cmds, leaves := c.commands()
	args, err := c.globals(args)
	switch {
	case err != nil:
		return err
	case len(args) == 0:
		fmt.Fprint(c.stderr, usage)
		return errors.New("no command")
	case args[0] == "help" && len(args) == 1:
		fmt.Fprint(c.stdout, usage)
		return nil
	case args[0] == "help":
		return c.dispatch(ctx, slices.Concat(args[1:], []string{"--help"}))
	case leaves[args[0]] != nil:
		return leaves[args[0]](ctx, args[1:])
	}
	name := args[0]
	sub, ok := cmds[name]
	if !ok {
		fmt.Fprint(c.stderr, usage)
		return fmt.Errorf("unknown command %q", name)
	}
	if args, err = c.globals(args[1:]); err != nil {
		return err
	}
	if len(args) == 0 || sub[args[0]] == nil {
		fmt.Fprint(c.stderr, usage)
		if len(args) == 0 {
			return fmt.Errorf("%s: missing subcommand", name)
		}
		return fmt.Errorf("%s: unknown subcommand %q", name, args[0])
	}
	return sub[args[0]](ctx, args[1:])
}

// globals parses the global flags in front of a command's name and keeps
// them for the command's flag set; it returns the rest of args. -h prints
// the usage of allotctl.
func (c *cli) globals(args []string) ([]string, error) {
	fs := c.flags("", "")
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	rest, err := cmdline.ParseFlags(fs, args, false, c.stdout)
	if err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { c.global[f.Name] = f.Value.String() })
	return rest, nil
}

// flags returns the flag set of a command with the global flags, set to
// the values given in front of the command's name. Its usage is
// "usage: allotctl NAME SYNOPSIS" and the flags' defaults.
func (c *cli) flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(strings.TrimSpace("allotctl "+name), flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	addr := os.Getenv("ALLOT_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8070"
	}
	fs.StringVar(&c.addr, "addr", addr, "the Admin API's gRPC address (a coordinator's)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline of the call")
	fs.StringVar(&c.author, "author", defaultAuthor(), "who makes the change, for the history")
	c.tls.Register(fs, "", "allotctl", true)
	for flagName, v := range c.global {
		if err := fs.Set(flagName, v); err != nil {
			panic(err) // v was parsed by a flag of the same name
		}
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), strings.TrimSpace("usage: allotctl "+name+" "+synopsis))
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
		fmt.Fprintln(fs.Output(), "\n-addr, -o, -timeout, -author, -tls-* and -insecure are global: they may come before the command too.")
	}
	return fs
}

// parse parses a command's args with fs, flags and positional arguments
// in any order, and checks the output format and the count of positional
// arguments (maxArgs < 0: no bound). See parseFlags for -h and bad flags.
func (c *cli) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	pos, err := cmdline.ParseFlags(fs, args, true, c.stdout)
	if err != nil {
		return nil, err
	}
	if c.output != "table" && c.output != "json" {
		return nil, fmt.Errorf("-o %q: want table or json", c.output)
	}
	if err := cmdline.CheckArgs(cmdline.CommandName(fs), pos, minArgs, maxArgs); err != nil {
		fs.Usage()
		return nil, err
	}
	return pos, nil
}

func defaultAuthor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

// call runs fn with a client of the Admin API and the call's deadline,
// and turns its error into a readable one.
func (c *cli) call(ctx context.Context, fn func(ctx context.Context, a allotv1.AdminClient) error) error {
	if c.client == nil {
		src, err := c.tls.Source(nil)
		if err != nil {
			return err
		}
		if src == nil {
			if err := tlsx.DialRule("--addr", c.addr, c.tls.Insecure); err != nil {
				return err
			}
		}
		conn, err := grpc.NewClient(c.addr, src.DialOption(c.tls.ServerName))
		if err != nil {
			return fmt.Errorf("%s: %w", c.addr, err)
		}
		c.conn, c.client = conn, allotv1.NewAdminClient(conn)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	err := fn(ctx, c.client)
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("%s unreachable (is the coordinator running there? set --addr or ALLOT_ADDR): %s", c.addr, st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%s serves only the read-only Admin API of a region: point --addr at a coordinator", c.addr)
	}
	return errors.New(st.Message())
}

func (c *cli) close() {
	if c.conn != nil {
		c.conn.Close()
	}
}
