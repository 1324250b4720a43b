package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/deploy/local"
)

const localClusterUsage = `usage: allot cluster up|down|status [flags]

A local multi-region cluster of real processes on loopback (deploy/local):
one etcd (allot's embedded etcd as a process of its own, or --etcd-binary),
one redis-server per region, coordinators, and enforcer instances per region
linked to their region's Redis, to etcd, to the coordinators and to the other
regions. Logs, pid files and the state (cluster.json) go to --dir.

Every link runs mutual TLS: up makes a throwaway CA and a certificate per
process in --dir/tls, and one for an operator (tls/operator.crt) that
allotctl and curl use. up --insecure runs plain text on loopback instead.

  up       start the cluster and return once every process is ready
  down     stop it: SIGTERM, then SIGKILL after --grace
  status   what runs, where, whether it answers, and who leads each domain

Run "allot cluster COMMAND --help" for a command's flags.
`

func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, newFlagSet("allot cluster", localClusterUsage, stderr), clusterCommands(), args, stdout, stderr)
}

// clusterCommands are the commands of allot cluster.
func clusterCommands() map[string]command {
	return map[string]command{"up": runClusterUp, "down": runClusterDown, "status": runClusterStatus}
}

func runClusterUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot cluster up", fmt.Sprintf("usage: allot cluster up [flags]\n\n"+
		"Starts the cluster in the background and returns once every process is ready.\nPorts: %s.", local.PortLayout), stderr)
	var (
		dir          = fs.String("dir", local.DefaultDir, "folder for logs, pid files, data and cluster.json")
		base         = fs.Int("base-port", local.DefaultBasePort, "first port; the cluster uses the ports from it on (0: free ports)")
		config       = fs.String("config", "", "limits file, stored in etcd as the fleet's configuration; default: the built-in deploy/examples/limits.yaml")
		regions      = fs.String("regions", strings.Join(local.DefaultRegions, ","), "regions, comma-separated (they must be the regions of the config's domains)")
		instances    = fs.Int("instances", local.DefaultInstances, "enforcer instances per region")
		coordinators = fs.Int("coordinators", local.DefaultCoordinators, "coordinators (one leads each domain, the others stand by)")
		etcdBin      = fs.String("etcd-binary", "", "run this etcd binary (e.g. Debian's etcd-server: etcd); default: allot's embedded etcd (allot etcd)")
		redisBin     = fs.String("redis-binary", "redis-server", "redis-server binary")
		regionalArgs = fs.String("regional-args", "", "extra flags for every enforcer, space-separated (e.g. \"--store-timeout 20ms\")")
		coordArgs    = fs.String("coordinator-args", "", "extra flags for every coordinator, space-separated (e.g. \"--rebalance-period 1s\")")
		timeout      = fs.Duration("timeout", local.DefaultStartTimeout, "how long each process may take to be ready")
		insecure     = fs.Bool("insecure", false, "plain text on loopback instead of mutual TLS on every link")
	)
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	if old, err := local.Load(*dir); err == nil && old.AnyRunning() {
		return fmt.Errorf("cluster up: a cluster runs in %s already; allot cluster down --dir %s first", *dir, *dir)
	}
	c, err := local.New(local.Options{
		Dir: *dir, BasePort: *base, Config: *config, Regions: splitList(*regions), Instances: *instances,
		Coordinators: *coordinators, EtcdBinary: *etcdBin, RedisBinary: *redisBin,
		RegionalArgs: strings.Fields(*regionalArgs), CoordinatorArgs: strings.Fields(*coordArgs),
		Detach: true, StartTimeout: *timeout, Log: stdout, Insecure: *insecure,
	})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(stderr, "allot cluster: start failed; stopping what started")
		c.StopAll(5 * time.Second)
		return err
	}
	fmt.Fprintf(stdout, "\nallot cluster: %d processes up in %s\n\n", len(c.Procs), c.Opts.Dir)
	printLocalCluster(ctx, stdout, c)
	first := c.ByRole(local.Regional, "")[0]
	coord := c.ByRole(local.Coordinator, "")[0]
	printTryCluster(stdout, c, first, coord, *dir)
	return nil
}

