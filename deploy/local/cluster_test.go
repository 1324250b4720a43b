package local

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testdep"
)

func TestPlanFromBasePort(t *testing.T) {
	dir := t.TempDir()
	c, err := New(Options{Dir: dir, BasePort: 7100, Bin: "/bin/allot"})
	if err != nil {
		t.Fatal(err)
	}
	if n := PortCount(3, 2, 2); n != 2+3+4+12 || len(c.Procs) != 1+3+2+6 {
		t.Fatalf("%d ports, %d processes", n, len(c.Procs))
	}
	want := map[string][2]string{
		"etcd":           {"127.0.0.1:7100", "127.0.0.1:7101"},
		"redis-us-east":  {"127.0.0.1:7102", ""},
		"redis-ap-south": {"127.0.0.1:7104", ""},
		"coordinator-1":  {"127.0.0.1:7105", "127.0.0.1:7106"},
		"coordinator-2":  {"127.0.0.1:7107", "127.0.0.1:7108"},
		"us-east-1":      {"127.0.0.1:7109", "127.0.0.1:7110"},
		"ap-south-2":     {"127.0.0.1:7119", "127.0.0.1:7120"},
	}
	for name, addrs := range want {
		p := c.Proc(name)
		if p == nil || p.Addr != addrs[0] || p.HTTP != addrs[1] {
			t.Errorf("%s: %+v, want %v", name, p, addrs)
		}
	}
	if got := len(c.ByRole(Regional, "eu-west")); got != 2 {
		t.Errorf("eu-west has %d instances", got)
	}
	args := strings.Join(c.Proc("eu-west-2").Args, " ")
	for _, s := range []string{"/bin/allot regional --region eu-west", "--etcd 127.0.0.1:7100", "--coordinator 127.0.0.1:7105,127.0.0.1:7107",
		"--redis 127.0.0.1:7103", "--grpc-addr 127.0.0.1:7115", "--peers us-east=127.0.0.1:7111,ap-south=127.0.0.1:7119"} {
		if !strings.Contains(args, s) {
			t.Errorf("eu-west-2's command line lacks %q: %s", s, args)
		}
	}
	if args := c.Proc("etcd").Args; args[1] != "etcd" || !slices.Contains(args, filepath.Join(dir, "etcd")) {
		t.Errorf("etcd: %v", args)
	}
	// Mutual TLS on every link by default: each process's certificate
	// and the cluster's CA, for its listeners and its etcd and Redis
	// links; the enforcer's --instance is the one its certificate names.
	tlsd := filepath.Join(dir, "tls")
	for _, s := range []string{"--instance eu-west-2", "--tls-cert " + tlsd + "/eu-west-2.crt", "--tls-ca " + tlsd + "/ca.crt",
		"--etcd-tls-key " + tlsd + "/eu-west-2.key", "--redis-tls-cert " + tlsd + "/eu-west-2.crt"} {
		if !strings.Contains(args, s) {
			t.Errorf("eu-west-2's command line lacks %q: %s", s, args)
		}
	}
	if args := strings.Join(c.Proc("redis-eu-west").Args, " "); !strings.Contains(args, "--port 0 --tls-port 7103") || !strings.Contains(args, "--tls-auth-clients yes") {
		t.Errorf("redis-eu-west: %s", args)
	}
	if got := Identity(c.Proc("eu-west-2")); got != "spiffe://allot/region/eu-west/instance/eu-west-2" {
		t.Errorf("eu-west-2's identity: %s", got)
	}
	if got := Identity(c.Proc("coordinator-2")); got != "spiffe://allot/coordinator/coordinator-2" {
		t.Errorf("coordinator-2's identity: %s", got)
	}
	// Plain text on loopback with Insecure: --insecure, no certificates.
	plain, err := New(Options{Dir: dir, BasePort: 7100, Bin: "/bin/allot", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plain.Procs {
		args := strings.Join(p.Args, " ")
		if strings.Contains(args, "tls") || (p.Role != Redis && !strings.Contains(args, "--insecure")) {
			t.Errorf("%s in plain text: %s", p.Name, args)
		}
	}
	if _, err := New(Options{Dir: dir, BasePort: 65530}); err == nil {
		t.Error("a base port without room for the cluster: no error")
	}
	if _, err := New(Options{Dir: dir, Regions: []string{"a", "a"}}); err == nil {
		t.Error("a region given twice: no error")
	}
}

func TestPlanDialAndEtcdBinary(t *testing.T) {
	c, err := New(Options{Dir: t.TempDir(), Regions: []string{"a", "b"}, Instances: 1, Coordinators: 1, EtcdBinary: "etcd",
		Dial: func(from, to *Proc) string {
			if from != nil && from.Role == Regional && to.Role == Redis {
				return "proxy:" + to.Name
			}
			return ""
		}})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.Proc("a-1").Args, " ")
	if !strings.Contains(args, "--redis proxy:redis-a") || !strings.Contains(args, "--peers b="+c.Proc("b-1").Addr) {
		t.Errorf("a-1: %s", args)
	}
	if args := c.Proc("etcd").Args; args[0] != "etcd" || !slices.Contains(args, "--initial-cluster") {
		t.Errorf("etcd: %v", args)
	}
	// Free ports are distinct.
	seen := map[string]bool{}
	for _, p := range c.Procs {
		for _, a := range []string{p.Addr, p.HTTP} {
			if a != "" && seen[a] {
				t.Errorf("%s: %s used twice", p.Name, a)
			}
			seen[a] = true
		}
	}
}

// A cluster of one region and one instance starts, is seen by Load and
// Status from its folder, survives the restart of a process, and stops.
func TestClusterStartStop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds allot and runs a cluster")
	}
	testdep.LookPath(t, "redis-server", "apt-get install redis-server; .ci/run installs it")
	bin := filepath.Join(t.TempDir(), "allot")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/allot").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.in.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nregions: [solo]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 5/1h, enforcement: exact}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Dir: dir, Bin: bin, Config: cfg, Regions: []string{"solo"}, Instances: 1, Coordinators: 1, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.StopAll(5 * time.Second) })
	ctx := t.Context()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range loaded.Status(ctx) {
		if !s.Running || s.Health != nil {
			t.Errorf("%s: running %v, health %v", s.Proc.Name, s.Running, s.Health)
		}
	}
	store, closeStore, err := loaded.Store()
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p, err := loaded.Leader(ctx, store, "api"); err == nil && p != nil && p.Name == "coordinator-1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("coordinator-1 never led api")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Its certificates name who holds them; the processes serve TLS only.
	b, err := os.ReadFile(filepath.Join(dir, "tls", "solo-1.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("solo-1.crt: no PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || len(cert.URIs) != 1 || cert.URIs[0].String() != "spiffe://allot/region/solo/instance/solo-1" {
		t.Fatalf("solo-1.crt: %v, %v", cert.URIs, err)
	}
	plain := &Cluster{Opts: loaded.Opts, Procs: loaded.Procs, Endpoint: loaded.Endpoint}
	plain.Opts.Insecure = true
	for _, p := range loaded.Procs {
		if err := plain.Probe(ctx, p); err == nil {
			t.Errorf("%s answered a plain-text probe", p.Name)
		}
	}
	// A process killed and restarted comes back on its port, one life on.
	redis := c.Proc("redis-solo")
	c.Kill(redis)
	if c.Running(redis) || c.Probe(ctx, redis) == nil {
		t.Fatal("redis-solo still runs after Kill")
	}
	if err := c.Restart(ctx, redis); err != nil {
		t.Fatal(err)
	}
	if redis.Life != 2 {
		t.Fatalf("life %d after a restart, want 2", redis.Life)
	}
	// Another process cannot start on a port in use.
	if err := c.Restart(ctx, redis); err == nil {
		t.Fatal("restarting a running process: no error")
	}
	// Stopped from the folder, as `allot cluster down` does.
	loaded, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, p := range loaded.Procs {
		pids[p.Name] = p.Pid
	}
	loaded.StopAll(5 * time.Second)
	for _, p := range c.Procs {
		// c started them: it sees one end once it has reaped it, a moment
		// after the loaded cluster saw the process gone.
		for deadline := time.Now().Add(5 * time.Second); c.Running(p) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if c.Running(p) {
			t.Errorf("%s (pid %d) still runs after StopAll", p.Name, pids[p.Name])
		}
	}
	if loaded.AnyRunning() {
		t.Error("AnyRunning after StopAll")
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "solo-1.log")); err != nil {
		t.Error(err)
	}
}

func TestLoadWithoutCluster(t *testing.T) {
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no cluster") {
		t.Fatalf("Load of an empty folder: %v", err)
	}
}

func TestAlive(t *testing.T) {
	st, err := startTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("startTime of this process: %v, %v", st, err)
	}
	if !alive(os.Getpid(), st) || alive(os.Getpid(), st+1) || alive(0, 0) {
		t.Fatal("alive: wrong")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	if alive(cmd.Process.Pid, 0) {
		t.Fatal("an exited process is alive")
	}
}
