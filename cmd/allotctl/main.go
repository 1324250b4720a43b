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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "allotctl:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: allotctl COMMAND [flags]

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

Every command takes --addr ADDR (default $ALLOT_ADDR, else 127.0.0.1:8070: allot dev's
coordinator), -o table|json, --timeout DURATION. Run "allotctl COMMAND -h" for more.
`

// cli is one invocation: its common flags, output and connection.
type cli struct {
	addr    string
	output  string
	timeout time.Duration
	author  string
	stdout  io.Writer
	stderr  io.Writer
	client  allotv1.AdminClient
	conn    *grpc.ClientConn
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr}
	defer c.close()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	cmds := map[string]map[string]func(context.Context, []string) error{
		"limits": {"validate": c.limitsValidate, "diff": c.limitsDiff, "apply": c.limitsApply, "history": c.limitsHistory,
			"show": c.limitsShow, "rollback": c.limitsRollback, "shadow": c.limitsShadow, "mode": c.limitsMode},
		"override": {"set": c.overrideSet, "list": c.overrideList, "delete": c.overrideDelete},
		"plan":     {"assign": c.planAssign, "unassign": c.planUnassign, "list": c.planList},
	}
	switch args[0] {
	case "usage":
		return c.usage(ctx, args[1:])
	case "status":
		return c.status(ctx, args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	sub, ok := cmds[args[0]]
	if !ok {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
	if len(args) < 2 || sub[args[1]] == nil {
		fmt.Fprint(stderr, usage)
		if len(args) < 2 {
			return fmt.Errorf("%s: missing subcommand", args[0])
		}
		return fmt.Errorf("%s: unknown subcommand %q", args[0], args[1])
	}
	return sub[args[1]](ctx, args[2:])
}

// flags returns a flag set with the common flags.
func (c *cli) flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("allotctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	addr := os.Getenv("ALLOT_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8070"
	}
	fs.StringVar(&c.addr, "addr", addr, "the Admin API's gRPC address (a coordinator's)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline of the call")
	fs.StringVar(&c.author, "author", defaultAuthor(), "who makes the change, for the history")
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "usage: allotctl %s %s\n\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args with flags and positional arguments in any order and
// checks the output format and the count of positional arguments.
func (c *cli) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if args = fs.Args(); len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	switch {
	case c.output != "table" && c.output != "json":
		return nil, fmt.Errorf("-o %q: want table or json", c.output)
	case len(pos) < minArgs || len(pos) > maxArgs:
		fs.Usage()
		return nil, fmt.Errorf("%s: want %s", fs.Name(), argCount(minArgs, maxArgs))
	}
	return pos, nil
}

func argCount(lo, hi int) string {
	switch {
	case lo == hi && lo == 0:
		return "no arguments"
	case lo == hi:
		return fmt.Sprintf("%d argument(s)", lo)
	}
	return fmt.Sprintf("%d to %d arguments", lo, hi)
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
		conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
