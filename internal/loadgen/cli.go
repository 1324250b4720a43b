package loadgen

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/allot-dev/allot/internal/tlsx"
)

// System makes the Target of one kind of server from a connection to it
// and the domain of the checks.
type System func(conn grpc.ClientConnInterface, domain string) Target

// connectTimeout bounds the wait for the target before the load starts.
const connectTimeout = 5 * time.Second

// Main is the bench command line, shared by `allot bench` and the
// benchmark binaries that add other systems: it parses args, connects to
// --target, runs the load and prints the result on stdout, one
// "name value [unit]" line each. systems are the servers --system may name;
// the default is "allot".
func Main(ctx context.Context, prog string, systems map[string]System, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg    Config
		target = fs.String("target", "127.0.0.1:8081", "gRPC address of the server under load")
		system = fs.String("system", "allot", "kind of server: "+strings.Join(slices.Sorted(maps.Keys(systems)), ", "))
		domain = fs.String("domain", "api", "domain of the checks (gubernator: the limit's name)")
		conns  = fs.Int("conns", 1, "gRPC connections, shared by the workers")
		tlsf   tlsx.Flags
	)
	tlsf.Register(fs, "", "the load generator", true)
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to send")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "workers: calls in flight at most")
	fs.IntVar(&cfg.Keys, "keys", 10000, "distinct keys: descriptors user=0 … user=K-1")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop at this many checks/s; 0 runs a closed loop")
	fs.Float64Var(&cfg.Zipf, "zipf", 0, "draw keys from a Zipf distribution of this exponent (> 1) instead of uniformly")
	fs.IntVar(&cfg.Batch, "batch", 1, "checks per call")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the key draws")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s --target ADDR [flags]\n\nPuts a closed-loop (or, with --rate, open-loop) load of checks on a rate limiter\nand prints throughput, decisions, errors and latency percentiles.\n\n", prog)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	newTarget, ok := systems[*system]
	if !ok {
		return fmt.Errorf("bench: unknown --system %q; this binary knows %s", *system, strings.Join(slices.Sorted(maps.Keys(systems)), ", "))
	}
	if *conns < 1 {
		return fmt.Errorf("bench: --conns must be at least 1, got %d", *conns)
	}
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}

	src, err := tlsf.Source(nil)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if src == nil {
		if err := tlsx.DialRule("--target", *target, tlsf.Insecure); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	var targets roundRobin
	for range *conns {
		conn, err := dial(ctx, *target, src.DialOption(tlsf.ServerName))
		if err != nil {
			return err
		}
		defer conn.Close()
		targets.targets = append(targets.targets, newTarget(conn, *domain))
	}
	res, err := Run(ctx, &targets, cfg)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	fmt.Fprintf(stdout, "%-11s %s\n%-11s %s\n%-11s %s\n", "system", *system, "target", *target, "load", describe(cfg))
	res.print(stdout)
	return ctx.Err()
}

// dial connects to addr with creds (TLS or plain text) and waits until
// the connection is up, so that an absent server is one clear error
// rather than a run of failed calls.
func dial(ctx context.Context, addr string, creds grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			conn.Close()
			return nil, fmt.Errorf("bench: cannot reach %s (connection %s): %w", addr, s, ctx.Err())
		}
	}
	return conn, nil
}

func describe(cfg Config) string {
	keys := "uniform"
	if cfg.Zipf > 1 {
		keys = fmt.Sprintf("zipf %g", cfg.Zipf)
	}
	loop := fmt.Sprintf("closed loop, %d in flight", cfg.Concurrency)
	if cfg.Rate > 0 {
		loop = fmt.Sprintf("open loop at %g checks/s, at most %d in flight", cfg.Rate, cfg.Concurrency)
	}
	return fmt.Sprintf("%s, %v, %d keys %s, batch %d", loop, cfg.Duration, cfg.Keys, keys, cfg.Batch)
}

func (r *Result) print(w io.Writer) {
	errs := fmt.Sprint(r.Errors)
	if r.FirstError != nil {
		errs += fmt.Sprintf(" (first: %v)", r.FirstError)
	}
	for _, l := range [][2]string{
		{"calls", fmt.Sprint(r.Calls)},
		{"checks", fmt.Sprint(r.Checks)},
		{"allowed", fmt.Sprint(r.Allowed)},
		{"rejected", fmt.Sprint(r.Rejected)},
		{"errors", errs},
		{"unsent", fmt.Sprint(r.Unsent)},
		{"throughput", fmt.Sprintf("%.0f checks/s", r.Throughput())},
		{"p50", ms(r.Quantile(0.5))},
		{"p99", ms(r.Quantile(0.99))},
		{"p999", ms(r.Quantile(0.999))},
		{"max", ms(r.Quantile(1))},
	} {
		fmt.Fprintf(w, "%-11s %s\n", l[0], l[1])
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", d.Seconds()*1000) }

// roundRobin spreads calls over targets, one per connection.
type roundRobin struct {
	next    atomic.Uint64
	targets []Target
}

func (rr *roundRobin) Check(ctx context.Context, keys []int) (int, error) {
	t := rr.targets[(rr.next.Add(1)-1)%uint64(len(rr.targets))]
	return t.Check(ctx, keys)
}
