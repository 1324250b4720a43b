// Package local runs allot as a local multi-region cluster of real
// processes on loopback: one etcd (allot's embedded one as a process of
// its own, `allot etcd`, or an etcd binary), one redis-server per region,
// coordinators, and enforcer instances per region, each linked to its
// region's Redis, to etcd, to the coordinators and to the other regions.
// Logs, pid files and a state file (cluster.json) are kept in one folder,
// so that another process (allot cluster down|status) can find and stop
// what one started (allot cluster up).
//
// Every link runs mutual TLS (etcd's clients, Redis, the coordinators,
// the peers, the Admin API): Start makes a throwaway CA in the folder
// (tls/ca.crt) and a certificate per process named by the identity
// convention of docs/security.md (spiffe://allot/region/R/instance/NAME,
// spiffe://allot/coordinator/NAME), and one for an operator
// (tls/operator.crt, spiffe://allot/operator/admin) that allotctl, the
// probes and Store use. Options.Insecure runs plain text on loopback
// instead (--insecure).
//
// It is the library behind `allot cluster` and the chaos test
// (internal/chaos), which puts proxies between the processes with
// Options.Dial and kills and restarts them one by one:
//
//	c, err := local.New(local.Options{Dir: dir, Bin: bin})
//	err = c.Start(ctx)       // every process, in order, each polled until ready
//	c.Kill(c.Proc("redis-eu-west"))
//	err = c.Restart(ctx, c.Proc("redis-eu-west"))
//	c.StopAll(10 * time.Second)
//
// A Cluster's methods are safe for concurrent use.
package local

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/internal/pki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// Defaults of Options.
const (
	DefaultDir          = "allot-cluster"
	DefaultBasePort     = 7100
	DefaultInstances    = 2
	DefaultCoordinators = 2
	DefaultStartTimeout = time.Minute
	DefaultGrace        = 10 * time.Second
)

// DefaultRegions are the regions of deploy/examples/limits.yaml.
var DefaultRegions = []string{"us-east", "eu-west", "ap-south"}

// StateFile is the name of the state file in the cluster's folder.
const StateFile = "cluster.json"

// Role is what a process of the cluster does.
type Role string

// Roles.
const (
	Etcd        Role = "etcd"
	Redis       Role = "redis"
	Coordinator Role = "coordinator"
	Regional    Role = "regional"
)

// Options say what cluster to run. The zero value runs the default: three
// regions (us-east, eu-west, ap-south) of two instances, two coordinators,
// from port 7100, in ./allot-cluster, enforcing the built-in example.
type Options struct {
	// Dir holds logs (logs/NAME.log), pid files (run/NAME.pid), data
	// (etcd/, redis-REGION/), the configuration and cluster.json.
	Dir string
	// Bin is the allot binary the processes run; default: this process's
	// executable, copied into Dir/bin so that it outlives `go run`.
	Bin string
	// BasePort is the first port; PortLayout says which process gets
	// which. 0 picks free ports, one by one (tests).
	BasePort int
	// Config is the limits file, stored in etcd as the fleet's
	// configuration, which every process follows; empty: the built-in
	// deploy/examples/limits.yaml.
	Config string
	// Regions, Instances (per region) and Coordinators: the cluster's
	// shape (defaults: DefaultRegions, 2, 2).
	Regions      []string
	Instances    int
	Coordinators int
	// EtcdBinary runs a real etcd (e.g. Debian's etcd-server: "etcd");
	// empty runs `allot etcd`, allot's embedded one, as its own process.
	EtcdBinary string
	// RedisBinary is redis-server's path (default: found in PATH).
	RedisBinary string
	// RegionalArgs and CoordinatorArgs are added to every enforcer's and
	// coordinator's command line (e.g. --store-timeout, --rebalance-period).
	RegionalArgs, CoordinatorArgs []string
	// Dial gives the address from uses to reach to, e.g. a proxy in
	// between; nil (or "") means to's own address.
	Dial func(from, to *Proc) string
	// Detach lets the processes outlive this one (allot cluster up);
	// otherwise they are killed when it exits.
	Detach bool
	// StartTimeout bounds the wait for each process to be ready.
	StartTimeout time.Duration
	// Log receives one line per process started or stopped; nil discards.
	Log io.Writer
	// Insecure runs every process in plain text (--insecure), which the
	// loopback addresses allow; by default every link runs mutual TLS
	// with certificates of a CA made in Dir/tls by Start.
	Insecure bool
}

