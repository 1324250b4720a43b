// Command allot runs allot: a region's enforcer (allot regional), the
// embedded default (allot dev), and tools to check configurations.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "allot:", err)
		os.Exit(1)
	}
}

const usage = `usage: allot COMMAND [flags] [arguments]

commands:
  dev        the embedded default: etcd, a coordinator and three regions in one process
  demo       allot dev plus traffic that plays a story, a live view and a dashboard
  coordinator  lead domains through etcd and split their limits among regions
  regional   serve one region's enforcer (gRPC, Envoy's rate limit API, HTTP)
  check      play requests against the in-memory engine and print each decision
  validate   check a limits file; every error names the file, line and field
  bench      put a load of checks on a server and print throughput and latency
  sim        run a simulation scenario (sim/scenarios) and write its report
  cluster    a local cluster of real processes: allot cluster up|down|status
  etcd       serve allot's embedded etcd as a process of its own

Flags and arguments come in any order after the command. Run "allot COMMAND --help"
(or "allot help COMMAND") for a command's flags.
`

// run runs the command line args (without the program's name). It
// returns nil when help was asked for (-h or --help): the usage went to
// stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, newFlagSet("allot", usage, stderr), commands(), args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// commands are allot's commands by name.
func commands() map[string]command {
	return map[string]command{
		"dev":         runDev,
		"demo":        runDemo,
		"regional":    runRegional,
		"coordinator": runCoordinator,
		"check":       runCheck,
		"bench":       runBench,
		"validate":    runValidate,
		"sim":         runSim,
		"cluster":     runCluster,
		"etcd":        runEtcd,
	}
}

// loadConfig reads path, or the built-in example when path is empty.
func loadConfig(path string) (*allot.Config, error) {
	if path == "" {
		return allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	}
	return allot.LoadConfigFile(path)
}

func runValidate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot validate", "usage: allot validate FILE...\n\nChecks limits files; every error names the file, line and field.", stderr)
	files, err := parseArgs(fs, args, stdout, 1, -1)
	if err != nil {
		return err
	}
	for _, path := range files {
		cfg, err := allot.LoadConfigFile(path)
		if err != nil {
			return err
		}
		for _, d := range cfg.Domains {
			fmt.Fprintf(stdout, "%s: domain %s: %d limits, %d plans, %d overrides: ok\n", path, d.Name, len(d.Limits), len(d.Plans), len(d.Overrides))
		}
	}
	return nil
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot check", "usage: allot check [flags]\n\nPlays COUNT requests, INTERVAL apart on a virtual clock, against the in-memory engine.", stderr)
	var (
		config   = fs.String("config", "", "limits file (default: the built-in "+examples.LimitsName+")")
		domain   = fs.String("domain", "api", "domain of the requests")
		desc     = fs.String("descriptor", "tenant=globex,user=42", "the requests' descriptor: key=value,...")
		hits     = fs.Int64("hits", 1, "cost of each request")
		count    = fs.Int("count", 8, "number of requests")
		interval = fs.Duration("interval", 0, "virtual time between requests")
	)
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	if *count < 1 || *count > 1_000_000 {
		return fmt.Errorf("check: --count must be between 1 and 1000000, got %d", *count)
	}
	if *interval < 0 {
		return fmt.Errorf("check: --interval must not be negative, got %v", *interval)
	}
	d, err := parseDescriptor(*desc)
	if err != nil {
		return fmt.Errorf("check: --descriptor: %w", err)
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	e := regional.New(cfg, regional.Options{})
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tat\tdecision\tretry_after\tlimits (name: remaining/limit)")
	now := time.Now()
	var dec allot.Decision
	for i := range *count {
		if ctx.Err() != nil {
			break
		}
		at := time.Duration(i) * *interval
		if err := e.Check(now.Add(at), *domain, d, *hits, &dec); err != nil {
			return err
		}
		verdict, retry := "allow", "-"
		if !dec.Allowed {
			verdict, retry = "REJECT (429)", dec.RetryAfter.String()
		}
		var parts []string
		for _, st := range dec.Statuses {
			p := fmt.Sprintf("%s: %d/%d", st.Name, st.Remaining, st.Limit)
			if st.Shadow {
				p += " (shadow)"
			}
			if !st.Allowed {
				p += " ✗"
			}
			parts = append(parts, p)
		}
		if len(parts) == 0 {
			parts = append(parts, "no limit matches")
		}
		fmt.Fprintf(tw, "%d\t+%v\t%s\t%s\t%s\n", i+1, at, verdict, retry, strings.Join(parts, ", "))
	}
	return tw.Flush()
}

// parseDescriptor parses "k1=v1,k2=v2".
func parseDescriptor(s string) (allot.Descriptor, error) {
	var d allot.Descriptor
	if strings.TrimSpace(s) == "" {
		return d, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("want key=value, got %q", part)
		}
		d = append(d, allot.Entry{Key: k, Value: strings.TrimSpace(v)})
	}
	return d, nil
}