// printTryCluster prints how to reach the cluster: with TLS, allotctl's
// environment and curl's flags name the operator's certificate.
func printTryCluster(w io.Writer, c *local.Cluster, first, coord *local.Proc, dir string) {
	body := `-H 'Content-Type: application/json' -d '{"domain":"api","descriptors":[{"user":"42"}]}'`
	if c.Opts.Insecure {
		fmt.Fprintf(w, "\ntransport: plain text, on loopback only (--insecure)\n\nTry it:\n")
		fmt.Fprintf(w, "  curl -s -X POST http://%s/v1/check %s\n", first.HTTP, body)
		fmt.Fprintf(w, "  go run ./cmd/allotctl status --insecure --addr %s\n", coord.Addr)
	} else {
		op := c.Files("operator")
		fmt.Fprintf(w, "\ntransport: mutual TLS on every link; a throwaway CA and the certificates in %s\n", c.TLSDir())
		fmt.Fprintf(w, "\nPoint allotctl at it (the operator's certificate, %s):\n", local.Operator)
		fmt.Fprintf(w, "  export ALLOT_TLS_CA=%s ALLOT_TLS_CERT=%s ALLOT_TLS_KEY=%s\n", op.CA, op.Cert, op.Key)
		fmt.Fprintf(w, "\nTry it:\n")
		fmt.Fprintf(w, "  curl -s --cacert %s -X POST https://%s/v1/check %s\n", op.CA, first.HTTP, body)
		fmt.Fprintf(w, "  go run ./cmd/allotctl status --addr %s\n", coord.Addr)
	}
	fmt.Fprintf(w, "  allot cluster status --dir %s;  allot cluster down --dir %s\n", dir, dir)
}

func runClusterDown(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot cluster down", "usage: allot cluster down [flags]\n\n"+
		"Stops the cluster: enforcers, coordinators, Redis, etcd, with SIGTERM then SIGKILL after --grace.\nLogs and data stay in --dir.", stderr)
	dir := fs.String("dir", local.DefaultDir, "the cluster's folder")
	grace := fs.Duration("grace", local.DefaultGrace, "how long each process may take to stop after SIGTERM before SIGKILL")
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	c, err := local.Load(*dir)
	if err != nil {
		return err
	}
	c.Opts.Log = stdout
	c.StopAll(*grace)
	fmt.Fprintf(stdout, "allot cluster: stopped; logs in %s/logs\n", c.Opts.Dir)
	return nil
}

func runClusterStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot cluster status", "usage: allot cluster status [flags]\n\n"+
		"Prints each process of the cluster: pid, state, addresses, health; and each domain's leader.\nExits 1 when a process is down or does not answer.", stderr)
	dir := fs.String("dir", local.DefaultDir, "the cluster's folder")
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	c, err := local.Load(*dir)
	if err != nil {
		return err
	}
	if !printLocalCluster(ctx, stdout, c) {
		return errors.New("cluster: some processes are down or do not answer")
	}
	return nil
}

// printLocalCluster prints the cluster's processes and leaders, and reports
// whether every process runs and answers.
func printLocalCluster(ctx context.Context, w io.Writer, c *local.Cluster) bool {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tPID\tSTATE\tADDRESS\tHTTP\tLOG")
	ok := true
	for _, s := range c.Status(ctx) {
		p := s.Proc
		state := "running"
		switch {
		case !s.Running:
			state, ok = "stopped", false
		case s.Health != nil:
			state, ok = "not answering: "+s.Health.Error(), false
		}
		pid := "-"
		if s.Running {
			pid = fmt.Sprint(p.Pid)
		}
		http := p.HTTP
		if p.Role == local.Etcd {
			http = "-" // its peer address
		}
		if http == "" {
			http = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Role, pid, state, p.Addr, http, p.Log)
	}
	tw.Flush()
	if !c.Running(c.Proc("etcd")) {
		return ok
	}
	store, closeStore, err := c.Store()
	if err != nil {
		fmt.Fprintln(w, "leaders: etcd:", err)
		return false
	}
	defer closeStore()
	var leaders []string
	for _, d := range localClusterDomains(ctx, c) {
		p, err := c.Leader(ctx, store, d)
		switch {
		case err != nil:
			leaders = append(leaders, d+": "+err.Error())
		case p == nil:
			leaders = append(leaders, d+": no leader")
		default:
			leaders = append(leaders, d+": "+p.Name)
		}
	}
	if len(leaders) > 0 {
		fmt.Fprintf(w, "\nleaders: %s\n", strings.Join(leaders, ", "))
	}
	return ok
}

// localClusterDomains are the domains of the configuration in etcd.
func localClusterDomains(ctx context.Context, c *local.Cluster) []string {
	store, closeStore, err := c.Store()
	if err != nil {
		return nil
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg, _, err := fleetConfig(ctx, store, "")
	if err != nil {
		return nil
	}
	var out []string
	for _, d := range cfg.Domains {
		if !slices.Contains(out, d.Name) {
			out = append(out, d.Name)
		}
	}
	return out
}