// Operator is the identity of the cluster's operator certificate
// (Dir/tls/operator.crt): allotctl's, and that of the probes and Store.
const Operator = "spiffe://allot/operator/admin"

// CAValidity is how long a cluster's CA and certificates are valid.
const CAValidity = 90 * 24 * time.Hour

// Proc is one process of the cluster.
type Proc struct {
	Name   string `json:"name"` // etcd, redis-us-east, coordinator-1, us-east-1
	Role   Role   `json:"role"`
	Region string `json:"region,omitempty"`
	Index  int    `json:"index"` // 1-based, per role (per region for enforcers)
	// Addr is where it serves: etcd's client address, Redis, or gRPC.
	Addr string `json:"addr"`
	// HTTP is a coordinator's or enforcer's HTTP address (/metrics,
	// /healthz, /readyz); etcd's peer address.
	HTTP string   `json:"http,omitempty"`
	Args []string `json:"args"`
	Log  string   `json:"log"`
	// Pid and Started (the kernel's start time of the process, to tell it
	// from a later process with the same pid) of the latest start.
	Pid     int    `json:"pid,omitempty"`
	Started uint64 `json:"started,omitempty"`
	// Life counts the starts of this process (1 for the first).
	Life int `json:"life"`

	cmd  *exec.Cmd     // when this Cluster started it
	done chan struct{} // closed when cmd has been waited for
}

// Cluster is a local cluster: its processes and how to start them.
type Cluster struct {
	Opts  Options
	Procs []*Proc
	// Endpoint is etcd's client address as this process reaches it.
	Endpoint string

	mu     sync.Mutex // guards the Procs' Pid, Started, Life, cmd and done
	saving sync.Mutex // serialises Save

	tlsMu  sync.Mutex  // guards tlsCfg
	tlsCfg *tls.Config // the operator's client configuration, loaded once
}

