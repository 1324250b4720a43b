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

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
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