// New plans a cluster: names, ports, folders and command lines. It starts
// nothing.
func New(opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		opts.Dir = DefaultDir
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	if len(opts.Regions) == 0 {
		opts.Regions = DefaultRegions
	}
	if opts.Instances <= 0 {
		opts.Instances = DefaultInstances
	}
	if opts.Coordinators <= 0 {
		opts.Coordinators = DefaultCoordinators
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.RedisBinary == "" {
		opts.RedisBinary = "redis-server"
	}
	if opts.Config != "" {
		if opts.Config, err = filepath.Abs(opts.Config); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, r := range opts.Regions {
		if r == "" || seen[r] || strings.ContainsAny(r, "=,/ ") {
			return nil, fmt.Errorf("local: region %q: want distinct names without =,/ or spaces", r)
		}
		seen[r] = true
	}
	ports, err := portsFor(opts.BasePort, PortCount(len(opts.Regions), opts.Instances, opts.Coordinators))
	if err != nil {
		return nil, err
	}
	c := &Cluster{Opts: opts}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	// Layout (PortLayout documents it): etcd, then Redis, coordinators,
	// enforcers.
	c.add(&Proc{Name: "etcd", Role: Etcd, Index: 1, Addr: addr(0), HTTP: addr(1)})
	next := 2
	for _, r := range opts.Regions {
		c.add(&Proc{Name: "redis-" + r, Role: Redis, Region: r, Index: 1, Addr: addr(next)})
		next++
	}
	for i := range opts.Coordinators {
		c.add(&Proc{Name: fmt.Sprintf("coordinator-%d", i+1), Role: Coordinator, Index: i + 1, Addr: addr(next), HTTP: addr(next + 1)})
		next += 2
	}
	for _, r := range opts.Regions {
		for i := range opts.Instances {
			c.add(&Proc{Name: fmt.Sprintf("%s-%d", r, i+1), Role: Regional, Region: r, Index: i + 1, Addr: addr(next), HTTP: addr(next + 1)})
			next += 2
		}
	}
	for _, p := range c.Procs {
		p.Args = c.args(p)
	}
	c.Endpoint = c.Opts.dial(nil, c.Proc("etcd"))
	return c, nil
}

// PortCount is how many ports a cluster uses: etcd's two, one per Redis,
// two per coordinator and two per enforcer.
func PortCount(regions, instances, coordinators int) int {
	return 2 + regions + 2*coordinators + 2*regions*instances
}

// PortLayout describes which port each process gets from the base port.
const PortLayout = `base+0 etcd clients, base+1 etcd peers; then one port per region's Redis;
then gRPC and HTTP of each coordinator; then gRPC and HTTP of each enforcer, region by region`

// portsFor returns n ports from base, or n free ports when base is 0.
func portsFor(base, n int) ([]int, error) {
	ports := make([]int, n)
	if base > 0 {
		if base+n > 65535 {
			return nil, fmt.Errorf("local: base port %d: the cluster needs %d ports", base, n)
		}
		for i := range ports {
			ports[i] = base + i
		}
		return ports, nil
	}
	// Hold every listener until all are chosen, so that none repeats.
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("local: free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func (c *Cluster) add(p *Proc) {
	p.Log = filepath.Join(c.Opts.Dir, "logs", p.Name+".log")
	c.Procs = append(c.Procs, p)
}

func (o *Options) dial(from, to *Proc) string {
	if o.Dial != nil {
		if a := o.Dial(from, to); a != "" {
			return a
		}
	}
	return to.Addr
}

// bin is the allot binary the processes run.
func (c *Cluster) bin() string {
	if c.Opts.Bin != "" {
		return c.Opts.Bin
	}
	return filepath.Join(c.Opts.Dir, "bin", "allot")
}

// args is p's command line, its program first.
func (c *Cluster) args(p *Proc) []string {
	o := &c.Opts
	etcd := c.Proc("etcd")
	switch p.Role {
	case Etcd:
		data := filepath.Join(o.Dir, "etcd")
		if o.EtcdBinary != "" {
			// Its peer URL stays plain: a single member has no peer to
			// talk to, and it listens on loopback.
			args := []string{o.EtcdBinary, "--name", "allot", "--data-dir", data,
				"--listen-client-urls", c.scheme() + "://" + p.Addr, "--advertise-client-urls", c.scheme() + "://" + p.Addr,
				"--listen-peer-urls", "http://" + p.HTTP, "--initial-advertise-peer-urls", "http://" + p.HTTP,
				"--initial-cluster", "allot=http://" + p.HTTP, "--log-level", "error"}
			if !o.Insecure {
				f := c.Files(p.Name)
				args = append(args, "--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA, "--client-cert-auth")
			}
			return args
		}
		return append([]string{c.bin(), "etcd", "--data-dir", data, "--client-addr", p.Addr, "--peer-addr", p.HTTP}, c.tlsArgs(p, "")...)
	case Redis:
		_, port, _ := net.SplitHostPort(p.Addr)
		args := []string{o.RedisBinary, "--port", port}
		if !o.Insecure {
			f := c.Files(p.Name)
			args = []string{o.RedisBinary, "--port", "0", "--tls-port", port, "--tls-cert-file", f.Cert, "--tls-key-file", f.Key,
				"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "yes"}
		}
		return append(args, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", filepath.Join(o.Dir, "redis-"+p.Region), "--protected-mode", "no", "--logfile", "")
	case Coordinator:
		args := []string{c.bin(), "coordinator", "--etcd", o.dial(p, etcd), "--grpc-addr", p.Addr, "--http-addr", p.HTTP}
		args = append(append(args, c.tlsArgs(p, "")...), c.tlsArgs(p, "etcd-")...)
		return append(args, o.CoordinatorArgs...)
	case Regional:
		var coords, peers []string
		for _, q := range c.Procs {
			if q.Role == Coordinator {
				coords = append(coords, o.dial(p, q))
			}
		}
		for _, r := range o.Regions {
			if r == p.Region {
				continue
			}
			// Instance i links to instance i of each other region: each
			// instance of a region is heard by every peer region.
			peer := c.Proc(fmt.Sprintf("%s-%d", r, (p.Index-1)%o.Instances+1))
			peers = append(peers, r+"="+o.dial(p, peer))
		}
		// --instance: the instance its certificate names.
		args := []string{c.bin(), "regional", "--region", p.Region, "--instance", p.Name, "--etcd", o.dial(p, etcd),
			"--coordinator", strings.Join(coords, ","), "--redis", o.dial(p, c.Proc("redis-"+p.Region)),
			"--grpc-addr", p.Addr, "--http-addr", p.HTTP}
		if len(peers) > 0 {
			args = append(args, "--peers", strings.Join(peers, ","))
		}
		args = append(append(append(args, c.tlsArgs(p, "")...), c.tlsArgs(p, "etcd-")...), c.tlsArgs(p, "redis-")...)
		return append(args, o.RegionalArgs...)
	}
	return nil
}

// tlsArgs are the TLS flags of an allot process p for the flags' prefix
// ("", "etcd-", "redis-"): its certificate and the cluster's CA, or
// --insecure (prefix "" only) in a plain-text cluster.
func (c *Cluster) tlsArgs(p *Proc, prefix string) []string {
	if c.Opts.Insecure {
		if prefix == "" {
			return []string{"--insecure"}
		}
		return nil
	}
	f := c.Files(p.Name)
	return []string{"--" + prefix + "tls-cert", f.Cert, "--" + prefix + "tls-key", f.Key, "--" + prefix + "tls-ca", f.CA}
}

// TLSDir is the folder of the cluster's CA and certificates.
func (c *Cluster) TLSDir() string { return filepath.Join(c.Opts.Dir, "tls") }

// Files are the certificate, key and CA files of the process (or of
// "operator") named name; zero in a plain-text cluster.
func (c *Cluster) Files(name string) tlsx.Files {
	if c.Opts.Insecure {
		return tlsx.Files{}
	}
	d := c.TLSDir()
	return tlsx.Files{Cert: filepath.Join(d, name+".crt"), Key: filepath.Join(d, name+".key"), CA: filepath.Join(d, "ca.crt")}
}

// scheme is the URL scheme of the cluster's HTTP listeners and etcd.
func (c *Cluster) scheme() string {
	if c.Opts.Insecure {
		return "http"
	}
	return "https"
}

// Scheme is the URL scheme of the cluster's HTTP listeners: https, or
// http in a plain-text cluster.
func (c *Cluster) Scheme() string { return c.scheme() }

// ClientTLS is the client configuration of the operator's certificate
// (it verifies the cluster's servers against its CA); nil in a
// plain-text cluster. The files are loaded once.
func (c *Cluster) ClientTLS() (*tls.Config, error) {
	if c.Opts.Insecure {
		return nil, nil
	}
	c.tlsMu.Lock()
	defer c.tlsMu.Unlock()
	if c.tlsCfg == nil {
		src, err := tlsx.NewSource(c.Files("operator"), tlsx.Options{})
		if err != nil {
			return nil, fmt.Errorf("local: the operator's certificate: %w", err)
		}
		c.tlsCfg = src.ClientConfig("")
	}
	return c.tlsCfg.Clone(), nil
}

// makePKI makes the cluster's throwaway CA and a certificate for every
// process and for the operator, in TLSDir (keys readable by the owner
// only). The CA's key is not kept: a new cluster up makes a new CA. The
// certificates name loopback (127.0.0.1, ::1, localhost) and, in a URI
// SAN, who holds them (docs/security.md).
func (c *Cluster) makePKI() error {
	if c.Opts.Insecure {
		return nil
	}
	dir := c.TLSDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := pki.NewCA("allot local cluster CA (throwaway)", time.Now().Add(CAValidity))
	if err != nil {
		return fmt.Errorf("local: make the CA: %w", err)
	}
	if err := pki.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o644); err != nil {
		return err
	}
	issue := func(name, uri string) error {
		l := pki.Leaf{CommonName: name, IPs: pki.Loopback}
		if uri != "" {
			l.URIs = []string{uri}
		}
		cert, key, err := ca.Sign(l)
		if err != nil {
			return fmt.Errorf("local: certificate of %s: %w", name, err)
		}
		f := c.Files(name)
		if err := pki.WriteFile(f.Key, key, 0o600); err != nil {
			return err
		}
		return pki.WriteFile(f.Cert, cert, 0o644)
	}
	for _, p := range c.Procs {
		if err := issue(p.Name, Identity(p)); err != nil {
			return err
		}
	}
	c.tlsMu.Lock()
	c.tlsCfg = nil
	c.tlsMu.Unlock()
	return issue("operator", Operator)
}

// Identity is the URI SAN of p's certificate: an enforcer's
// spiffe://allot/region/REGION/instance/NAME, a coordinator's
// spiffe://allot/coordinator/NAME; none for etcd and Redis.
func Identity(p *Proc) string {
	switch p.Role {
	case Regional:
		return "spiffe://allot/region/" + p.Region + "/instance/" + p.Name
	case Coordinator:
		return "spiffe://allot/coordinator/" + p.Name
	}
	return ""
}

// Proc returns the process named name, or nil.
func (c *Cluster) Proc(name string) *Proc {
	for _, p := range c.Procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// ByRole returns the processes of a role, of one region when region is
// not empty.
func (c *Cluster) ByRole(role Role, region string) []*Proc {
	var out []*Proc
	for _, p := range c.Procs {
		if p.Role == role && (region == "" || p.Region == region) {
			out = append(out, p)
		}
	}
	return out
}

// Start starts every process: etcd, the configuration in etcd, the
// Redis servers and coordinators, then the enforcers, each polled until
// ready. The command lines are made again first, so that Options.Dial
// may name addresses (proxies) set up after New. It saves the state file
// as processes start. On error, what started keeps running: call
// StopAll.
func (c *Cluster) Start(ctx context.Context) error {
	for _, p := range c.Procs {
		p.Args = c.args(p)
	}
	for _, sub := range []string{"logs", "run"} {
		if err := os.MkdirAll(filepath.Join(c.Opts.Dir, sub), 0o755); err != nil {
			return err
		}
	}
	for _, r := range c.Opts.Regions {
		if err := os.MkdirAll(filepath.Join(c.Opts.Dir, "redis-"+r), 0o755); err != nil {
			return err
		}
	}
	if err := c.installBin(); err != nil {
		return err
	}
	if err := c.makePKI(); err != nil {
		return err
	}
	if err := c.startAll(ctx, c.ByRole(Etcd, "")); err != nil {
		return err
	}
	if err := c.seedConfig(ctx); err != nil {
		return err
	}
	if err := c.startAll(ctx, append(c.ByRole(Redis, ""), c.ByRole(Coordinator, "")...)); err != nil {
		return err
	}
	return c.startAll(ctx, c.ByRole(Regional, ""))
}

// installBin copies this executable into Dir/bin when Options.Bin is
// empty.
func (c *Cluster) installBin() error {
	if c.Opts.Bin != "" {
		if _, err := os.Stat(c.Opts.Bin); err != nil {
			return fmt.Errorf("local: allot binary: %w", err)
		}
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("local: this executable: %w", err)
	}
	dst := c.bin()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("local: copy the allot binary: %w", err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return fmt.Errorf("local: copy the allot binary: %w", err)
	}
	return os.Rename(tmp, dst) // a running copy keeps its inode
}

// startAll starts ps together and waits until each is ready.
func (c *Cluster) startAll(ctx context.Context, ps []*Proc) error {
	for _, p := range ps {
		if err := c.spawn(p); err != nil {
			return err
		}
	}
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = c.waitReady(ctx, p) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Restart starts p again, with the same command line and ports, and waits
// until it is ready. p must not be running.
func (c *Cluster) Restart(ctx context.Context, p *Proc) error {
	if err := c.spawn(p); err != nil {
		return err
	}
	return c.waitReady(ctx, p)
}

// spawn starts p's process, its output appended to its log.
func (c *Cluster) spawn(p *Proc) error {
	if c.Running(p) {
		return fmt.Errorf("local: %s is running (pid %d)", p.Name, p.Pid)
	}
	if p.Role == Redis {
		if _, err := exec.LookPath(c.Opts.RedisBinary); err != nil {
			return fmt.Errorf("local: %s: redis-server is not installed (apt-get install redis-server): %w", p.Name, err)
		}
	}
	if err := portsFree(p); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.Log), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	c.mu.Lock()
	life := p.Life + 1
	c.mu.Unlock()
	fmt.Fprintf(logf, "---- %s: start %d of %s: %s\n", time.Now().Format(time.RFC3339Nano), life, p.Name, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Opts.Dir
	// Its own process group: a terminal's Ctrl-C does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !c.Opts.Detach {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL // never outlive the test or tool that started it
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("local: start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	started, _ := startTime(cmd.Process.Pid)
	c.mu.Lock()
	p.cmd, p.done, p.Pid, p.Started, p.Life = cmd, done, cmd.Process.Pid, started, life
	c.mu.Unlock()
	fmt.Fprintf(c.Opts.Log, "started %-14s pid %-7d %s\n", p.Name, p.Pid, p.Addr)
	if err := os.WriteFile(c.pidFile(p), []byte(strconv.Itoa(p.Pid)+"\n"), 0o644); err != nil {
		return err
	}
	return c.Save()
}

func (c *Cluster) pidFile(p *Proc) string { return filepath.Join(c.Opts.Dir, "run", p.Name+".pid") }

// portsFree checks that p's ports are free: a process left over from an
// earlier cluster would otherwise answer p's probes.
func portsFree(p *Proc) error {
	for _, a := range []string{p.Addr, p.HTTP} {
		if a == "" {
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("local: %s: port %s is in use (a cluster left running? allot cluster down --dir ...): %w", p.Name, a, err)
		}
		l.Close()
	}
	return nil
}

// waitReady polls p until it serves, it exits, or StartTimeout passes.
func (c *Cluster) waitReady(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, c.Opts.StartTimeout)
	defer cancel()
	var err error
	for {
		// A probe answered by another process on p's port does not count.
		if err = c.Probe(ctx, p); err == nil && c.Running(p) {
			return nil
		}
		if !c.Running(p) {
			return fmt.Errorf("local: %s exited before it was ready (log %s):\n%s", p.Name, p.Log, tail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local: %s not ready after %v: %v (log %s):\n%s", p.Name, c.Opts.StartTimeout, err, p.Log, tail(p.Log, 20))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// Probe checks once that p serves: etcd's /health, a Redis PING, a
// coordinator's /healthz, an enforcer's /readyz; over TLS with the
// operator's certificate unless the cluster is plain text.
func (c *Cluster) Probe(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cfg, err := c.ClientTLS()
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg}}
	switch p.Role {
	case Redis:
		return redisPing(ctx, p.Addr, cfg)
	case Etcd:
		return httpOK(ctx, client, c.scheme()+"://"+p.Addr+"/health")
	case Coordinator:
		return httpOK(ctx, client, c.scheme()+"://"+p.HTTP+"/healthz")
	case Regional:
		return httpOK(ctx, client, c.scheme()+"://"+p.HTTP+"/readyz")
	}
	return fmt.Errorf("local: %s: unknown role %q", p.Name, p.Role)
}

// redisPing sends PING and wants +PONG (a Redis still loading its data
// answers -LOADING); over TLS when cfg is set.
func redisPing(ctx context.Context, addr string, cfg *tls.Config) error {
	var conn net.Conn
	var err error
	if cfg != nil {
		d := &tls.Dialer{Config: cfg}
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("redis %s: PING answered %q", addr, line)
	}
	return nil
}

func httpOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// seedConfig makes the cluster's limits file the current configuration
// version in etcd (a new version unless it already is): the coordinators
// and enforcers follow it from there, and allotctl changes it.
func (c *Cluster) seedConfig(ctx context.Context) error {
	yaml, source := examples.LimitsYAML, examples.LimitsName
	if c.Opts.Config != "" {
		var err error
		if yaml, err = os.ReadFile(c.Opts.Config); err != nil {
			return fmt.Errorf("local: %w", err)
		}
		source = c.Opts.Config
	}
	cfg, err := allot.ParseConfig(source, yaml)
	if err != nil {
		return err
	}
	for _, d := range cfg.Domains {
		for _, r := range c.Opts.Regions {
			if len(d.Regions) > 0 && !slices.Contains(d.Regions, r) {
				fmt.Fprintf(c.Opts.Log, "warning: region %s is not a region of domain %s (%v): the coordinator will refuse it\n", r, d.Name, d.Regions)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(c.Opts.Dir, "limits.yaml"), yaml, 0o644); err != nil {
		return err
	}
	store, closeStore, err := c.Store()
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cur, err := store.Version(ctx, 0)
	switch {
	case errors.Is(err, etcdstore.ErrNoConfig):
	case err != nil:
		return fmt.Errorf("local: read the config version in etcd: %w", err)
	case cur.YAML == string(yaml):
		return nil
	}
	_, err = store.ApplyConfig(ctx, cur.Version, etcdstore.ConfigVersion{
		Time: time.Now().UTC(), Author: "allot cluster", Summary: "allot cluster up with " + source, YAML: string(yaml)})
	if err != nil {
		return fmt.Errorf("local: store the config in etcd: %w", err)
	}
	return nil
}

// Store returns a store on the cluster's etcd and a function that closes
// it.
func (c *Cluster) Store() (*etcdstore.Store, func(), error) {
	cfg, err := c.ClientTLS()
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: cfg})
	if err != nil {
		return nil, nil, fmt.Errorf("local: etcd %s: %w", c.Endpoint, err)
	}
	return etcdstore.New(cli, ""), func() { cli.Close() }, nil
}

// Leader returns the coordinator that leads domain, as etcd says, or nil
// when none does (or it is not one of the cluster's).
func (c *Cluster) Leader(ctx context.Context, store *etcdstore.Store, domain string) (*Proc, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addr, err := store.Leader(ctx, domain)
	if errors.Is(err, etcdstore.ErrNoLeader) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, p := range c.ByRole(Coordinator, "") {
		if p.Addr == addr {
			return p, nil
		}
	}
	return nil, nil
}

// Running reports whether p's latest process is alive.
func (c *Cluster) Running(p *Proc) bool {
	c.mu.Lock()
	pid, started, done := p.Pid, p.Started, p.done
	c.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	return alive(pid, started)
}

// Kill stops p at once (SIGKILL), as a crash would, and waits for it.
func (c *Cluster) Kill(p *Proc) {
	c.stop(p, syscall.SIGKILL, 0)
}

// Stop stops p gracefully: SIGTERM, then SIGKILL after grace. It returns
// false if p had to be killed.
func (c *Cluster) Stop(p *Proc, grace time.Duration) bool {
	return c.stop(p, syscall.SIGTERM, grace)
}

func (c *Cluster) stop(p *Proc, sig syscall.Signal, grace time.Duration) bool {
	if !c.Running(p) {
		return true
	}
	c.mu.Lock()
	pid := p.Pid
	c.mu.Unlock()
	syscall.Kill(pid, sig)
	graceful := sig != syscall.SIGKILL && c.waitExit(p, grace)
	if !graceful {
		syscall.Kill(pid, syscall.SIGKILL)
		c.waitExit(p, 10*time.Second)
	}
	os.Remove(c.pidFile(p))
	fmt.Fprintf(c.Opts.Log, "stopped %-14s pid %-7d %s\n", p.Name, pid, map[bool]string{true: "(SIGTERM)", false: "(SIGKILL)"}[graceful])
	return graceful
}

// waitExit waits up to d for p's process to end.
func (c *Cluster) waitExit(p *Proc, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for c.Running(p) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// StopAll stops every process, enforcers first and etcd last, each with
// SIGTERM and then SIGKILL after grace. The processes of one role stop
// together.
func (c *Cluster) StopAll(grace time.Duration) {
	for _, role := range []Role{Regional, Coordinator, Redis, Etcd} {
		var wg sync.WaitGroup
		for _, p := range c.ByRole(role, "") {
			wg.Go(func() { c.Stop(p, grace) })
		}
		wg.Wait()
	}
	c.Save()
}

// Save writes the state file, Dir/cluster.json.
func (c *Cluster) Save() error {
	c.saving.Lock()
	defer c.saving.Unlock()
	c.mu.Lock()
	b, err := json.MarshalIndent(state{Options: stateOptions{Dir: c.Opts.Dir, Regions: c.Opts.Regions, Instances: c.Opts.Instances,
		Coordinators: c.Opts.Coordinators, Config: c.Opts.Config, Insecure: c.Opts.Insecure}, Endpoint: c.Endpoint, Procs: c.Procs}, "", "  ")
	c.mu.Unlock()
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.Opts.Dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.Opts.Dir, StateFile))
}

type state struct {
	Options  stateOptions `json:"options"`
	Endpoint string       `json:"etcd"`
	Procs    []*Proc      `json:"procs"`
}

type stateOptions struct {
	Dir          string   `json:"dir"`
	Regions      []string `json:"regions"`
	Instances    int      `json:"instances"`
	Coordinators int      `json:"coordinators"`
	Config       string   `json:"config,omitempty"`
	Insecure     bool     `json:"insecure,omitempty"` // plain text; else TLS from Dir/tls
}

// ErrNoCluster is returned by Load when the folder holds no cluster.
var ErrNoCluster = errors.New("local: no cluster in this folder")

// Load reads the cluster that Start recorded in dir.
func Load(dir string) (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (%s has no %s)", ErrNoCluster, dir, StateFile)
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("local: %s: %w", filepath.Join(dir, StateFile), err)
	}
	c := &Cluster{Opts: Options{Dir: st.Options.Dir, Regions: st.Options.Regions, Instances: st.Options.Instances,
		Coordinators: st.Options.Coordinators, Config: st.Options.Config, Insecure: st.Options.Insecure, Log: io.Discard, StartTimeout: DefaultStartTimeout},
		Endpoint: st.Endpoint, Procs: st.Procs}
	return c, nil
}

// Status is what runs of one process.
type Status struct {
	Proc    *Proc
	Running bool
	Health  error // nil: it answers its health probe
}

// Status probes every process.
func (c *Cluster) Status(ctx context.Context) []Status {
	out := make([]Status, len(c.Procs))
	var wg sync.WaitGroup
	for i, p := range c.Procs {
		wg.Go(func() {
			out[i] = Status{Proc: p, Running: c.Running(p)}
			if out[i].Running {
				out[i].Health = c.Probe(ctx, p)
			}
		})
	}
	wg.Wait()
	return out
}

// AnyRunning reports whether a process of the cluster is alive.
func (c *Cluster) AnyRunning() bool {
	for _, p := range c.Procs {
		if c.Running(p) {
			return true
		}
	}
	return false
}

// startTime is the start time of process pid, in clock ticks since boot
// (field 22 of /proc/PID/stat).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether process pid runs and is the one that started at
// started (0: any).
func alive(pid int, started uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := startTime(pid)
	return err == nil && (started == 0 || st == started)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
